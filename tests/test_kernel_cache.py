"""The kernel cache and nvcc as untrusted input.

G1: a cache entry that was replaced, truncated, symlinked, hard-linked, made a FIFO or a dir, owned by
another user or writable by others is never shipped: it is discarded and recompiled with one warning.
G10: a cache dir that cannot be used means compiling into a temporary dir (one warning), never exit 1.
G11: nvcc output that is not a cubin/PTX for the arch is neither cached nor shipped.
G18: a timeout kills nvcc's whole process group, a timed-out toolkit is not run again in the process, and
a build killed mid-compile leaves no temp file in the cache.

The real nvcc compiles the package's kernels; misbehaving toolkits are shell scripts named nvcc."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from zerogr_build.bundle import open_bundle, verify_bundle
from zerogr_build.cli import app
from zerogr_build.config import BuildSettings
from zerogr_build.cuda import cache as kc
from zerogr_build.cuda import nvcc as kn
from zerogr_build.pipeline import KernelsSkippedWarning, build_bundle

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile kernels")
REPO = Path(__file__).resolve().parents[1]
SM90 = ["kernels/sm_90/selective.cubin", "kernels/sm_90/selective.ptx"]


@pytest.fixture(autouse=True)
def _fresh_toolkit_memory():
    kn.forget_failed_toolkits()
    yield
    kn.forget_failed_toolkits()


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """(cache dir compiled once for sm_90 with the real nvcc, the files it gives)."""
    if NVCC is None:
        pytest.skip("nvcc not on PATH")
    cache = tmp_path_factory.mktemp("warm") / "cache"
    files = kc.cached_kernel_files(["sm_90"], nvcc=NVCC, cache_dir=cache)
    return cache, files


def _copy(warm, dest: Path) -> Path:
    """A copy of the warm cache at `dest` (what cached_kernel_files(cache_dir=dest) reads)."""
    shutil.copytree(warm[0], dest, symlinks=True)
    return dest


def _entry(cache: Path, name: str) -> Path:
    """The cache file holding kernels/sm_90/<name> (found by pattern, whatever the entry layout)."""
    (found,) = [p for p in cache.rglob(f"{name}*") if "sm_90" in p.parts and not p.name.startswith(".")]
    return found


def _cached(cache: Path) -> tuple[dict[str, bytes], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        files = kc.cached_kernel_files(["sm_90"], nvcc=NVCC, cache_dir=cache)
    return files, [str(w.message) for w in caught if issubclass(w.category, kc.KernelCacheWarning)]


def _fake_nvcc(tmp_path: Path, body: str, name: str = "nvcc") -> Path:
    """A shell script standing in for a misbehaving toolkit; `--version` answers at once unless `body`
    handles it first. $out is the -o argument."""
    script = tmp_path / "fakebin" / name
    script.parent.mkdir(exist_ok=True)
    script.write_text(
        "#!/bin/sh\n"
        'out=""; prev=""\n'
        'for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done\n'
        f"{body}\n"
        '[ "$1" = "--version" ] && { echo "fake nvcc 0.1"; exit 0; }\n'
        "exit 0\n"
    )
    script.chmod(0o755)
    return script


def _catalog(path: Path) -> Path:
    rng = np.random.default_rng(0)
    sids = rng.integers(0, 8, size=(200, 3))
    col = pa.array([list(map(int, r)) for r in sids], type=pa.list_(pa.int32()))
    pq.write_table(pa.table({"item_id": pa.array(np.arange(200), pa.int64()), "sid": col}), path)
    return path


# ------------------------------------------------------------------------------------------------- G1


def _replace_with_garbage_cubin(entry: Path, tmp_path: Path) -> None:
    entry.write_bytes(b"\x7fELF" + b"attacker code " * 100)


def _flip_payload_byte(entry: Path, tmp_path: Path) -> None:
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0x01
    entry.write_bytes(bytes(data))


def _truncate(entry: Path, tmp_path: Path) -> None:
    entry.write_bytes(entry.read_bytes()[:2000])


def _symlink_to_secret(entry: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text(".version 9.0\n.target sm_90\n// builder's private key: hunter2\n" * 20)
    entry.unlink()
    entry.symlink_to(secret)


def _hard_link_to_secret(entry: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(entry.read_bytes())  # even a good copy: a second name means someone else's file
    entry.unlink()
    os.link(secret, entry)


def _owned_by_someone_else(entry: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    os.chown(entry, 12345, 12345)


def _world_writable(entry: Path, tmp_path: Path) -> None:
    entry.chmod(0o666)


def _fifo(entry: Path, tmp_path: Path) -> None:
    entry.unlink()
    os.mkfifo(entry)


def _directory(entry: Path, tmp_path: Path) -> None:
    entry.unlink()
    (entry / "inner").mkdir(parents=True)


def _valid_header_for_garbage(entry: Path, tmp_path: Path) -> None:
    """Someone who knows the entry layout writes a consistent entry (right length and sha256) around bytes
    that are not a CUDA cubin: the kind check still refuses it."""
    garbage = b"\x7fELF\x02\x01\x01" + bytes(57) + b"payload " * 500
    entry.write_bytes(kc.cache_entry_bytes("sm_90", "selective.cubin", garbage))


def _other_arch_cubin_with_valid_header(entry: Path, tmp_path: Path) -> None:
    other = tmp_path / "sm80.cubin"
    subprocess.run(
        [NVCC, "-cubin", "-arch=sm_80", "-O3", "-o", str(other), str(kn.kernel_sources()[0])], check=True
    )
    entry.write_bytes(kc.cache_entry_bytes("sm_90", "selective.cubin", other.read_bytes()))


POISONS = {
    "replaced": _replace_with_garbage_cubin,
    "flipped": _flip_payload_byte,
    "truncated": _truncate,
    "hardlink": _hard_link_to_secret,
    "foreign-owner": _owned_by_someone_else,
    "world-writable": _world_writable,
    "fifo": _fifo,
    "directory": _directory,
    "forged-header": _valid_header_for_garbage,
    "other-arch": _other_arch_cubin_with_valid_header,
}


@needs_nvcc
@pytest.mark.parametrize("poison", sorted(POISONS))
def test_a_bad_cubin_entry_is_discarded_recompiled_and_warned_once(warm, tmp_path, poison):
    cache = _copy(warm, tmp_path / "cache")
    entry = _entry(cache, "selective.cubin")
    POISONS[poison](entry, tmp_path)
    files, said = _cached(cache)
    assert files == warm[1]  # the recompiled, checked bytes: nothing of the poison is shipped
    assert len(said) == 1 and str(entry) in said[0] and "recompiled" in said[0], said
    assert entry.is_file() and not entry.is_symlink() and entry.stat().st_nlink == 1
    assert _cached(cache) == (warm[1], [])  # the new entry is good: no warning, no nvcc needed


@needs_nvcc
def test_a_ptx_entry_symlinked_to_a_private_file_is_not_shipped(warm, tmp_path):
    cache = _copy(warm, tmp_path / "cache")
    entry = _entry(cache, "selective.ptx")
    _symlink_to_secret(entry, tmp_path)
    files, said = _cached(cache)
    assert b"hunter2" not in files["kernels/sm_90/selective.ptx"]
    assert files == warm[1]
    assert len(said) == 1 and "symlink" in said[0]
    assert (tmp_path / "secret.txt").read_text().count("hunter2") == 20  # the target is left alone


@needs_nvcc
def test_a_symlinked_cache_key_dir_is_not_followed(warm, tmp_path):
    cache = _copy(warm, tmp_path / "cache")
    key_dir = next(cache.iterdir())
    elsewhere = tmp_path / "elsewhere"
    shutil.move(key_dir, elsewhere)
    for path in elsewhere.rglob("*"):
        if path.is_file():
            path.write_bytes(b"\x7fELF" + b"attacker code " * 100)
    key_dir.symlink_to(elsewhere, target_is_directory=True)
    files, said = _cached(cache)
    assert files == warm[1] and len(said) == 1 and "not a directory" in said[0]
    assert not key_dir.is_symlink() and key_dir.is_dir()


@needs_nvcc
def test_an_arch_dir_others_can_write_is_not_trusted(warm, tmp_path):
    cache = _copy(warm, tmp_path / "cache")
    entry = _entry(cache, "selective.cubin")
    _replace_with_garbage_cubin(entry, tmp_path)
    entry.parent.chmod(0o777)  # anyone could have put that there
    files, said = _cached(cache)
    assert files == warm[1]
    assert len(said) == 1 and "writable by group or others" in said[0] and "not used" in said[0], said
    assert entry.read_bytes().startswith(b"\x7fELFattacker")  # another's dir: left alone, not used


@needs_nvcc
def test_a_poisoned_cache_never_reaches_a_published_bundle(warm, tmp_path, monkeypatch):
    cache = _copy(warm, tmp_path / "zc" / "kernels")  # $ZEROGR_CACHE_DIR/kernels is the cache
    _replace_with_garbage_cubin(_entry(cache, "selective.cubin"), tmp_path)
    _symlink_to_secret(_entry(cache, "selective.ptx"), tmp_path)
    monkeypatch.setenv("ZEROGR_CACHE_DIR", str(tmp_path / "zc"))
    settings = BuildSettings(out=str(tmp_path / "out"), codebook_sizes=(8, 8, 8), kernel_archs=("sm_90",))
    with pytest.warns(kc.KernelCacheWarning):
        summary = build_bundle(str(_catalog(tmp_path / "cat.parquet")), settings)
    bundle = open_bundle(summary["bundle"])
    assert {n: bundle.file(n).read_bytes() for n in bundle.files("kernels/")} == warm[1]
    assert verify_bundle(summary["bundle"])["kernels"] == SM90


# ------------------------------------------------------------------------------------------------ G10


@needs_nvcc
@pytest.mark.parametrize("where", ["dev-null", "a-file", "proc-self", "foreign-key-dir"])
def test_an_unusable_cache_dir_compiles_into_a_temporary_dir(warm, tmp_path, where):
    if where == "dev-null":
        root = Path("/dev/null")
    elif where == "a-file":
        root = tmp_path / "file"
        root.write_text("not a dir")
    elif where == "proc-self":
        root = Path("/proc/self")
    else:  # a key dir of another user: nothing under it can be trusted or replaced
        if os.geteuid() != 0:
            pytest.skip("chown needs root")
        root = _copy(warm, tmp_path / "cache")
        key_dir = next(root.iterdir())
        os.chown(key_dir, 12345, 12345)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        files = kc.cached_kernel_files(["sm_90"], nvcc=NVCC, cache_dir=root)
    said = [str(w.message) for w in caught if issubclass(w.category, kc.KernelCacheWarning)]
    assert files == warm[1]
    assert len(said) == 1 and "unusable" in said[0] and "temporary dir" in said[0], said


@needs_nvcc
def test_a_read_only_home_compiles_into_a_temporary_dir(warm, tmp_path):
    """An immutable dir (chattr +i: what a read-only HOME in a container looks like; root ignores mode
    bits) cannot take the cache."""
    home = tmp_path / "home"
    home.mkdir()
    if subprocess.run(["chattr", "+i", str(home)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i not available here")
    try:
        files, said = _cached(home / ".cache" / "zerogr" / "kernels")
    finally:
        subprocess.run(["chattr", "-i", str(home)], check=True)
    assert files == warm[1]
    assert len(said) == 1 and "unusable" in said[0], said


@needs_nvcc
def test_build_with_cache_dir_dev_null_publishes_with_kernels_exit_0(tmp_path):
    cat = _catalog(tmp_path / "cat.parquet")
    args = ["build", str(cat), "--out", str(tmp_path / "o"), "--codebook-sizes", "8,8,8", "--kernel-archs",
            "sm_90"]  # fmt: skip
    res = CliRunner().invoke(app, args, env={"ZEROGR_CACHE_DIR": "/dev/null"})
    assert res.exit_code == 0, res.output
    assert res.output.count("kernel cache unusable") == 1
    assert open_bundle(tmp_path / "o").files("kernels/") == SM90
    verify_bundle(tmp_path / "o")


def test_with_nowhere_to_compile_the_build_publishes_without_kernels(tmp_path, monkeypatch):
    nvcc = _fake_nvcc(tmp_path, "")
    monkeypatch.setenv("PATH", f"{nvcc.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ZEROGR_CACHE_DIR", "/dev/null")
    monkeypatch.setattr("tempfile.tempdir", "/dev/null/tmp")  # no temporary dir either
    settings = BuildSettings(out=str(tmp_path / "out"), codebook_sizes=(8, 8, 8), kernel_archs=("sm_90",))
    with pytest.warns(KernelsSkippedWarning, match="no compiled kernels in this bundle: cannot compile"):
        summary = build_bundle(str(_catalog(tmp_path / "cat.parquet")), settings)
    monkeypatch.undo()
    assert open_bundle(summary["bundle"]).files("kernels/") == []
    verify_bundle(summary["bundle"])


# ------------------------------------------------------------------------------------------------ G11


def _garbage(tmp_path: Path) -> str:
    return '[ -n "$out" ] && head -c 64 /dev/urandom > "$out"'


def _wrong_arch(tmp_path: Path) -> str:
    """A real cubin, but for sm_80 when sm_90 was asked for."""
    swap = 'set -- $(printf "%s\\n" "$@" | sed s/^-arch=sm_90$/-arch=sm_80/)'
    return f'[ -n "$out" ] && {{ {swap}; exec {NVCC} "$@"; }}'


def _ptx_without_target(tmp_path: Path) -> str:
    return '[ -n "$out" ] && printf "//\\n.version 9.0\\n.address_size 64\\n" > "$out"'


@pytest.mark.parametrize("output", [_garbage, _wrong_arch, _ptx_without_target])
def test_nvcc_output_that_is_not_a_kernel_is_neither_cached_nor_shipped(tmp_path, output):
    if output is _wrong_arch and NVCC is None:
        pytest.skip("nvcc not on PATH")
    nvcc = _fake_nvcc(tmp_path, output(tmp_path))
    cache = tmp_path / "cache"
    with pytest.raises(kn.KernelCompileError, match=r"wrote a bad (cubin|ptx) for sm_90"):
        kc.cached_kernel_files(["sm_90"], nvcc=str(nvcc), cache_dir=cache)
    assert [p for p in cache.rglob("*") if p.is_file()] == []
    kn.forget_failed_toolkits()
    with pytest.raises(kn.KernelCompileError):  # and again: nothing was cached to ship next time
        kc.cached_kernel_files(["sm_90"], nvcc=str(nvcc), cache_dir=cache)


def test_a_build_with_a_garbage_nvcc_publishes_a_version_that_verifies(tmp_path, monkeypatch):
    nvcc = _fake_nvcc(tmp_path, _garbage(tmp_path))
    monkeypatch.setenv("PATH", f"{nvcc.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ZEROGR_CACHE_DIR", str(tmp_path / "cache"))
    cat = _catalog(tmp_path / "cat.parquet")
    for _ in range(2):
        settings = BuildSettings(out=str(tmp_path / "out"), codebook_sizes=(8, 8, 8), kernel_archs=("sm_90",))
        with pytest.warns(KernelsSkippedWarning, match="wrote a bad cubin for sm_90"):
            summary = build_bundle(str(cat), settings)
        assert open_bundle(summary["bundle"]).files("kernels/") == []
        assert verify_bundle(summary["bundle"])["ok"]


# ------------------------------------------------------------------------------------------------ G18


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _hanging(tmp_path: Path, when: str = '[ -n "$out" ]') -> tuple[Path, Path]:
    """A toolkit whose compile (or --version) starts a child that hangs, like a stuck cicc/ptxas."""
    pids = tmp_path / "pids"
    nvcc = _fake_nvcc(tmp_path, f"{when} && {{ sleep 120 & echo $! >> {pids}; wait; }}")
    return nvcc, pids


def test_a_timeout_kills_the_whole_group_and_the_toolkit_is_not_run_again(tmp_path):
    nvcc, pids = _hanging(tmp_path)
    t = time.monotonic()
    with pytest.raises(kn.KernelCompileError, match="timed out after 1 s"):
        kn.compile_kernels("sm_90", "cubin", tmp_path / "out", nvcc=str(nvcc), timeout_s=1)
    assert time.monotonic() - t < 10
    (pid,) = map(int, pids.read_text().split())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "nvcc's child survived the timeout"
    t = time.monotonic()
    with pytest.raises(kn.KernelCompileError, match="not run again"):
        kn.compile_kernels("sm_90", "ptx", tmp_path / "out", nvcc=str(nvcc), timeout_s=1)
    assert time.monotonic() - t < 0.5 and pids.read_text().split() == [str(pid)]


def test_a_hung_toolkit_costs_one_timeout_per_process_not_per_build(tmp_path, monkeypatch):
    nvcc, pids = _hanging(tmp_path, when='[ "$1" = "--version" ]')
    monkeypatch.setenv("PATH", f"{nvcc.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(kc, "NVCC_VERSION_TIMEOUT_S", 1)
    cat = _catalog(tmp_path / "cat.parquet")
    for _ in range(3):
        settings = BuildSettings(out=str(tmp_path / "out"), codebook_sizes=(8, 8, 8), kernel_archs=("sm_90",))
        with pytest.warns(KernelsSkippedWarning, match="timed out"):
            build_bundle(str(cat), settings)
    assert len(pids.read_text().split()) == 1  # nvcc ran once; the later builds skipped it at once


def test_a_build_killed_mid_compile_leaves_no_temp_file_in_the_cache(tmp_path):
    nvcc, pids = _hanging(tmp_path)
    cache = tmp_path / "cache"
    code = (
        "import sys\nfrom zerogr_build.cuda import cache as kc\n"
        "kc.cached_kernel_files(['sm_90'], nvcc=sys.argv[1], cache_dir=sys.argv[2])\n"
    )
    # A session of its own, so the clean-up below can kill whatever it left without touching pytest.
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(nvcc), str(cache)], cwd=REPO, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        while not pids.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pids.exists(), "the fake nvcc never started"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        groups = {proc.pid}
        for pid in map(int, pids.read_text().split()) if pids.exists() else []:
            if _alive(pid):
                groups.add(os.getpgid(pid))
        for group in groups - {os.getpgid(0)}:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
    assert [p.name for p in cache.rglob("*") if p.is_file()] == []


@needs_nvcc
def test_stale_temp_files_in_the_cache_are_swept(warm, tmp_path):
    cache = _copy(warm, tmp_path / "cache")
    arch_dir = _entry(cache, "selective.cubin").parent
    stale, live = arch_dir / ".selective.cubin.entry.1-dead.tmp", arch_dir / ".selective.ptx.entry.2-live.tmp"
    stale.write_bytes(b"half")
    live.write_bytes(b"half")
    old = time.time() - 2 * kc.STALE_TMP_S
    os.utime(stale, (old, old))
    files, said = _cached(cache)
    assert files == warm[1] and said == []
    assert not stale.exists() and live.exists()
