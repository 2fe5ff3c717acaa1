"""Bundle reading, hostile-input review 3: G8 (open_bundle(OUT) vs a prune between reading LATEST and
checking the version it names), G15 (items.parquet without item_id), G16 (verify reads only the head of a
kernel file, and refuses an oversized one naming it)."""

from __future__ import annotations

import hashlib
import json
import struct
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zerogr_build.base.errors import BundleError
from zerogr_build.bundle import list_versions, open_bundle, verify_bundle
from zerogr_build.bundle import versions as versions_module
from zerogr_build.bundle.kernel_files import MAX_KERNEL_BYTES, kernel_problem
from zerogr_build.bundle.verify import check_kernel_files
from zerogr_build.testing import publish_catalog, random_catalog


@pytest.fixture(scope="module")
def catalog():
    return random_catalog(seed=5, n=300, sizes=(4, 8, 16))


def relist(vdir: Path, name: str) -> None:
    """List `name` in the manifest with its current size and sha256 (a hostile bundle is consistent)."""
    manifest = json.loads((vdir / "manifest.json").read_text())
    h = hashlib.sha256()
    with open(vdir / name, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    manifest["files"][name] = {"bytes": (vdir / name).stat().st_size, "sha256": h.hexdigest()}
    (vdir / "manifest.json").write_text(json.dumps(manifest))


# ------------------------------------------------------------------------------------------------- G8


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


def test_g8_open_out_survives_a_prune_between_reading_latest_and_checking_it(tmp_path, catalog, monkeypatch):
    out = tmp_path / "out"
    publish_catalog(catalog, out)
    raced = _prune_right_after_reading_latest(monkeypatch, catalog, out)
    bundle = open_bundle(out)
    assert raced == [2] and list_versions(out) == [2]
    assert bundle.version == 2 and len(bundle.items()) == catalog.rows


def test_g8_verify_out_survives_the_same_race(tmp_path, catalog, monkeypatch):
    out = tmp_path / "out"
    publish_catalog(catalog, out)
    raced = _prune_right_after_reading_latest(monkeypatch, catalog, out)
    report = verify_bundle(out)
    assert raced == [2] and report["version"] == 2


def test_g8_a_latest_naming_a_missing_version_is_still_refused(tmp_path, catalog):
    out = tmp_path / "out"
    publish_catalog(catalog, out)
    (out / "LATEST").write_text("v000009\n")  # nobody moves it on: a real error, after the retries
    with pytest.raises(BundleError, match=r"LATEST: names v000009, which is missing"):
        open_bundle(out)


# ------------------------------------------------------------------------------------------------ G15


def test_g15_items_without_an_item_id_column_is_a_bundle_error_naming_the_file(tmp_path, catalog):
    _, published = publish_catalog(catalog, tmp_path / "out")
    items = published.path / "items.parquet"
    ids = pq.read_table(items).column("item_id")
    pq.write_table(pa.table({"id": ids}), items)
    relist(published.path, "items.parquet")
    with pytest.raises(BundleError, match=r"items\.parquet: no 'item_id' column"):
        verify_bundle(published.path)
    with pytest.raises(BundleError, match=r"items\.parquet: no 'item_id' column"):
        open_bundle(published.path).items()


# ------------------------------------------------------------------------------------------------ G16


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


def test_g16_verify_reads_only_the_head_of_a_large_kernel_file(tmp_path, catalog):
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


def test_g16_verify_refuses_an_oversized_kernel_file_naming_it(tmp_path, catalog):
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
def test_g16_verify_checks_the_kernel_kind_and_arch_from_the_head(tmp_path, catalog, name, head, message):
    _, published = publish_catalog(catalog, tmp_path / "out")
    path = _sparse_kernel(published.path, name, head, 4096 if name.endswith(".cubin") else len(head))
    with pytest.raises(BundleError, match=rf"{path}: .*{message}"):
        verify_bundle(published.path)


def test_g16_the_serving_loader_refuses_an_oversized_kernel_before_reading_it(tmp_path, catalog, monkeypatch):
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
