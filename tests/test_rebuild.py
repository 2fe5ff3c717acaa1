"""`zerogr rebuild` beyond the happy path: the gate with a module:function model, --push to a local S3
server (pushed on 0, 5 and 10; exit 12 when the push fails), set-up errors (exit 2, nothing built), no
orphan versions after a failed run, SIGTERM, usage errors and crashes in the metrics file, and
scripts/rebuild.sh when no zerogr can be run (exit 2 with a metrics file, under cron's environment)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zerogr_build.bundle import open_bundle
from zerogr_build.bundle.quality import find_quality
from zerogr_build.rebuild import PushSpec
from zerogr_build.rebuild.push import retry_push

from .cli_runs import REBUILD_SH, REPO, TUNE_ARGS, invoke, run_rebuild, zerogr_command
from .test_cli_metrics import metrics, value

SIZES = ("--codebook-sizes", "16,16,16")


@pytest.fixture
def catalog(tmp_path):
    rng = np.random.default_rng(0)
    sids = rng.integers(0, 16, (600, 3)).tolist()
    path = tmp_path / "catalog.parquet"
    pq.write_table(pa.table({"item_id": np.arange(600, dtype=np.int64), "sid": sids}), path)
    return path


@pytest.fixture
def requests_file(tmp_path):
    path = tmp_path / "requests.parquet"
    pq.write_table(pa.table({"request_id": list(range(8))}), path)
    return path


def _args(catalog, out, *extra):
    return [catalog, "--out", out, *SIZES, "--device", "cpu", "--tune-args", TUNE_ARGS, *extra]


def _failure(prom: Path) -> dict:
    (labels,) = [dict(k[1:]) for k in metrics(prom) if k[0] == "zerogr_job_failure_info"]
    return labels


def test_gate_with_a_model_function_records_the_decision(catalog, requests_file, tmp_path):
    out = tmp_path / "bundles"
    gate = ["--gate-model-fn", "tests.compare_models:model_fn", "--gate-requests", requests_file]
    gate += ["--min-overlap", "0", "--gate-args", "--k 1,2 --batch-size 4"]
    done = run_rebuild(*_args(catalog, out, "--model-version", "m1", *gate), cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{(out / 'v000001').resolve()}\n"
    record = find_quality(open_bundle(out), "m1")
    assert record.passed and record.order == "filter_first" and set(record.overlap) == {1, 2}

    strict = [*gate[:4], "--min-overlap", "1.0", "--gate-args", "--k 1,2 --model-tag m2 --beam-width 2"]
    failed = run_rebuild(*_args(catalog, out, *strict), cwd=REPO)
    if failed.returncode == 0:  # a perfect overlap at beam 2 is possible; the record is what matters
        assert find_quality(open_bundle(out), "m2").passed
    else:
        assert failed.returncode == 10, failed.stderr
        assert failed.stdout == f"{(out / 'v000002').resolve()}\n"
        assert find_quality(open_bundle(out), "m2").order == "score_first"
    assert (out / "LATEST").read_text() == "v000002\n"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ("--gate-model-fn", "no_such_module_zg:fn", "--gate-requests", "{requests}"),
            "cannot import module",
        ),
        (("--gate-model-fn", "tests.compare_models:model_fn", "--gate-requests", "{requests}"), "model tag"),
        (("--gate-requests", "{requests}"), "exactly one of --gate-model DIR and --gate-model-fn"),
        (("--push", "http://bucket/x"), "not an s3:// URL"),
        (("--push-keep", "2"), "--push-keep needs --push"),
        (("--gate-args", "--device cpu", "--gate-requests", "{requests}"), "--gate-args takes only"),
        (("--tune-args", "--gpu 0"), "--tune-args takes only"),
        (("--json",), "rebuild decides --json itself"),
        (("--bogus",), "No such option: --bogus"),
    ],
)
def test_set_up_errors_exit_2_before_anything_is_built(catalog, requests_file, tmp_path, extra, message):
    out, prom = tmp_path / "bundles", tmp_path / "m.prom"
    extra = [str(a).format(requests=requests_file) for a in extra]
    done = invoke("rebuild", *_args(catalog, out), *extra, "--metrics-file", prom)
    assert done.exit_code == 2, done.output
    assert message in done.stderr and done.stdout == ""
    assert not out.exists() or not list(out.glob("v*"))
    assert value(metrics(prom), "job_exit_status", "rebuild") == 2
    assert _failure(prom)["stage"] in ("usage", "setup")


def test_a_click_usage_error_still_writes_the_metrics_file(catalog, tmp_path):
    prom = tmp_path / "m.prom"
    done = invoke("rebuild", catalog, "--push-keep", "many", "--metrics-file", prom)
    assert done.exit_code == 2
    assert value(metrics(prom), "job_exit_status", "rebuild") == 2
    assert _failure(prom)["stage"] == "usage" and "--push-keep" in _failure(prom)["reason"]


def test_missing_codebook_sizes_is_a_set_up_error(catalog, tmp_path):
    done = invoke("rebuild", catalog, "--out", tmp_path / "b", "--device", "cpu")
    assert done.exit_code == 2 and "codebook sizes not given" in done.stderr
    assert not (tmp_path / "b").exists() or not list((tmp_path / "b").glob("v*"))


def test_push_publishes_what_was_promoted_and_a_failed_push_exits_12(catalog, tmp_path, s3_bucket):
    out, prom = tmp_path / "bundles", tmp_path / "m.prom"
    url = f"s3://{s3_bucket}/fleet"
    done = run_rebuild(
        *_args(catalog, out, "--push", url, "--push-keep", "3", "--metrics-file", prom), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{(out / 'v000001').resolve()}\n"
    assert value(metrics(prom), "job_stage_duration_seconds", "rebuild", stage="push") > 0
    import boto3

    s3 = boto3.client("s3")
    assert s3.get_object(Bucket=s3_bucket, Key="fleet/LATEST")["Body"].read() == b"v000001\n"

    untuned = run_rebuild(
        catalog, "--out", out, *SIZES, "--device", "cpu", "--tune-args", "--iters 0", "--push", url,
        "--force", cwd=tmp_path,
    )  # fmt: skip
    assert untuned.returncode == 5, untuned.stderr  # promoted without a plan: pushed all the same
    assert s3.get_object(Bucket=s3_bucket, Key="fleet/LATEST")["Body"].read() == b"v000002\n"

    # A push that fails after promote: the remote LATEST names a signed version, this run pushes unsigned.
    s3.put_object(Bucket=s3_bucket, Key="signed/v000009/manifest.json.sig", Body=b"{}")
    s3.put_object(Bucket=s3_bucket, Key="signed/LATEST", Body=b"v000009\n")
    refused = run_rebuild(
        *_args(catalog, out, "--push", f"s3://{s3_bucket}/signed", "--metrics-file", prom, "--force"),
        cwd=tmp_path,
    )
    assert refused.returncode == 12, refused.stderr
    assert refused.stdout == f"{(out / 'v000003').resolve()}\n"  # promoted here: printed
    assert (out / "LATEST").read_text() == "v000003\n"
    assert value(metrics(prom), "job_exit_status", "rebuild") == 12 and _failure(prom)["stage"] == "push"
    assert "retry: zerogr push" in refused.stderr

    # The store fixed, the next run's inputs unchanged: no new version, and LATEST, whose push failed, is
    # pushed (once: the run after finds it there).
    for key in ("signed/v000009/manifest.json.sig", "signed/LATEST"):
        s3.delete_object(Bucket=s3_bucket, Key=key)
    for run in range(2):
        again = invoke("rebuild", *_args(catalog, out, "--push", f"s3://{s3_bucket}/signed"))
        assert again.exit_code == 0 and again.stdout == f"{(out / 'v000003').resolve()}\n", again.stderr
        assert ("LATEST v000003 is not on" in again.stderr) == (run == 0), again.stderr
        assert s3.get_object(Bucket=s3_bucket, Key="signed/LATEST")["Body"].read() == b"v000003\n"
    # A fleet rolled back from a version it holds stays rolled back.
    assert invoke("rebuild", *_args(catalog, out, "--push", url)).exit_code == 0
    assert s3.get_object(Bucket=s3_bucket, Key="fleet/LATEST")["Body"].read() == b"v000003\n"
    rollback = invoke("promote", f"{url}/v000002", "--allow-unsigned")
    assert rollback.exit_code == 0, rollback.output
    kept = invoke("rebuild", *_args(catalog, out, "--push", url))
    assert kept.exit_code == 0 and "is not on" not in kept.stderr, kept.stderr
    assert s3.get_object(Bucket=s3_bucket, Key="fleet/LATEST")["Body"].read() == b"v000002\n"


def test_push_signing_key_signs_the_pushed_version_and_a_bad_key_is_a_set_up_error(
    catalog, tmp_path, s3_bucket
):
    import json

    from zerogr_build.fleet.keys import load_signing_key, new_key

    out, url = tmp_path / "bundles", f"s3://{s3_bucket}/fleet"
    key = Path(new_key(tmp_path / "keys" / "build-box").private_path)
    os.chmod(key, 0o640)
    unsafe = invoke("rebuild", *_args(catalog, out, "--push", url, "--push-signing-key", key))
    assert unsafe.exit_code == 2 and "chmod 600" in unsafe.stderr
    assert not out.exists() or not list(out.glob("v*"))  # refused before the build
    os.chmod(key, 0o600)
    done = invoke("rebuild", *_args(catalog, out, "--push", url, "--push-signing-key", key))
    assert done.exit_code == 0, done.stderr
    assert f"signed by {load_signing_key(key).key_id}" in done.stderr
    import boto3

    timestamp = boto3.client("s3").get_object(Bucket=s3_bucket, Key="fleet/tuf/timestamp.json")
    assert json.loads(timestamp["Body"].read())["signed"]["_type"] == "timestamp"  # the fleet's metadata
    host = tmp_path / "host"
    pulled = invoke("pull", url, host, "--trusted-keys", f"{key}.pub")
    assert pulled.exit_code == 0, pulled.stderr
    # A failed push says how to retry it as it was meant: signed with the same key.
    retry = retry_push(PushSpec(url, 3, str(key)), out / "v000002")
    assert retry == f"zerogr push {out / 'v000002'} {url} --keep 3 --signing-key {key}"


def test_a_full_disk_at_promote_is_exit_8_and_removes_the_unpromoted_version(catalog, tmp_path, monkeypatch):
    import zerogr_build.bundle as bundle_pkg

    out, prom = tmp_path / "bundles", tmp_path / "m.prom"
    assert invoke("rebuild", *_args(catalog, out)).exit_code == 0

    def failing_promote(version_dir):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bundle_pkg, "promote_bundle", failing_promote)
    monkeypatch.setattr("zerogr_build.rebuild.run.promote_bundle", failing_promote)
    done = invoke("rebuild", *_args(catalog, out, "--metrics-file", prom, "--force"))
    assert done.exit_code == 8 and done.stdout == "", done.stderr  # a full disk: named, exit 8
    assert "removed the unpromoted version v000002" in done.stderr
    assert (
        sorted(p.name for p in out.glob("v*")) == ["v000001"] and (out / "LATEST").read_text() == "v000001\n"
    )
    failure = _failure(prom)
    assert failure["stage"] == "promote" and "disk full writing" in failure["reason"]
    assert "No space left on device" in failure["reason"] and "retrying alone" in failure["reason"]


def test_a_crash_outside_the_stages_is_exit_1_and_named_in_the_metrics(catalog, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr("zerogr_build.rebuild.run.previous_version", broken)
    prom = tmp_path / "m.prom"
    done = invoke("rebuild", *_args(catalog, tmp_path / "b", "--metrics-file", prom))
    assert done.exit_code == 1 and "RuntimeError: a bug" in done.stderr
    assert value(metrics(prom), "job_exit_status", "rebuild") == 1
    assert _failure(prom) == {"job": "rebuild", "stage": "crash", "reason": "RuntimeError: a bug"}


def test_a_crash_after_the_build_is_exit_1_named_crash_and_leaves_no_version(catalog, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug after the build")

    monkeypatch.setattr("zerogr_build.rebuild.run.tune_stage", broken)
    out, prom = tmp_path / "b", tmp_path / "m.prom"
    done = invoke("rebuild", *_args(catalog, out, "--metrics-file", prom))
    assert done.exit_code == 1 and "RuntimeError: a bug after the build" in done.stderr
    assert value(metrics(prom), "job_exit_status", "rebuild") == 1
    assert _failure(prom) == {
        "job": "rebuild",
        "stage": "crash",
        "reason": "RuntimeError: a bug after the build",
    }
    assert not list(out.glob("v*"))  # the unpromoted version it built is removed


SLOW_MODEL = """
import pathlib, time
from tests.compare_models import model_fn

def slow(bundle, request_ids):
    pathlib.Path("gate-started").write_text("1")
    time.sleep(120)
    return model_fn(bundle, request_ids)
"""


def test_sigterm_writes_metrics_with_status_143_and_removes_the_unpromoted_version(
    catalog, requests_file, tmp_path
):
    """A rebuild killed by SIGTERM (cron's `timeout`, systemd) during the gate: exit 143, the metrics
    file says 143 and names the signal, and the version it built is gone (LATEST never named it)."""
    (tmp_path / "slow_gate_model.py").write_text(SLOW_MODEL)
    out, prom = tmp_path / "bundles", tmp_path / "m.prom"
    args = _args(catalog, out, "--model-version", "m", "--gate-model-fn", "slow_gate_model:slow")
    args += ["--gate-requests", requests_file, "--metrics-file", prom]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    proc = subprocess.Popen(
        [*zerogr_command(), "rebuild", *map(str, args)], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not (tmp_path / "gate-started").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert stdout == "" and "terminated by SIGTERM" in stderr
    assert value(metrics(prom), "job_exit_status", "rebuild") == 143
    assert _failure(prom)["stage"] == "signal" and "SIGTERM" in _failure(prom)["reason"]
    assert value(metrics(prom), "job_stage_duration_seconds", "rebuild", stage="build") > 0
    assert not list(out.glob("v*")) and not (out / "LATEST").exists()  # no orphan


def test_rebuild_sh_runs_zerogr_rebuild(catalog, tmp_path):
    out = tmp_path / "bundles"
    env = {**os.environ, "ZEROGR": " ".join(zerogr_command())}
    done = subprocess.run(
        ["bash", str(REBUILD_SH), *map(str, _args(catalog, out))], env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{(out / 'v000001').resolve()}\n"


def test_rebuild_sh_without_a_zerogr_exits_2_with_a_metrics_file_under_cron_env(catalog, tmp_path):
    """Under cron's environment (no venv on PATH, no python): exit 2 and a metrics file naming it."""
    prom = tmp_path / "textfile" / "rebuild.prom"
    prom.parent.mkdir()
    prom.write_text('zerogr_job_last_success_timestamp_seconds{job="rebuild"} 1234.0\n')
    script = tmp_path / "checkout" / "scripts" / "rebuild.sh"  # a checkout without a .venv
    script.parent.mkdir(parents=True)
    script.write_text(REBUILD_SH.read_text())
    done = subprocess.run(
        ["env", "-i", "PATH=/usr/bin:/bin", f"HOME={tmp_path}", "bash", str(script), str(catalog), "--out",
         str(tmp_path / "b"), *SIZES, "--metrics-file", str(prom)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "zerogr cannot be run" in done.stderr
    assert value(metrics(prom), "job_exit_status", "rebuild") == 2
    assert value(metrics(prom), "job_last_success_timestamp_seconds", "rebuild") == 1234.0
    failure = _failure(prom)
    assert failure["stage"] == "setup" and "zerogr cannot be run as" in failure["reason"]
    assert not list(prom.parent.glob(".zerogr-metrics.*"))
