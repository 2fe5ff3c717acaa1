"""Installing zerogr on a box without a checkout, as the docs say: build the wheel with the documented
command in a copy of the project files, install it with the documented command into a fresh venv, and the
venv's own `zerogr` console script runs --help, `config --show-defaults`, `demo-catalog`, a build, a
verify and a rebuild, in a directory with no checkout in sight. No doc tells a user to install zerogr from
a package index (none serves it).

The install resolves the wheel's dependencies (numpy, torch, boto3, ...) against this test run's
environment, reached through a .pth file in the new venv, so nothing is downloaded and the checkout is
never on the path."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TUNE_ARGS = "--batch-sizes 2 --beam-width 4 --warmup 0 --iters 1 --hidden-dim 8"
# The documented commands (docs/operations.md, "Install from a wheel"; README.md), run verbatim.
WHEEL_BUILD = "python -m pip wheel --no-deps -w dist ."
WHEEL_INSTALL = "pip install 'dist/zerogr-<version>-py3-none-any.whl[s3]'"
_INDEX_INSTALL = re.compile(r"pip install +['\"]?zerogr\[")


def _run(argv: list, cwd: Path, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def _version() -> str:
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_the_docs_install_from_the_wheel_never_from_an_index() -> None:
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    hits = [f"{d.name}:{n}" for d in docs for n, line in enumerate(d.read_text().splitlines(), 1)
            if _INDEX_INSTALL.search(line)]  # fmt: skip
    assert not hits, f"pip install of zerogr from an index: {hits}"
    for doc in (REPO / "README.md", REPO / "docs" / "operations.md"):
        text = " ".join(doc.read_text().split())
        assert WHEEL_BUILD in text and WHEEL_INSTALL in text, doc.name


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """A copy of pyproject.toml, README.md and zerogr_build/ with the wheel built in dist/ by the documented
    command (the checkout stays untouched: no build/ or egg-info in it)."""
    src = tmp_path_factory.mktemp("src")
    shutil.copy(REPO / "pyproject.toml", src)
    shutil.copy(REPO / "README.md", src)
    shutil.copytree(REPO / "zerogr_build", src / "zerogr_build", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    _run(["bash", "-c", WHEEL_BUILD], cwd=src, env=env)
    return src


@pytest.fixture(scope="module")
def wheel(src) -> Path:
    (built,) = (src / "dist").glob("zerogr-*.whl")
    assert built.name == f"zerogr-{_version()}-py3-none-any.whl"
    return built


def test_the_wheel_holds_the_package_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "zerogr_build/configs/default.toml" in names
    assert any(n.startswith("zerogr_build/cuda/") and n.endswith(".cu") for n in names)
    assert not any(n.startswith(("tests/", "scripts/", "benchmarks/")) for n in names)


def test_a_wheel_install_runs_help_build_verify_and_rebuild(src: Path, wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path, env=os.environ.copy())
    py = venv / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path,
                     os.environ.copy()).stdout.strip())  # fmt: skip
    # The dependencies (numpy, torch, boto3, ...) from this test run's environment, after the venv's own.
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zzz_test_dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")
    activated = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}
    _run(["bash", "-c", WHEEL_INSTALL.replace("<version>", _version())], cwd=src, env=activated)
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
