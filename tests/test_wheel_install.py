"""A user who runs `pip install zerogr` (no checkout) has everything the commands point to.

The wheel is built from a copy of the project files, installed (no dependencies: they come from this test
run's environment through a .pth file, never the checkout) into a fresh venv, and that venv's own `zerogr`
console script runs --help, `config --show-defaults`, `demo-catalog`, a build, a verify and a rebuild, in a
directory with no checkout in sight."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TUNE_ARGS = "--batch-sizes 2 --beam-width 4 --warmup 0 --iters 1 --hidden-dim 8"


def _run(argv: list, cwd: Path, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """zerogr's wheel, built from a copy of pyproject.toml, README.md and zerogr_build/ (the checkout stays
    untouched: no build/ or egg-info in it)."""
    src = tmp_path_factory.mktemp("src")
    shutil.copy(REPO / "pyproject.toml", src)
    shutil.copy(REPO / "README.md", src)
    shutil.copytree(REPO / "zerogr_build", src / "zerogr_build", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    # Without build isolation when setuptools is here (fast, offline); else pip fetches it.
    isolation = ["--no-build-isolation"] if _has_setuptools() else []
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", out, src],
        cwd=src,
        env=os.environ.copy(),
    )
    (built,) = out.glob("zerogr-*.whl")
    return built


def _has_setuptools() -> bool:
    import importlib.util

    return importlib.util.find_spec("setuptools") is not None


def test_the_wheel_holds_the_package_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "zerogr_build/configs/default.toml" in names
    assert any(n.startswith("zerogr_build/cuda/") and n.endswith(".cu") for n in names)
    assert not any(n.startswith(("tests/", "scripts/", "benchmarks/")) for n in names)


def test_a_wheel_install_runs_help_build_verify_and_rebuild(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path, env=os.environ.copy())
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "-q", wheel], cwd=tmp_path,
         env=os.environ.copy())  # fmt: skip
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path,
                     os.environ.copy()).stdout.strip())  # fmt: skip
    # The dependencies (numpy, torch, ...) from this test run's environment, after the wheel's own files.
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zzz_test_dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1"}
    zerogr = venv / "bin" / "zerogr"

    where = _run([py, "-c", "import zerogr_build; print(zerogr_build.__file__)"], work, env).stdout.strip()
    assert where.startswith(str(site)), where  # the installed wheel, not the checkout
    assert "rebuild" in _run([zerogr, "--help"], work, env).stdout
    assert "zerogr config --show-defaults" in " ".join(
        _run([zerogr, "build", "--help"], work, env).stdout.split()
    )
    defaults = _run([zerogr, "config", "--show-defaults"], work, env).stdout
    assert "[build]" in defaults and "[tune]" in defaults
    (work / "zerogr.toml").write_text(defaults)
    _run([zerogr, "demo-catalog", "catalog.parquet", "-n", "3000", "-V", "64,64,64"], work, env)
    built = _run(
        [
            zerogr,
            "build",
            "catalog.parquet",
            "--config",
            "zerogr.toml",
            "--codebook-sizes",
            "64,64,64",
            "--quiet",
        ],
        work,
        env,
    ).stdout.strip()
    assert built.endswith("bundles/v000001")
    _run([zerogr, "verify", built, "--catalog", "catalog.parquet"], work, env)
    rebuilt = _run(
        [zerogr, "rebuild", "catalog.parquet", "--codebook-sizes", "64,64,64", "--device", "cpu", "--force",
         "--tune-args", TUNE_ARGS, "--metrics-file", "rebuild.prom"],
        work, env,
    )  # fmt: skip
    assert rebuilt.stdout == f"{(work / 'bundles' / 'v000002').resolve()}\n"
    assert 'zerogr_job_exit_status{job="rebuild"} 0.0' in (work / "rebuild.prom").read_text()
