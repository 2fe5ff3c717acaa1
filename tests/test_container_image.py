"""The container image (deploy/container/Containerfile), built by the documented script with podman and
smoke-tested inside: `zerogr --version`, a demo catalog's build and `zerogr verify` as the image's non-root
user, and no CUDA torch or nvidia-* package in it.

The build takes minutes: about 10 on the 2-core reference machine under load, with the Debian base made
(debootstrap, 1 to 4 minutes, once) and the wheelhouse filled (under ~/.cache/zerogr, once). So it is marked
`slow` and `image`, and .ci/run runs it on its own after the main suite
(`python -m pytest --run-slow -m image tests/test_container_image.py`). It is skipped, saying why, where
podman is missing (.ci/run installs podman and debootstrap), or where the base image would have to be made
without root or debootstrap.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "build_image.sh"
DEFAULT_BASE = "localhost/zerogr-base:bookworm"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _script(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--variant", "tpu"], "--variant must be cpu or gpu, got tpu"),
        (["--python", "three"], "--python must look like 3.11"),
        (["--colour"], "unknown option --colour"),
        (["--tag"], "--tag needs a value"),
    ],
)
def test_the_script_refuses_bad_options_with_exit_2(args: list[str], says: str) -> None:
    done = _script(*args)
    assert done.returncode == 2 and says in done.stderr, done.stderr


def test_the_script_names_its_default_tag_from_pyproject() -> None:
    done = _script("--help")
    assert done.returncode == 0 and f"(default: zerogr:{VERSION};" in done.stdout


def _cannot_build() -> str | None:
    """Why the image cannot be built here, or None."""
    if shutil.which("podman") is None:
        return "podman is not installed (.ci/run installs it): the container image is not built"
    has_base = (
        subprocess.run(["podman", "image", "exists", DEFAULT_BASE], capture_output=True).returncode == 0
    )
    if not has_base and (os.geteuid() != 0 or shutil.which("debootstrap") is None):
        return f"{DEFAULT_BASE} is missing and making it needs root and debootstrap"
    return None


@pytest.mark.slow
@pytest.mark.image
def test_the_image_builds_runs_as_non_root_and_passes_its_smoke_test() -> None:
    why = _cannot_build()
    if why:
        pytest.skip(why)
    tag = f"localhost/zerogr-test:{os.getpid()}"
    try:
        done = _script("--tag", tag, "--smoke", timeout=1800)
        assert done.returncode == 0, done.stderr[-6000:]
        assert done.stdout == f"{tag}\n"
        assert f"smoke test passed: zerogr {VERSION} as zerogr, torch 2.13.0+cpu" in done.stderr
        (inspected,) = json.loads(
            subprocess.run(
                ["podman", "image", "inspect", tag], capture_output=True, text=True, check=True
            ).stdout
        )
        config = inspected["Config"]
        assert config["User"] == "10001:10001"
        assert any(e.startswith("PATH=/opt/zerogr/bin:") for e in config["Env"])
        assert "HOME=/home/zerogr" in config["Env"]
        assert config["Labels"]["org.opencontainers.image.version"] == VERSION
        assert config["Cmd"] == ["zerogr", "--help"]
    finally:
        subprocess.run(["podman", "rmi", "--force", tag], capture_output=True)
