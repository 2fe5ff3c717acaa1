"""Compiled kernels in every bundle: `zerogr build` ships a cubin per configured arch plus
PTX, listed with checksums in the manifest, compiled through a cache keyed by (source hash, nvcc version,
arch); without nvcc it says so in one line and carries on; `verify` checks the files."""

from __future__ import annotations

import json
import os
import shutil
import stat
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from zerogr_build.base.errors import BundleError, InputError
from zerogr_build.bundle import open_bundle, verify_bundle
from zerogr_build.cli import app
from zerogr_build.config import BuildSettings, load_settings
from zerogr_build.cuda import cache as kc
from zerogr_build.cuda import nvcc as kn
from zerogr_build.pipeline import KernelCompileWarning, KernelsSkippedWarning, build_bundle

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile kernels to ship")
ALL_FILES = [f"kernels/{a}/selective.{k}" for a in ("sm_80", "sm_90") for k in ("cubin", "ptx")]


def _catalog(path: Path) -> Path:
    rng = np.random.default_rng(0)
    sids = rng.integers(0, 8, size=(300, 3))
    col = pa.array([list(map(int, r)) for r in sids], type=pa.list_(pa.int32()))
    pq.write_table(pa.table({"item_id": pa.array(np.arange(300), pa.int64()), "sid": col}), path)
    return path


def _build(tmp_path: Path, **kw) -> dict:
    settings = BuildSettings(out=str(tmp_path / "out"), codebook_sizes=(8, 8, 8), **kw)
    return build_bundle(str(_catalog(tmp_path / "cat.parquet")), settings)


@needs_nvcc
def test_build_ships_cubins_and_ptx_listed_and_verified(tmp_path):
    summary = _build(tmp_path)
    bundle = open_bundle(summary["bundle"])
    assert bundle.files("kernels/") == ALL_FILES == summary["kernels"]["files"]
    for name in ALL_FILES:
        entry = bundle.manifest["files"][name]
        assert entry["bytes"] == bundle.file(name).stat().st_size > 1000
    assert bundle.file("kernels/sm_90/selective.cubin").read_bytes()[:4] == b"\x7fELF"
    assert b".target sm_80" in bundle.file("kernels/sm_80/selective.ptx").read_bytes()
    report = verify_bundle(summary["bundle"])
    assert report["kernels"] == ALL_FILES and report["unlisted_files"] == []


@needs_nvcc
def test_flipped_byte_in_a_kernel_file_fails_verify_naming_it(tmp_path):
    summary = _build(tmp_path, kernel_archs=("sm_90",))
    path = Path(summary["bundle"]) / "kernels/sm_90/selective.cubin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    os.chmod(path, stat.S_IWUSR | stat.S_IRUSR)
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"kernels/sm_90/selective\.cubin: sha256 mismatch"):
        verify_bundle(summary["bundle"])


def test_verify_refuses_a_listed_kernel_that_is_not_one(tmp_path):
    from zerogr_build.bundle import add_bundle_files

    summary = _build(tmp_path, kernel_archs=())
    add_bundle_files(summary["bundle"], {"kernels/sm_90/selective.cubin": b"PTX? no: garbage"})
    with pytest.raises(BundleError, match=r"selective\.cubin: not a cubin"):
        verify_bundle(summary["bundle"])
    add_bundle_files(summary["bundle"], {"kernels/sm_90/selective.cubin": b"\x7fELF...."})
    add_bundle_files(summary["bundle"], {"kernels/sm90/selective.ptx": b".target sm_90"})
    with pytest.raises(BundleError, match=r"kernels/sm90/selective\.ptx: a kernel file must be named"):
        verify_bundle(summary["bundle"])


def test_empty_kernel_archs_ship_nothing_and_do_not_warn(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # numba's own first-compile notice depends on which test of this worker built first: not ours.
        warnings.simplefilter("ignore", KernelCompileWarning)
        summary = _build(tmp_path, kernel_archs=())
    assert open_bundle(summary["bundle"]).files("kernels/") == []
    assert summary["kernels"] == {"files": [], "skipped": None}


def test_without_nvcc_the_build_warns_in_one_line_and_publishes(tmp_path, monkeypatch):
    def no_nvcc() -> str:
        raise kn.KernelCompileError("nvcc not found on PATH (install the CUDA toolkit)\nsecond line")

    monkeypatch.setattr(kc, "find_nvcc", no_nvcc)
    with pytest.warns(KernelsSkippedWarning) as record:
        summary = _build(tmp_path)
    assert [str(w.message) for w in record if not issubclass(w.category, KernelCompileWarning)] == [
        "no compiled kernels in this bundle: nvcc not found on PATH (install the CUDA toolkit)"
    ]
    assert open_bundle(summary["bundle"]).files("kernels/") == []
    assert summary["kernels"]["skipped"].startswith("nvcc not found")
    verify_bundle(summary["bundle"])


def _counting_nvcc(tmp_path: Path) -> tuple[str, Path]:
    log = tmp_path / "nvcc.log"
    wrapper = tmp_path / "nvcc"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {NVCC} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper), log


@needs_nvcc
def test_the_cache_runs_nvcc_only_for_a_new_source_or_arch(tmp_path):
    nvcc, log = _counting_nvcc(tmp_path)
    cache = tmp_path / "cache"
    first = kc.cached_kernel_files(["sm_90"], nvcc=nvcc, cache_dir=cache)
    compiles = [line for line in log.read_text().splitlines() if "--version" not in line]
    assert len(compiles) == 2
    assert sorted(first) == ["kernels/sm_90/selective.cubin", "kernels/sm_90/selective.ptx"]
    assert kc.cached_kernel_files(["sm_90"], nvcc=nvcc, cache_dir=cache) == first  # warm: no nvcc
    assert [line for line in log.read_text().splitlines() if "--version" not in line] == compiles
    kc.cached_kernel_files(["sm_80", "sm_90"], nvcc=nvcc, cache_dir=cache)  # only sm_80 is new
    assert len([line for line in log.read_text().splitlines() if "--version" not in line]) == 4
    changed = tmp_path / "src" / "selective.cu"
    changed.parent.mkdir()
    changed.write_text(kn.kernel_sources()[0].read_text() + "\n// changed\n")
    assert kc.cache_key(nvcc, [changed]) != kc.cache_key(nvcc)
    kc.cached_kernel_files(["sm_90"], nvcc=nvcc, cache_dir=cache, sources=[changed])
    assert len([line for line in log.read_text().splitlines() if "--version" not in line]) == 6


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ZEROGR_CACHE_DIR", str(tmp_path / "c"))
    assert kc.kernel_cache_dir() == tmp_path / "c" / "kernels"
    monkeypatch.delenv("ZEROGR_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert kc.kernel_cache_dir() == tmp_path / "x" / "zerogr" / "kernels"


def test_kernel_archs_setting_flag_and_config(tmp_path):
    assert BuildSettings().kernel_archs == ("sm_80", "sm_90")
    assert load_settings(None, {"kernel_archs": "sm_90, sm_80"}).kernel_archs == ("sm_90", "sm_80")
    assert load_settings(None, {"kernel_archs": ""}).kernel_archs == ()
    for bad in ("sm80", "sm_90,sm_90", "compute_90"):
        with pytest.raises(InputError, match="kernel_archs"):
            load_settings(None, {"kernel_archs": bad})
    config = tmp_path / "c.toml"
    config.write_text("[build]\nkernel_archs = []\n")
    assert load_settings(config).kernel_archs == ()


@needs_nvcc
def test_cli_kernel_archs_flag(tmp_path):
    cat = _catalog(tmp_path / "cat.parquet")
    runner = CliRunner()
    res = runner.invoke(
        app,
        ["build", str(cat), "--out", str(tmp_path / "o"), "--codebook-sizes", "8,8,8", "--kernel-archs",
         "sm_90", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    files = json.loads(res.stdout)["kernels"]["files"]
    assert files == ["kernels/sm_90/selective.cubin", "kernels/sm_90/selective.ptx"]
    res = runner.invoke(app, ["build", str(cat), "--out", str(tmp_path / "o"), "--kernel-archs", "sm8"])
    assert res.exit_code == 2 and "kernel_archs" in res.output
