"""A bundle or OUT dir from elsewhere is untrusted input: nothing zerogr does with it writes outside it, reads
a special file or an unbounded amount, or fails with anything but one BundleError naming the file. Also:
opening or verifying an OUT while a prune races it, items without an item-id column, and kernel files
checked from their head without reading them whole."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zerogr_build.base.errors import BundleError, InputError
from zerogr_build.bundle import (
    add_bundle_files,
    list_versions,
    open_bundle,
    promote_bundle,
    resolve_bundle,
    verify_bundle,
)
from zerogr_build.bundle import versions as versions_module
from zerogr_build.bundle.files import npy_header, sha256_file
from zerogr_build.bundle.format import manifest_bytes
from zerogr_build.bundle.kernel_files import MAX_KERNEL_BYTES, kernel_problem
from zerogr_build.bundle.verify import check_kernel_files
from zerogr_build.testing import finishes, publish_catalog, random_catalog

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def catalog():
    return random_catalog(seed=3, n=300, sizes=(4, 8, 16))


def rewrite_manifest(vdir: Path, change) -> None:
    manifest = json.loads((vdir / "manifest.json").read_text())
    change(manifest)
    (vdir / "manifest.json").write_bytes(manifest_bytes(manifest))


def relist(vdir: Path, name: str):
    def change(manifest):
        size, digest = sha256_file(vdir / name)
        manifest["files"][name] = {"bytes": size, "sha256": digest}

    rewrite_manifest(vdir, change)


# --------------------------------------------------------------------------------------------------- journals


def hostile_journal(vdir: Path, outside: Path) -> tuple[Path, Path]:
    """The review's F1 attack: kernels/ -> a dir outside, a .tmp- file renamed into it, and an absolute
    temp name of another project moved into the bundle. Returns (outside victim file, foreign temp)."""
    victim = outside / "authorized_keys"
    victim.write_text("the user's own key\n")
    foreign = outside / ".tmp-1234-abcd.lock"
    foreign.write_text("another project's temp\n")
    (vdir / "kernels").symlink_to(outside, target_is_directory=True)
    (vdir / "plans").mkdir()
    (vdir / ".tmp-evil").write_text("ssh-ed25519 AAAA ATTACKER\n")
    manifest = json.loads((vdir / "manifest.json").read_text())
    journal = {
        "renames": [[".tmp-evil", "kernels/authorized_keys"], [str(foreign), "plans/stolen.json"]],
        "manifest": manifest,
    }
    (vdir / "manifest.json.journal").write_bytes(manifest_bytes(journal))
    return victim, foreign


@pytest.mark.parametrize("writer", ["publish", "promote", "add"])
def test_hostile_journal_never_writes_outside_the_bundle(tmp_path, catalog, writer):
    out, outside = tmp_path / "out", tmp_path / "home"
    outside.mkdir()
    _, published = publish_catalog(catalog, out)
    victim, foreign = hostile_journal(published.path, outside)
    if writer == "publish":
        publish_catalog(catalog, out)
    elif writer == "promote":
        promote_bundle(published.path)
    else:
        add_bundle_files(published.path, {"plans/cpu.json": b"{}"})
    assert victim.read_text() == "the user's own key\n"
    assert foreign.read_text() == "another project's temp\n"
    assert not (published.path / "plans" / "stolen.json").exists()
    assert not (published.path / "manifest.json.journal").exists()  # dropped: the old manifest holds
    open_bundle(published.path)


def test_a_genuine_journal_is_still_rolled_forward(tmp_path, catalog):
    out = tmp_path / "out"
    _, published = publish_catalog(catalog, out)
    vdir = published.path
    (vdir / "plans").mkdir()
    (vdir / "plans" / ".tmp-1-aa-cpu.json").write_bytes(b'{"new": true}')
    manifest = json.loads((vdir / "manifest.json").read_text())
    size, digest = sha256_file(vdir / "plans" / ".tmp-1-aa-cpu.json")
    manifest["files"]["plans/cpu.json"] = {"bytes": size, "sha256": digest}
    journal = {"renames": [["plans/.tmp-1-aa-cpu.json", "plans/cpu.json"]], "manifest": manifest}
    (vdir / "manifest.json.journal").write_bytes(manifest_bytes(journal))
    promote_bundle(vdir)
    assert json.loads(open_bundle(vdir).file("plans/cpu.json").read_bytes()) == {"new": True}


# ------------------------------------------------------------------------------------------------------ locks


def test_dangling_lock_symlink_creates_nothing_outside(tmp_path, catalog):
    out = tmp_path / "out"
    publish_catalog(catalog, out)
    (out / ".lock").unlink()
    target = tmp_path / "elsewhere" / "nologin"
    target.parent.mkdir()
    (out / ".lock").symlink_to(target)
    with pytest.raises(BundleError, match=r"\.lock: a symlink"):
        publish_catalog(catalog, out)
    assert not target.exists()


# --------------------------------------------------- LATEST and manifests named by a hostile OUT; npy headers


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "huge", "dir", "non_utf8"])
def test_hostile_latest_is_refused_naming_it(tmp_path, catalog, kind):
    out = tmp_path / "out"
    publish_catalog(catalog, out)
    latest = out / "LATEST"
    latest.unlink()
    if kind == "fifo":
        os.mkfifo(latest)
    elif kind == "dev_zero":
        latest.symlink_to("/dev/zero")
    elif kind == "huge":
        latest.write_bytes(b"v000001" + b" " * (1 << 20))
    elif kind == "dir":
        latest.mkdir()
    else:
        latest.write_bytes(b"v00000\xff\n")
    with pytest.raises(BundleError, match=r"LATEST"):
        finishes(lambda: open_bundle(out))
    with pytest.raises(BundleError, match=r"LATEST"):
        finishes(lambda: verify_bundle(out))
    if kind in ("huge", "non_utf8"):  # a build into that OUT still works (and replaces LATEST)
        assert finishes(lambda: publish_catalog(catalog, out))[1].version == 2


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "deep", "outside"])
def test_hostile_manifest_given_as_the_version_dir_is_refused(tmp_path, catalog, kind):
    out = tmp_path / "out"
    _, published = publish_catalog(catalog, out)
    manifest = published.path / "manifest.json"
    text = manifest.read_bytes()
    manifest.unlink()
    if kind == "fifo":
        os.mkfifo(manifest)
    elif kind == "dev_zero":
        manifest.symlink_to("/dev/zero")
    elif kind == "deep":
        manifest.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    else:
        (tmp_path / "elsewhere.json").write_bytes(text)
        manifest.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(BundleError, match=r"manifest\.json"):
        finishes(lambda: open_bundle(published.path))


def write_npy_with_header(path: Path, header_text: str, data: bytes) -> None:
    raw = header_text.encode("latin1")
    raw += b" " * (-(10 + len(raw) + 1) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(raw).to_bytes(2, "little") + raw + data)


@pytest.mark.parametrize(
    "header",
    [
        "{'descr': 'i8', 'fortran_order': False, 'shape': (%d,), }",
        "{'descr': '=i8', 'fortran_order': False, 'shape': (%d,), }",
        "{'descr': '<i8', 'fortran_order': False, 'shape': (%d.9,), }",
        "{'descr': '<i8', 'fortran_order': False, 'shape': (" + "-" * 60_000 + "%d,), }",
    ],
    ids=["descr_u", "descr_eq", "float_shape", "deep_literal"],
)
def test_npy_header_must_be_exactly_what_the_manifest_implies(tmp_path, catalog, header):
    out = tmp_path / "out"
    _, published = publish_catalog(catalog, out)
    path = published.path / "leaves.offsets.npy"
    offsets = np.load(path)
    write_npy_with_header(path, header % len(offsets), offsets.astype("<i8").tobytes())
    relist(published.path, "leaves.offsets.npy")
    with pytest.raises(BundleError, match=r"leaves\.offsets\.npy"):
        open_bundle(published.path)


def test_canonical_npy_header_still_opens(tmp_path, catalog):
    out = tmp_path / "out"
    _, published = publish_catalog(catalog, out)
    path = published.path / "leaves.offsets.npy"
    offsets = np.load(path)
    header = npy_header(offsets.dtype, offsets.shape)  # the file's own dtype (int32 or int64, format 2)
    path.write_bytes(header + offsets.tobytes())
    relist(published.path, "leaves.offsets.npy")
    assert open_bundle(published.path).index.num_leaves == len(offsets) - 1


def test_version_names_use_ascii_digits_only(tmp_path, catalog):
    out = tmp_path / "out"
    _, published = publish_catalog(catalog, out)
    os.rename(published.path, out / "v\u0660\u0660\u0660\u0660\u0660\u0661")
    (out / "LATEST").write_text("v\u0660\u0660\u0660\u0660\u0660\u0661\n")
    assert list_versions(out) == []
    with pytest.raises(BundleError, match=r"does not name a version dir"):
        open_bundle(out)


# ------------------------------------------------------------------------------ stray entries and the counter


@pytest.mark.parametrize("stray", ["file", "dangling_symlink"])
def test_a_stray_entry_named_like_a_version_does_not_wedge_out(tmp_path, catalog, stray):
    out = tmp_path / "out"
    publish_catalog(catalog, out)
    if stray == "file":
        (out / "v000002").write_text("not a version")
    else:
        (out / "v000002").symlink_to(tmp_path / "nowhere")
    assert publish_catalog(catalog, out)[1].version == 3
    assert publish_catalog(catalog, out)[1].version == 4
    assert open_bundle(out).version == 4


def test_unreadable_counter_is_refused_not_ignored(tmp_path, catalog):
    out = tmp_path / "out"
    publish_catalog(catalog, out)
    publish_catalog(catalog, out)
    import shutil

    shutil.rmtree(out / "v000002")
    (out / "LATEST").write_text("v000001\n")
    (out / ".last_version").write_bytes(b"2 \x00")
    with pytest.raises(BundleError, match=r"\.last_version: not a version number"):
        publish_catalog(catalog, out)
    assert list_versions(out) == [1]  # v000002 was not reused
    (out / ".last_version").write_text("2\n")
    assert publish_catalog(catalog, out)[1].version == 3


# ------------------------------------------------------------- versions pruned under a reader; the items file


def test_open_out_retries_when_its_version_is_pruned_after_resolving(tmp_path, catalog, monkeypatch):
    from zerogr_build.bundle import reader

    out = tmp_path / "out"
    publish_catalog(catalog, out)
    real_resolve = reader.resolve_bundle
    raced = []

    def resolve_then_publish(path):
        version_dir = real_resolve(path)
        if not raced:  # a build publishes and prunes right after this reader resolved LATEST
            raced.append(publish_catalog(catalog, out, keep=1)[1].version)
        return version_dir

    monkeypatch.setattr(reader, "resolve_bundle", resolve_then_publish)
    bundle = open_bundle(out)
    assert raced == [2] and list_versions(out) == [2]
    assert bundle.version == 2
    assert len(bundle.items()) == catalog.rows


def test_a_held_version_keeps_its_items_after_it_is_pruned(tmp_path, catalog):
    out = tmp_path / "out"
    publish_catalog(catalog, out)
    held = open_bundle(out)
    publish_catalog(catalog, out, keep=1)
    publish_catalog(catalog, out, keep=1)
    assert not held.path.exists()
    assert sorted(held.items().to_pylist()) == sorted(catalog.item_ids.to_pylist())
    assert held.item_ids_for_leaves([0]).to_pylist()[0]


def test_items_row_count_is_checked_before_decoding(tmp_path, catalog):
    out = tmp_path / "out"
    _, published = publish_catalog(catalog, out)
    items = published.path / "items.parquet"
    rows = 20_000_000  # constant ids: a few hundred KB on disk, 160 MB decoded
    pq.write_table(pa.table({"item_id": pa.repeat(pa.scalar(7, pa.int64()), rows)}), items)
    assert items.stat().st_size < 2_000_000
    relist(published.path, "items.parquet")
    script = (
        "import resource, sys\n"
        "from zerogr_build.bundle import open_bundle\n"
        "from zerogr_build.base.errors import BundleError\n"
        "bundle = open_bundle(sys.argv[1])\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n    bundle.items()\nexcept BundleError as exc:\n    print(exc)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(published.path)],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    message, grown_mb = proc.stdout.strip().splitlines()
    assert f"{rows} items, manifest says {catalog.rows}" in message, proc.stderr
    assert int(grown_mb) < 60, f"items() grew RSS by {grown_mb} MB before refusing"


# -------------------------------------------------------------------------------------------- a failing prune


def test_a_failing_prune_warns_and_the_publish_stands(tmp_path, catalog, monkeypatch):
    from zerogr_build.bundle import versions

    out = tmp_path / "out"
    publish_catalog(catalog, out)
    real_rename = os.rename

    def rename(src, dst, *args, **kwargs):
        if Path(dst).name.startswith(".tmp-del-"):
            raise PermissionError(1, "Operation not permitted", str(src))
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(versions.os, "rename", rename)
    with pytest.warns(UserWarning, match=r"v000001: could not prune"):
        published = publish_catalog(catalog, out, keep=1)[1]
    monkeypatch.undo()
    assert published.version == 2 and open_bundle(out).version == 2
    assert list_versions(out) == [1, 2]


# ------------------------------------------------------------------------------------------------ the OUT dir


def test_out_dir_checks(tmp_path, catalog):
    from zerogr_build.bundle.versions import check_out_dir

    _, published = publish_catalog(catalog, tmp_path / "out")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match=r"is a published version dir"):
        check_out_dir(published.path)
    with pytest.raises(InputError, match=r"afile is not a directory"):
        check_out_dir(tmp_path / "afile")
    with pytest.raises(InputError, match=r"afile is not a directory"):
        check_out_dir(tmp_path / "afile" / "sub" / "out")
    assert check_out_dir(tmp_path / "new" / "out") == tmp_path / "new" / "out"
    assert resolve_bundle(tmp_path / "out") == published.path


# --------------------------------------------------------------------- a prune racing open / verify of an OUT


def _prune_right_after_reading_latest(monkeypatch, catalog, out: Path) -> list[int]:
    """The next read of OUT/LATEST by resolve_bundle is followed, before anything else, by a publish with
    --keep 1 that replaces LATEST and prunes the version it named."""
    real = versions_module.read_latest
    raced: list[int] = []

    def read_then_publish(path):
        name = real(path)
        if not raced and Path(path) == out:
            raced.append(0)
            raced[0] = publish_catalog(catalog, out, keep=1)[1].version
        return name

    monkeypatch.setattr(versions_module, "read_latest", read_then_publish)
    return raced


def test_open_out_survives_a_prune_between_reading_latest_and_checking_it(tmp_path, catalog, monkeypatch):
    out = tmp_path / "out"
    publish_catalog(catalog, out)
    raced = _prune_right_after_reading_latest(monkeypatch, catalog, out)
    bundle = open_bundle(out)
    assert raced == [2] and list_versions(out) == [2]
    assert bundle.version == 2 and len(bundle.items()) == catalog.rows


def test_verify_out_survives_the_same_race(tmp_path, catalog, monkeypatch):
    out = tmp_path / "out"
    publish_catalog(catalog, out)
    raced = _prune_right_after_reading_latest(monkeypatch, catalog, out)
    report = verify_bundle(out)
    assert raced == [2] and report["version"] == 2


def test_a_latest_naming_a_missing_version_is_still_refused(tmp_path, catalog):
    out = tmp_path / "out"
    publish_catalog(catalog, out)
    (out / "LATEST").write_text("v000009\n")  # nobody moves it on: a real error, after the retries
    with pytest.raises(BundleError, match=r"LATEST: names v000009, which is missing"):
        open_bundle(out)


# ----------------------------------------------------------------------------------- the items file's columns


def test_items_without_an_item_id_column_is_a_bundle_error_naming_the_file(tmp_path, catalog):
    _, published = publish_catalog(catalog, tmp_path / "out")
    items = published.path / "items.parquet"
    ids = pq.read_table(items).column("item_id")
    pq.write_table(pa.table({"id": ids}), items)
    relist(published.path, "items.parquet")
    with pytest.raises(BundleError, match=r"items\.parquet: no 'item_id' column"):
        verify_bundle(published.path)
    with pytest.raises(BundleError, match=r"items\.parquet: no 'item_id' column"):
        open_bundle(published.path).items()


# ---------------------------------------------------------------------- kernel files, checked from their head


def cubin_head(sm: int, shoff: int = 64, shnum: int = 1) -> bytes:
    """A 64-byte ELF header as nvcc writes it for sm_<sm> (ELF64, little-endian, CUDA ABI 8, e_machine
    190, the SM number in bits 8-15 of e_flags), with `shnum` section headers at `shoff`."""
    ident = b"\x7fELF\x02\x01\x01\x41\x08" + bytes(7)
    flags = 0x6000004 | (sm << 8)
    return struct.pack("<16sHHIQQQIHHHHHH", ident, 2, 190, 1, 0, 0, shoff, flags, 64, 56, 0, 64, shnum, 0)


def _sparse_kernel(vdir: Path, name: str, head: bytes, size: int) -> Path:
    path = vdir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    relist(vdir, name)
    return path


def test_verify_reads_only_the_head_of_a_large_kernel_file(tmp_path, catalog):
    _, published = publish_catalog(catalog, tmp_path / "out")
    size = MAX_KERNEL_BYTES - 1024  # allowed, and large enough to show in the peak memory if read whole
    _sparse_kernel(published.path, "kernels/sm_90/selective.cubin", cubin_head(90), size)
    manifest = open_bundle(published.path).manifest
    tracemalloc.start()
    try:
        names = check_kernel_files(published.path, manifest)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert names == ["kernels/sm_90/selective.cubin"]
    assert peak < 1 << 20, f"verify's kernel check allocated {peak >> 20} MB at its peak"
    assert verify_bundle(published.path)["kernels"] == names


def test_verify_refuses_an_oversized_kernel_file_naming_it(tmp_path, catalog):
    _, published = publish_catalog(catalog, tmp_path / "out")
    path = _sparse_kernel(
        published.path, "kernels/sm_90/selective.cubin", cubin_head(90), 3 * MAX_KERNEL_BYTES
    )
    with pytest.raises(BundleError, match=rf"{path}: {3 * MAX_KERNEL_BYTES} bytes, more than the"):
        verify_bundle(published.path)


@pytest.mark.parametrize(
    ("name", "head", "message"),
    [
        ("kernels/sm_90/selective.cubin", cubin_head(80), "a cubin for sm_80, not sm_90"),
        ("kernels/sm_90/selective.cubin", cubin_head(90, shoff=1 << 20, shnum=9), "truncated"),
        ("kernels/sm_90/selective.cubin", b"\x7fELF\x01\x01\x01" + bytes(57), "not a 64-bit"),
        (
            "kernels/sm_90/selective.ptx",
            b".version 9.0\n.target sm_80\n",
            "a PTX module for sm_80, not sm_90",
        ),
        ("kernels/sm_90/selective.ptx", b"// .target sm_90 in a comment\n", "no .target directive"),
    ],
)
def test_verify_checks_the_kernel_kind_and_arch_from_the_head(tmp_path, catalog, name, head, message):
    _, published = publish_catalog(catalog, tmp_path / "out")
    path = _sparse_kernel(published.path, name, head, 4096 if name.endswith(".cubin") else len(head))
    with pytest.raises(BundleError, match=rf"{path}: .*{message}"):
        verify_bundle(published.path)


def test_the_serving_loader_refuses_an_oversized_kernel_before_reading_it(tmp_path, catalog, monkeypatch):
    from zerogr_build.cuda import bundle_kernels as bk

    _, published = publish_catalog(catalog, tmp_path / "out")
    name = "kernels/sm_90/selective.ptx"
    _sparse_kernel(published.path, name, b".version 9.0\n.target sm_90\n", 2 * MAX_KERNEL_BYTES)
    bundle = open_bundle(published.path)
    with pytest.raises(BundleError, match="more than the"):
        bk.read_checked_kernel_file(bundle, name)


def test_kernel_problem_accepts_what_nvcc_writes_and_nothing_empty():
    assert kernel_problem(cubin_head(90) + bytes(64), 128, "cubin", "sm_90") is None
    assert kernel_problem(cubin_head(90) + bytes(64), 128, "cubin", "sm_90a") is None
    assert kernel_problem(b".version 9.0\n.target sm_90\n", 30, "ptx", "sm_90") is None
    assert kernel_problem(b"", 0, "ptx", "sm_90") == "empty"
    assert "not a cubin" in kernel_problem(b"PTX", 3, "cubin", "sm_90")
