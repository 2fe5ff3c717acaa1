"""The per-user cache of nvcc's output, and the kernel files `zerogr build` ships (bundle_kernel_files).

Compiled files are cached under ``kernel_cache_dir()`` keyed by (sha256 of the sources and flags, nvcc's
version, arch). The cache is untrusted input: every entry carries its own sha256 and is opened without
following symlinks, must be a regular file of this user that nobody else can write, and its bytes are
checked before they are shipped (nvcc.py's module docstring has the whole story). Torch-free and GPU-free.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import stat
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from ..bundle.files import temp_tag
from ..bundle.kernel_files import KERNEL_HEAD_BYTES, MAX_KERNEL_BYTES, kernel_problem
from .nvcc import (
    KINDS,
    NVCC_FLAGS,
    NVCC_VERSION_TIMEOUT_S,
    KernelCompileError,
    check_arch,
    compile_kernels,
    compiled_kernel_name,
    find_nvcc,
    kernel_sources,
    run_nvcc,
)

CACHE_ENV = "ZEROGR_CACHE_DIR"
# The cache entry layout; part of every cache key, so entries of another layout are never read.
CACHE_FORMAT = 2
ENTRY_SUFFIX = ".entry"
ENTRY_MAGIC = "zerogr-kernel-cache"
MAX_ENTRY_HEADER = 512
# A temp file of the cache older than this was left by a killed build (writing one takes milliseconds).
STALE_TMP_S = 600.0


class KernelCacheWarning(UserWarning):
    """The kernel cache had bad entries (discarded and recompiled) or cannot be used (kernels were compiled
    into a temporary dir instead). The build still ships kernels checked like fresh nvcc output."""


def kernel_cache_dir() -> Path:
    """``$ZEROGR_CACHE_DIR/kernels``, else ``$XDG_CACHE_HOME/zerogr/kernels``, else
    ~/.cache/zerogr/kernels."""
    root = os.environ.get(CACHE_ENV)
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "zerogr")
    return Path(root) / "kernels"


@functools.lru_cache(maxsize=8)
def nvcc_version(nvcc: str) -> str:
    """nvcc's ``--version`` text (the toolkit identity that is part of the cache key)."""
    return run_nvcc([nvcc, "--version"], NVCC_VERSION_TIMEOUT_S).strip()


def sources_digest(sources: Sequence[Path] | None = None) -> str:
    """sha256 over every kernel source's name and bytes plus the nvcc flags (the source part of the key)."""
    h = hashlib.sha256()
    for source in sources if sources is not None else kernel_sources():
        h.update(Path(source).name.encode() + b"\0" + Path(source).read_bytes() + b"\0")
    h.update("\0".join(NVCC_FLAGS).encode())
    return h.hexdigest()


def cache_key(nvcc: str, sources: Sequence[Path] | None = None) -> str:
    """Name of the cache folder for these sources compiled by this nvcc (one subfolder per arch)."""
    toolkit = hashlib.sha256(nvcc_version(nvcc).encode()).hexdigest()
    return f"v{CACHE_FORMAT}-{sources_digest(sources)[:20]}-{toolkit[:12]}"


def cache_entry_bytes(arch: str, name: str, data: bytes) -> bytes:
    """A cache entry: one header line ``zerogr-kernel-cache <format> <arch> <name> <bytes> <sha256>``, then
    the compiled file's bytes."""
    digest = hashlib.sha256(data).hexdigest()
    return f"{ENTRY_MAGIC} {CACHE_FORMAT} {arch} {name} {len(data)} {digest}\n".encode() + data


def parse_cache_entry(entry: bytes, arch: str, name: str, kind: str) -> tuple[bytes | None, str | None]:
    """(the compiled file's bytes, None) from a cache entry meant to hold `name` for `arch`, or (None, why
    not): a header that is not ours or names another file, a length or sha256 that differs, or bytes that
    are not a `kind` for `arch`."""
    end = entry.find(b"\n", 0, MAX_ENTRY_HEADER)
    fields = entry[:end].decode("ascii", errors="replace").split(" ") if end > 0 else []
    if len(fields) != 6 or fields[0] != ENTRY_MAGIC or fields[1] != str(CACHE_FORMAT):
        return None, "not a kernel cache entry (no header line)"
    if fields[2] != arch or fields[3] != name:
        return None, f"holds {fields[2]}/{fields[3]}, not {arch}/{name}"
    data = entry[end + 1 :]
    if not fields[4].isdigit() or len(data) != int(fields[4]):
        return None, f"{len(data)} bytes after the header, the header says {fields[4]} (truncated?)"
    if hashlib.sha256(data).hexdigest() != fields[5]:
        return None, "sha256 differs from the one written with it (changed or corrupt)"
    problem = kernel_problem(data[:KERNEL_HEAD_BYTES], len(data), kind, arch)
    if problem is not None:
        return None, problem
    return data, None


class _CacheUnusable(Exception):
    """The cache dir (or this key's dir in it) cannot be used: compile into a temporary dir instead."""


class KernelCache:
    """One key's dir of the kernel cache, opened so that nothing under it is trusted.

    Every dir below the cache root and every entry is opened relative to its parent's descriptor with
    O_NOFOLLOW (a symlink is never followed), must belong to this user and not be writable by group or
    others (as ssh treats its files), and entries must be regular files with one link. `load` returns
    only bytes that passed `parse_cache_entry`; anything else is discarded (its reason kept in
    `problems`). `store` writes a temp file and renames it into place, so readers see whole entries."""

    def __init__(self, root: Path, key: str):
        self.root = root
        self.key = key
        self.problems: list[str] = []
        self._uid = os.geteuid()
        self._arch_fds: dict[str, int | None] = {}
        self._fds: list[int] = []
        try:
            root.mkdir(parents=True, exist_ok=True)
            root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise _CacheUnusable(f"{root}: {exc.strerror or exc}") from None
        self._fds.append(root_fd)
        try:
            self._key_fd = self._private_dir(root_fd, key, root / key)
        except _CacheUnusable:
            self.close()
            raise

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> KernelCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _private_dir(self, parent_fd: int, name: str, shown: Path) -> int:
        """fd of dir `name` under `parent_fd`, created (mode 755) when missing; a symlink or non-dir there
        is discarded and replaced. _CacheUnusable when it is another user's or writable by others."""
        for attempt in range(2):
            created = False
            try:
                os.mkdir(name, 0o755, dir_fd=parent_fd)
                created = True
            except FileExistsError:
                pass
            except OSError as exc:
                raise _CacheUnusable(f"{shown}: {exc.strerror or exc}") from None
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
            except OSError as exc:
                if attempt == 0 and not stat.S_ISDIR(_lstat_mode(name, parent_fd)):
                    self.problems.append(f"{shown}: not a directory (a symlink or file); discarded")
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=parent_fd)
                    continue
                raise _CacheUnusable(f"{shown}: {exc.strerror or exc}") from None
            self._fds.append(fd)
            info = os.fstat(fd)
            if created:
                os.fchmod(fd, 0o755)  # whatever the umask: our own check refuses group-writable dirs
            elif info.st_uid != self._uid or info.st_mode & 0o022:
                raise _CacheUnusable(f"{shown}: {_ownership_problem(info, self._uid)}")
            return fd
        raise AssertionError("unreachable")

    def _arch_fd(self, arch: str) -> int | None:
        """fd of the arch's dir, or None when it cannot be trusted (then nothing of it is read or written:
        that arch is compiled afresh, and the reason is one of `problems`)."""
        if arch not in self._arch_fds:
            try:
                fd: int | None = self._private_dir(self._key_fd, arch, self.root / self.key / arch)
            except _CacheUnusable as exc:
                self.problems.append(f"{exc}; not used")
                fd = None
            if fd is not None:
                self._sweep(fd)
            self._arch_fds[arch] = fd
        return self._arch_fds[arch]

    def _sweep(self, dir_fd: int) -> None:
        """Remove temp files that a killed build left (older than STALE_TMP_S; live ones are seconds old)."""
        now = time.time()
        with contextlib.suppress(OSError), os.scandir(dir_fd) as entries:
            for entry in entries:
                if not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
                    continue
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    if now - info.st_mtime > STALE_TMP_S and not stat.S_ISDIR(info.st_mode):
                        os.unlink(entry.name, dir_fd=dir_fd)

    def path(self, arch: str, name: str) -> Path:
        return self.root / self.key / arch / (name + ENTRY_SUFFIX)

    def load(self, arch: str, name: str, kind: str) -> bytes | None:
        """The checked bytes of `name` for `arch`, or None: no entry, or a bad one (then discarded)."""
        dir_fd = self._arch_fd(arch)
        if dir_fd is None:
            return None
        entry = name + ENTRY_SUFFIX
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
        try:
            fd = os.open(entry, flags, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:  # ELOOP: a symlink
            why = "a symlink" if stat.S_ISLNK(_lstat_mode(entry, dir_fd)) else exc.strerror or str(exc)
            self._discard(dir_fd, entry, arch, why)
            return None
        try:
            info = os.fstat(fd)
            data, why = None, None
            if not stat.S_ISREG(info.st_mode):
                why = "not a regular file"
            elif info.st_uid != self._uid or info.st_mode & 0o022:
                why = _ownership_problem(info, self._uid)
            elif info.st_nlink != 1:
                why = f"has {info.st_nlink} hard links"
            elif info.st_size > MAX_ENTRY_HEADER + MAX_KERNEL_BYTES:
                why = f"{info.st_size} bytes, more than a kernel file may have"
            else:
                with os.fdopen(os.dup(fd), "rb") as f:
                    raw = f.read(info.st_size + 1)  # bounded: st_size was checked above
                data, why = parse_cache_entry(raw, arch, name, kind)
        except OSError as exc:
            data, why = None, f"cannot read ({exc.strerror or exc})"
        finally:
            os.close(fd)
        if why is not None:
            self._discard(dir_fd, entry, arch, why)
        return data

    def _discard(self, dir_fd: int, entry: str, arch: str, why: str) -> None:
        shown = self.root / self.key / arch / entry
        try:
            if stat.S_ISDIR(_lstat_mode(entry, dir_fd)):
                shutil.rmtree(shown)
            else:
                os.unlink(entry, dir_fd=dir_fd)
            self.problems.append(f"{shown}: {why}; discarded")
        except OSError as exc:
            self.problems.append(f"{shown}: {why}; could not discard it ({exc.strerror or exc})")

    def store(self, arch: str, name: str, data: bytes) -> None:
        """Write the entry for `name` (temp file, then rename over any old one). Failures are only noted:
        the cache is an optimisation."""
        dir_fd = self._arch_fd(arch)
        if dir_fd is None:
            return
        try:
            entry = name + ENTRY_SUFFIX
            tmp = f".{entry}.{temp_tag()}.tmp"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            fd = os.open(tmp, flags, 0o644, dir_fd=dir_fd)
            try:
                os.fchmod(fd, 0o644)
                with os.fdopen(fd, "wb") as f:
                    f.write(cache_entry_bytes(arch, name, data))
                os.replace(tmp, entry, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dir_fd)
                raise
        except OSError as exc:
            self.problems.append(f"{self.path(arch, name)}: could not write ({exc.strerror or exc})")


def _lstat_mode(name: str, dir_fd: int) -> int:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return 0


def _ownership_problem(info: os.stat_result, uid: int) -> str:
    if info.st_uid != uid:
        return f"owned by uid {info.st_uid}, not this user ({uid})"
    return f"writable by group or others (mode {stat.filemode(info.st_mode)})"


def cached_kernel_files(
    archs: Sequence[str],
    *,
    nvcc: str | None = None,
    cache_dir: str | Path | None = None,
    sources: list[Path] | None = None,
) -> dict[str, bytes]:
    """{``kernels/<arch>/<stem>.<kind>``: bytes} for every arch x (cubin, ptx) x source, compiled with
    nvcc only where the cache has no good entry for (sources, nvcc version, arch).

    Every byte returned was checked: a cached entry against the sha256 written with it and the kind check
    (KernelCache.load), fresh nvcc output by the kind check (compile_kernels). Bad entries are discarded
    and recompiled; a cache dir that cannot be used (not a dir, not writable, another user's) means
    compiling into a temporary dir. Either way one KernelCacheWarning says what happened. Entries are
    written atomically, so concurrent builds share them. Raises KernelCompileError when nvcc is missing,
    fails, times out or writes something that is not a kernel."""
    nvcc_path = nvcc or find_nvcc()
    srcs = sources if sources is not None else kernel_sources()
    for arch in archs:
        check_arch(arch)
    root = Path(cache_dir) if cache_dir is not None else kernel_cache_dir()
    key = cache_key(nvcc_path, srcs)
    try:
        cache: KernelCache | None = KernelCache(root, key)
        unusable = None
    except _CacheUnusable as exc:
        cache, unusable = None, str(exc)
    files: dict[str, bytes] = {}
    try:
        # nvcc writes into a private scratch dir, never into the cache: a build killed mid-compile leaves
        # nothing there, and only checked bytes are ever renamed into the cache.
        with tempfile.TemporaryDirectory(prefix="zerogr-nvcc-") as scratch:
            for arch in archs:
                for kind in KINDS:
                    missing = []
                    for source in srcs:
                        name = compiled_kernel_name(source, kind)
                        data = cache.load(arch, name, kind) if cache is not None else None
                        if data is None:
                            missing.append(source)
                        else:
                            files[f"kernels/{arch}/{name}"] = data
                    if not missing:
                        continue
                    fresh = compile_kernels(arch, kind, Path(scratch) / arch, sources=missing, nvcc=nvcc_path)
                    for path in fresh:
                        data = path.read_bytes()
                        files[f"kernels/{arch}/{path.name}"] = data
                        if cache is not None:
                            cache.store(arch, path.name, data)
    finally:
        if cache is not None:
            cache.close()
    # Only once the kernels exist: when nvcc failed, the caller's one line about missing kernels is what
    # matters.
    if unusable is not None:
        message = f"kernel cache unusable ({unusable}): compiled the kernels in a temporary dir"
        warnings.warn(message, KernelCacheWarning, stacklevel=2)
    elif cache is not None and cache.problems:
        more = f" (and {len(cache.problems) - 1} more)" if len(cache.problems) > 1 else ""
        message = f"kernel cache: {cache.problems[0]}{more}; recompiled"
        warnings.warn(message, KernelCacheWarning, stacklevel=2)
    return dict(sorted(files.items()))


def bundle_kernel_files(archs: Sequence[str]) -> tuple[dict[str, bytes], str | None]:
    """What `zerogr build` adds to a version: (files as cached_kernel_files, None), or ({}, one-line
    reason) when nvcc is missing or fails, or the kernels cannot be compiled anywhere - the build carries
    on without kernels then. () archs: ({}, None).
    """
    if not archs:
        return {}, None
    try:
        return cached_kernel_files(archs), None
    except KernelCompileError as exc:
        return {}, str(exc).splitlines()[0]
    except OSError as exc:  # not even a temporary dir to compile in
        where = f"{exc.filename}: " if exc.filename else ""
        return {}, f"cannot compile the kernels ({where}{exc.strerror or exc})"
