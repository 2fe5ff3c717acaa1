"""`zerogr tune` on the command line (CPU): JSON output, exit codes, the bundle still verifies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from typer.testing import CliRunner

from zerogr_build.base.errors import InputError
from zerogr_build.bundle import publish_bundle, verify_bundle
from zerogr_build.cli import app
from zerogr_build.config import TuneSettings, load_tune_settings
from zerogr_build.index import build_index


def _bundle(tmp_path):
    rng = np.random.default_rng(9)
    sids = rng.integers(0, 32, (1500, 3))
    return publish_bundle(build_index(sids, (32, 32, 32)), pa.array(np.arange(1500)), tmp_path / "out")


def test_tune_cli_json_writes_a_plan_into_the_latest_bundle(tmp_path):
    published = _bundle(tmp_path)
    args = ["tune", str(tmp_path / "out"), "--device", "cpu", "--batch-sizes", "1,3", "--beam-width", "4"]
    result = CliRunner().invoke(app, [*args, "--hidden-dim", "8", "--warmup", "0", "--iters", "2", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    plan = json.loads(Path(summary["plan"]).read_text())
    assert summary["plan"].startswith(str(published.path.resolve()))
    assert len(plan["entries"]) == 3 * 2 and summary["entries"] == plan["entries"]
    assert verify_bundle(published.path)["ok"]


def test_tune_cli_usage_errors_exit_2(tmp_path):
    _bundle(tmp_path)
    out = str(tmp_path / "out")
    runner = CliRunner()
    assert runner.invoke(app, ["tune", out]).exit_code == 2  # neither --gpu nor --device
    assert runner.invoke(app, ["tune", out, "--device", "cpu", "--batch-sizes", "0"]).exit_code == 2
    assert runner.invoke(app, ["tune", out, "--device", "cpu", "--dtypes", "fp8"]).exit_code == 2
    assert runner.invoke(app, ["tune", str(tmp_path / "nope"), "--device", "cpu"]).exit_code == 2
    if not torch.cuda.is_available():
        assert runner.invoke(app, ["tune", out, "--gpu", "0"]).exit_code == 2


def test_tune_settings_from_config_and_overrides(tmp_path):
    root = Path(__file__).resolve().parent.parent
    settings, device = load_tune_settings(root / "zerogr_build" / "configs" / "default.toml")
    assert settings == TuneSettings() and device is None  # the shipped file states the defaults
    cfg = tmp_path / "z.toml"
    cfg.write_text('[tune]\ndevice = "cpu"\nbatch_sizes = "2,4"\ndtypes = ["bf16"]\niters = 5\n')
    settings, device = load_tune_settings(cfg, {"iters": 7, "warmup": None})
    assert device == "cpu" and settings.batch_sizes == (2, 4) and settings.dtypes == ("bf16",)
    assert settings.iters == 7 and settings.warmup == TuneSettings().warmup
    for bad in ("[tune]\nbogus = 1\n", '[tune]\niters = "x"\n', "[tune]\nbatch_sizes = [0]\n"):
        cfg.write_text(bad)
        with pytest.raises(InputError, match="z.toml"):
            load_tune_settings(cfg)


def test_tune_cli_takes_the_device_from_the_config(tmp_path):
    published = _bundle(tmp_path)
    cfg = tmp_path / "z.toml"
    cfg.write_text(
        '[tune]\ndevice = "cpu"\nbatch_sizes = [2]\nbeam_width = 2\nhidden_dim = 8\niters = 1\nwarmup = 0\n'
    )
    result = CliRunner().invoke(app, ["tune", str(published.path), "--config", str(cfg), "--quiet"])
    assert result.exit_code == 0, result.output
    assert Path(result.stdout.strip().splitlines()[-1]).is_file()
