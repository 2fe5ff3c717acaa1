"""File-level I/O for bundles: .npy writing with the checksum computed on the way out, hashing,
fsync, atomic replace, a careful .npy header reader (header checked before any data is trusted), and the
crash-test hook the writers call between the steps of their protocols."""

from __future__ import annotations

import ast
import hashlib
import os
import secrets
import signal
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..base.errors import BundleError
from .format import TEMP_PREFIX

CHUNK_BYTES = 8 * 1024 * 1024

#: A file being written asks the kernel to start writing each stretch of this many bytes to disk as soon as
#: it is complete (start_writeback). Left alone, dirty pages pile up until the kernel throttles the writer
#: and the fsync at close then writes them all: 1.6 GB took 1.7 s that way and 0.5 s with these kicks on
#: a 2-core VM. Durability is unchanged: close() still fsyncs.
WRITEBACK_BYTES = 32 * 1024 * 1024
NPY_MAGIC = b"\x93NUMPY"
NPY_ALIGN = 64


def _crash_point(name: str) -> None:
    """The crash-test hook: with ZEROGR_BUNDLE_KILL_AT=name the process kills itself (SIGKILL) right here,
    so the crash-safety tests (tests/test_bundle_publish.py) can stop a publish, a prune or an add at each
    step of its protocol deterministically. A no-op otherwise (one environment lookup)."""
    if os.environ.get("ZEROGR_BUNDLE_KILL_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def temp_tag() -> str:
    """A unique tag for temp names: pid plus randomness (pid alone is reused after a crash)."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def _load_sync_file_range() -> Callable[[int, int, int], None] | None:
    """Linux's sync_file_range(fd, offset, nbytes, SYNC_FILE_RANGE_WRITE) through libc, or None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    call.restype = ctypes.c_int
    sync_file_range_write = 2

    def start(fd: int, offset: int, nbytes: int) -> None:
        call(fd, offset, nbytes, sync_file_range_write)  # a hint: a failure only means no early writeback

    return start


_SYNC_FILE_RANGE = _load_sync_file_range()


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing bytes [offset, offset + nbytes) of `fd` to disk now, without waiting
    for it (Linux; a no-op elsewhere). Not a durability point: only fsync is."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, nbytes)


class HashingFile:
    """A binary file being written that also feeds every byte to sha256 and counts bytes.

    Used directly for .npy and as the sink pyarrow writes Parquet into, so each file is hashed while it is
    written instead of being read back. Every WRITEBACK_BYTES it starts the disk write of what came before
    (start_writeback), so close()'s fsync finds little left to write."""

    def __init__(self, path: Path):
        self.path = path
        self._file: BinaryIO = open(path, "xb")  # noqa: SIM115 - closed in close()
        self._hash = hashlib.sha256()
        self.bytes = 0
        self._written_back = 0  # bytes [0, _written_back) have had their writeback started
        self.closed = False

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self._file.write(view)
        self._hash.update(view)
        self.bytes += view.nbytes
        if self.bytes - self._written_back >= WRITEBACK_BYTES:
            self._file.flush()
            start_writeback(self._file.fileno(), self._written_back, self.bytes - self._written_back)
            self._written_back = self.bytes
        return view.nbytes

    # pyarrow's PythonFile probes these.
    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.bytes

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        """Flush, fsync and close (idempotent)."""
        if not self.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self.closed = True

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """A .npy format 1.0 header (magic, version, little-endian u2 length, dict, space padding, newline),
    padded so the data starts at a multiple of 64 bytes. Never Fortran order."""
    text = f"{{'descr': '{np.dtype(dtype).str}', 'fortran_order': False, 'shape': {tuple(shape)!r}, }}"
    total = len(NPY_MAGIC) + 2 + 2 + len(text) + 1
    padding = -total % NPY_ALIGN
    header = (text + " " * padding + "\n").encode("latin1")
    if len(header) >= 2**16:
        raise ValueError("npy header too long for format 1.0")
    return NPY_MAGIC + b"\x01\x00" + len(header).to_bytes(2, "little") + header


def write_npy(path: Path, array: np.ndarray) -> tuple[int, str]:
    """Write `array` as a little-endian, C-contiguous .npy file; fsync it. Returns (bytes, sha256 hex).

    The data is streamed in 8 MiB slices straight from the array's memory (no copy unless the array is
    big-endian or strided) and hashed slice by slice.
    """
    array = np.asarray(array)
    little = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    array = np.ascontiguousarray(array, dtype=little)
    out = HashingFile(path)
    try:
        out.write(npy_header(array.dtype, array.shape))
        data = memoryview(array.reshape(-1)).cast("B") if array.size else memoryview(b"")
        for start in range(0, data.nbytes, CHUNK_BYTES):
            out.write(data[start : start + CHUNK_BYTES])
    finally:
        out.close()
    return out.bytes, out.hexdigest()


def sha256_file(path: Path) -> tuple[int, str]:
    """(bytes, sha256 hex) of a file, read in 8 MiB blocks (hashlib releases the GIL on each)."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as f:
        buffer = bytearray(CHUNK_BYTES)
        view = memoryview(buffer)
        while n := f.readinto(buffer):
            digest.update(view[:n])
            size += n
    return size, digest.hexdigest()


class HashCache:
    """sha256 of files already hashed in one run (a rebuild verifies its version after the build, after
    tune and after the gate), keyed by what identifies an unchanged file: device, inode, size, mtime_ns
    and ctime_ns. A file rewritten in place, replaced by a rename or touched changes its key, so it is
    hashed again; only a file whose every one of these is unchanged is not. It also remembers which
    checks of unchanged files passed (`passed`, `record_pass`: verify's structural checks of the step
    and leaf files, keyed by the manifest fields they read and the files' identities). Thread-safe.
    Meant for one run, not to be kept: a new run starts empty."""

    def __init__(self) -> None:
        self._digests: dict[tuple[str, int, int, int, int, int], tuple[int, str]] = {}
        self._passes: set[object] = set()
        self._lock = threading.Lock()
        self.hashed = 0
        """Files hashed through this cache (not found in it)."""

    def identity(self, path: Path) -> tuple[str, int, int, int, int, int]:
        """What identifies `path`'s contents as unchanged: (absolute path, device, inode, size, mtime_ns,
        ctime_ns)."""
        return self._key(path)

    def passed(self, key: object) -> bool:
        """True when record_pass(key) was called (a check of exactly these inputs passed in this run)."""
        with self._lock:
            return key in self._passes

    def record_pass(self, key: object) -> None:
        """Remember that the check identified by `key` (hashable, naming its inputs) passed."""
        with self._lock:
            self._passes.add(key)

    @staticmethod
    def _key(path: Path) -> tuple[str, int, int, int, int, int]:
        st = os.stat(path)
        return (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def sha256(self, path: Path) -> tuple[int, str]:
        """sha256_file(path), from the cache when this file was hashed before and is unchanged. A digest
        is kept only when the file's key is the same after hashing as before (not written meanwhile)."""
        before = self._key(path)
        with self._lock:
            known = self._digests.get(before)
        if known is not None:
            return known
        digest = sha256_file(path)
        with self._lock:
            self.hashed += 1
            if self._key(path) == before:
                self._digests[before] = digest
        return digest


def fsync_dir(path: Path) -> None:
    """fsync a directory so renames and creations inside it survive a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_durable(path: Path, data: bytes) -> tuple[int, str]:
    """Create `path` (must not exist), write, fsync. Returns (bytes, sha256 hex)."""
    out = HashingFile(path)
    try:
        out.write(data)
    finally:
        out.close()
    return out.bytes, out.hexdigest()


def atomic_replace_bytes(path: Path, data: bytes, mode: int | None = None) -> tuple[int, str]:
    """Replace `path` with `data` atomically: write a temp file beside it, fsync, rename, fsync the dir.

    A reader sees the old content or the new one, never a mix; a crash leaves at most a stray temp file
    (named .tmp-*, removed by the next writer holding the OUT lock). `mode`: the file's permission bits,
    set before the rename whatever the umask (None: as the umask makes them)."""
    temp = path.with_name(f"{TEMP_PREFIX}{temp_tag()}-{path.name}")
    try:
        result = write_bytes_durable(temp, data)
        if mode is not None:
            os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return result


def read_small_file(path: Path, limit: int) -> bytes:
    """The bytes of a small regular file (LATEST, manifest.json, a journal, the counter), refusing a special
    file (FIFO, device: opened non-blocking, so a FIFO cannot hang us) and anything over `limit` bytes
    before reading it. Raises FileNotFoundError when missing, BundleError naming the file otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise BundleError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BundleError(f"{path}: not a regular file")
        if info.st_size > limit:
            raise BundleError(f"{path}: {info.st_size} bytes, more than the {limit} allowed")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise BundleError(f"{path}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise BundleError(f"{path}: more than the {limit} bytes allowed")
    return data


def read_npy_header(path: Path, name: str) -> tuple[np.dtype, tuple[int, ...], int]:
    """Parse a .npy header without trusting it: (dtype, shape, data offset).

    Accepts format versions 1.0, 2.0 and 3.0; refuses Fortran order, object dtypes and malformed headers
    with a BundleError naming `name`."""
    try:
        with open(path, "rb") as f:
            prefix = f.read(len(NPY_MAGIC) + 2)
            if len(prefix) < 8 or prefix[:6] != NPY_MAGIC:
                raise BundleError(f"{name}: not a .npy file (bad magic)")
            major = prefix[6]
            if major == 1:
                length = int.from_bytes(f.read(2), "little")
                start = 10
            elif major in (2, 3):
                length = int.from_bytes(f.read(4), "little")
                start = 12
            else:
                raise BundleError(f"{name}: unsupported .npy version {major}.{prefix[7]}")
            if length > 1 << 20:
                raise BundleError(f"{name}: .npy header length {length} is implausible")
            raw = f.read(length)
    except OSError as exc:
        raise BundleError(f"{name}: cannot read ({exc.strerror or exc})") from exc
    if len(raw) != length:
        raise BundleError(f"{name}: truncated .npy header")
    try:
        header = ast.literal_eval(raw.decode("utf8" if major == 3 else "latin1"))
        if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
            raise ValueError("keys")
        descr, raw_shape = header["descr"], header["shape"]
        if not isinstance(descr, str) or not isinstance(raw_shape, tuple):
            raise ValueError("descr or shape")
        dtype = np.dtype(descr)
        if dtype.str != descr:  # exactly the canonical form the writer uses ('<u2', not 'u2' or '=u2')
            raise ValueError("descr")
        if not all(type(d) is int for d in raw_shape):
            raise ValueError("shape")
        shape = tuple(raw_shape)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise BundleError(f"{name}: malformed .npy header") from None
    if header["fortran_order"] is not False:
        raise BundleError(f"{name}: Fortran-order arrays are not allowed")
    if dtype.hasobject or any(d < 0 for d in shape):
        raise BundleError(f"{name}: object dtype or negative shape in .npy header")
    return dtype, shape, start + length
