"""Installing zerogr on a box without a checkout, as the docs say: build the wheel with the documented
command in a copy of the project files, install it with the documented commands into a fresh venv, and the
venv's own `zerogr` console script runs --help, `config --show-defaults`, `demo-catalog`, a build, a
verify and a rebuild, in a directory with no checkout in sight. No doc tells a user to install zerogr from
a package index (none serves it).

The install is real: every dependency is installed into the new venv from the configured indexes (pip's
cache makes a second run quick), so the test sees what a CPU box gets: torch's CPU build, no CUDA torch and
no nvidia-* or cuda-* package (the documented install once pulled about 3 GB of them onto a CPU box)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TUNE_ARGS = "--batch-sizes 2 --beam-width 4 --warmup 0 --iters 1 --hidden-dim 8"
_INDEX_INSTALL = re.compile(r"pip install +['\"]?zerogr\[")
_SECTION = "### Install from a wheel"
DOC_VENV = "/srv/zerogr/.venv"
# Packages that only a CUDA build of torch brings (the CUDA runtime, cuDNN, NCCL, ... and triton).
_CUDA_ONLY = re.compile(r"^(nvidia|cuda)[-_]|^triton$", re.IGNORECASE)


def documented_commands() -> list[str]:
    """The `$ ` commands of the first console block of docs/operations.md's "Install from a wheel"."""
    text = (REPO / "docs" / "operations.md").read_text()
    section = text[text.index(_SECTION) :]
    block = re.search(r"^```console\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert block, f"no console block under {_SECTION}"
    return [line[2:] for line in block.group(1).splitlines() if line.startswith("$ ")]


COMMANDS = documented_commands()
WHEEL_BUILD = "python -m pip wheel --no-deps -w dist ."
MAKE_VENV = f"python -m venv {DOC_VENV} && . {DOC_VENV}/bin/activate"


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
    assert COMMANDS[:2] == [WHEEL_BUILD, MAKE_VENV], COMMANDS
    readme = " ".join((REPO / "README.md").read_text().split())
    for command in (WHEEL_BUILD, *COMMANDS[2:]):  # the README shows the same install
        assert command in readme, command


def test_the_documented_install_pins_the_cpu_torch_and_the_report_extra() -> None:
    install = [c for c in COMMANDS if "dist/zerogr-" in c]
    assert len(install) == 1 and "[s3,report]" in install[0], COMMANDS
    constraints = REPO / "deploy" / "constraints-cpu.txt"
    assert f"-c {constraints.relative_to(REPO)}" in install[0]
    pins = [line for line in constraints.read_text().splitlines() if line and not line.startswith("#")]
    assert pins == ["torch==2.13.0+cpu"]
    ci = (REPO / ".ci" / "run").read_text()
    assert "pip install torch==2.13.0 " in ci  # the version the dev set-up runs


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """A copy of pyproject.toml, README.md and zerogr_build/ with the wheel built in dist/ by the documented
    command (the checkout stays untouched: no build/ or egg-info in it)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src)
    (src / "deploy").mkdir()
    shutil.copy(REPO / "deploy" / "constraints-cpu.txt", src / "deploy")
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


def test_the_wheel_carries_the_license(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        dist_info = f"zerogr-{_version()}.dist-info"
        assert zf.read(f"{dist_info}/licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
        metadata = zf.read(f"{dist_info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    license_text = (REPO / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text


def test_a_wheel_install_stays_cpu_and_runs_help_build_verify_and_rebuild(
    src: Path, wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path, env=os.environ.copy())
    py = venv / "bin" / "python"
    outside = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}  # no checkout
    activated = {**outside, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}
    # An index that does not answer (PyTorch's, where only a package mirror is reachable) is skipped at
    # once instead of after pip's retries; whatever it serves must then come from the configured ones.
    activated.update(PIP_RETRIES="0", PIP_DISABLE_PIP_VERSION_CHECK="1")
    for command in COMMANDS[2:]:
        _run(["bash", "-c", command.replace("<version>", _version())], cwd=src, env=activated, timeout=1200)
    listed = json.loads(_run([py, "-m", "pip", "list", "--format", "json"], tmp_path, activated).stdout)
    versions = {p["name"].lower(): p["version"] for p in listed}
    cuda_only = sorted(name for name in versions if _CUDA_ONLY.search(name))
    assert not cuda_only, f"CUDA packages in a CPU install: {cuda_only}"
    assert versions["torch"] == "2.13.0+cpu", versions["torch"]
    assert "matplotlib" in versions and "boto3" in versions  # the report and s3 extras
    probe = "import torch; assert torch.version.cuda is None, torch.version.cuda; print(torch.__file__)"
    assert _run([py, "-c", probe], tmp_path, activated).stdout.startswith(str(venv))
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1"}
    zerogr = venv / "bin" / "zerogr"

    where = _run([py, "-c", "import zerogr_build; print(zerogr_build.__file__)"], work, env).stdout.strip()
    assert where.startswith(str(venv)), where  # the installed wheel, not the checkout
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
