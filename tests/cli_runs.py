"""This checkout's CLI in tests: in process (typer's CliRunner), and `zerogr rebuild` in its own process as
cron runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from zerogr_build.cli import app
from zerogr_build.testing import stderr_lines

REPO = Path(__file__).resolve().parent.parent
REBUILD_SH = REPO / "scripts" / "rebuild.sh"
# Tiny, fast tune settings for rebuild runs (--tune-args).
TUNE_ARGS = "--batch-sizes 2 --beam-width 4 --warmup 0 --iters 1 --hidden-dim 8"

runner = CliRunner()


def invoke(*args):
    """`zerogr ARGS...` in this process; every argument passed as a string."""
    return runner.invoke(app, [str(a) for a in args])


def one_error_line(result, code: int = 2) -> str:
    """The single `error: ...` line of a CLI run that exited `code` (asserts there is exactly one)."""
    assert result.exit_code == code, result.output
    lines = stderr_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def zerogr_command() -> list[str]:
    """This environment's zerogr as a command line (the interpreter running the tests, so a venv's)."""
    return [sys.executable, "-m", "zerogr_build.cli"]


def run_rebuild(
    *args, cwd: Path, env: dict | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """`zerogr rebuild ARGS...` in its own process, stderr not a terminal (as under cron); `env` adds to or
    overrides the environment."""
    return subprocess.run(
        [*zerogr_command(), "rebuild", *map(str, args)],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
