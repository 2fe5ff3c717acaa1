"""deploy/prometheus: the alerting rules and their unit tests pass promtool; every alert is tested firing
and quiet, keeps the `job` label and says what to do; each alert fires on the metrics file a real failing
`zerogr rebuild` writes (and a real successful run fires nothing until it goes stale); the Grafana
dashboard's queries parse and name only metrics that zerogr writes, the rules record, or the contract
below promises.

promtool comes from Debian's `prometheus` package (.ci/run installs it); without it these tests skip.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from .cli_runs import REPO, TUNE_ARGS, zerogr_command

RULES_DIR = REPO / "deploy" / "prometheus"
RULES = RULES_DIR / "zerogr.rules.yml"
RULE_TESTS = RULES_DIR / "zerogr.rules.test.yml"
DASHBOARD = RULES_DIR / "zerogr-dashboard.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not found (apt-get install prometheus; .ci/run installs it)"
)
# Metrics the rules and the dashboard use that a run in this file does not write: the run-state, guard
# and fleet metadata gauges (each one is written by the rebuild, push or pull that has the feature).
CONTRACT = {
    "zerogr_job_running": "1 in the file written at a run's start, 0 at its end",
    "zerogr_job_start_timestamp_seconds": "when the current or last run started",
    "zerogr_bundle_shared_sid_items_ratio": "share of the version's items whose SID is shared",
    "zerogr_rebuild_guard_fired": "1 per catalog guard that fired",
    "zerogr_rebuild_guard_value": "what each catalog guard measured",
    "zerogr_rebuild_guard_threshold": "each catalog guard's threshold",
    "zerogr_fleet_latest_version": "the version the fleet's signed metadata names as LATEST",
    "zerogr_fleet_metadata_expires_timestamp_seconds": "when the fleet's signed timestamp expires",
}
_METRIC = re.compile(r"\bzerogr[_:][A-Za-z0-9_:]*")


def _promtool(*args: str, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def _rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


@needs_promtool
def test_the_rules_pass_promtool_check() -> None:
    done = _promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_the_shipped_unit_tests_pass() -> None:
    done = _promtool("test", "rules", RULE_TESTS.name)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_quiet_with_its_job_label() -> None:
    alerts = {r["alert"]: r for r in _rules() if "alert" in r}
    assert set(alerts) == {"ZerogrRebuildFailed", "ZerogrRebuildRefused", "ZerogrRebuildStale",
                           "ZerogrFleetBehind", "ZerogrFleetMetadataExpiring"}  # fmt: skip
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    cases = [case for test in tests for case in test.get("alert_rule_test", [])]
    for name, rule in alerts.items():
        mine = [case for case in cases if case["alertname"] == name]
        firing = [alert for case in mine for alert in case["exp_alerts"]]
        assert firing, f"{name}: no unit test where it fires"
        assert any(not case["exp_alerts"] for case in mine), f"{name}: no unit test where it stays quiet"
        assert all("job" in alert["exp_labels"] for alert in firing), f"{name}: loses the job label"
        assert len(rule["annotations"]["summary"]) > 80, f"{name}: the summary must say what to do"


# ------------------------------------------------------------------------------ real runs, real files


GATE_MODELS = '''
import pathlib, time
from tests.compare_models import model_fn

def corrupting(bundle, request_ids):
    """A gate model that changes a file of the version it judges (its plan, which the gate does not read):
    the verification after the gate fails."""
    plan = next(bundle.path.glob("plans/*.json"))
    plan.write_bytes(plan.read_bytes() + b" ")
    return model_fn(bundle, request_ids)

def slow(bundle, request_ids):
    pathlib.Path("gate-started").touch(); time.sleep(300)
'''
SIZES = ("--codebook-sizes", "16,16,16")
TUNE = ("--device", "cpu", "--tune-args", TUNE_ARGS)


def gate(model: str) -> tuple[str, ...]:
    return ("--model-version", "m1", "--gate-model-fn", model, "--gate-requests", "requests.parquet",
            "--min-overlap", "0", "--gate-args", "--k 1,2 --batch-size 4")  # fmt: skip


@dataclass(frozen=True)
class RealRun:
    """One real `zerogr rebuild catalog.parquet --out bundles ARGS --metrics-file rebuild.prom` and the
    alerts its metrics file fires: {promtool eval time after the file was written: alert names}.

    stop_with: a signal sent once the gate has started (the `slow` gate model); file_size_limit: the
    process's RLIMIT_FSIZE in bytes (a write past it fails with EFBIG, as on a full disk: the catalog is
    then big enough for its items file to pass the limit while the metrics file stays under it)."""

    id: str
    args: tuple[str, ...]
    exit_code: int
    firing: dict[str, frozenset[str]]
    stop_with: int | None = None
    file_size_limit: int | None = None
    before: tuple[tuple[str, ...], ...] = field(default=())  # rebuild ARGS run first, e.g. a good version
    items: int = 600  # catalog rows


FAILED = frozenset({"ZerogrRebuildFailed"})
QUIET: frozenset[str] = frozenset()
RUNS = (
    RealRun("exit-0-gated", (*SIZES, *TUNE, *gate("tests.compare_models:model_fn")), 0,
            {"5m": QUIET, "7h": frozenset({"ZerogrRebuildStale"})}),
    RealRun("exit-2-no-codebook-sizes", ("--device", "cpu"), 2, {"5m": FAILED, "7h": FAILED}),
    RealRun("exit-3-file-too-large", (*SIZES, *TUNE), 3, {"5m": FAILED}, file_size_limit=16384, items=8000),
    RealRun("exit-4-verify-failed", (*SIZES, *TUNE, *gate("gate_models:corrupting")), 4, {"5m": FAILED}),
    RealRun("exit-143-sigterm", (*SIZES, *TUNE, *gate("gate_models:slow")), 143, {"5m": FAILED},
            stop_with=signal.SIGTERM),
)  # fmt: skip


def run_real(case: RealRun, work: Path) -> Path:
    """Run the case's rebuild in `work` (a catalog, requests and the gate models beside it); returns its
    metrics file."""
    rng = np.random.default_rng(0)
    sids = rng.integers(0, 16, (case.items, 3)).tolist()
    items = np.arange(case.items, dtype=np.int64)
    pq.write_table(pa.table({"item_id": items, "sid": sids}), work / "catalog.parquet")
    pq.write_table(pa.table({"request_id": list(range(8))}), work / "requests.parquet")
    (work / "gate_models.py").write_text(GATE_MODELS)
    env = {**os.environ, "PYTHONPATH": f"{work}:{REPO}"}
    prom = work / "rebuild.prom"

    def start(args: tuple[str, ...], limit: int | None) -> subprocess.Popen:
        def limit_file_size() -> None:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        argv = [*zerogr_command(), "rebuild", "catalog.parquet", "--out", "bundles", *args]
        argv += ["--metrics-file", prom]
        return subprocess.Popen(
            [str(a) for a in argv], cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, preexec_fn=limit_file_size,
        )  # fmt: skip

    for args in case.before:
        assert start(args, None).wait(timeout=600) == 0
    proc = start(case.args, case.file_size_limit)
    if case.stop_with is not None:
        deadline = time.monotonic() + 300
        while not (work / "gate-started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(case.stop_with)
    _, stderr = proc.communicate(timeout=600)
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    assert code == case.exit_code, stderr
    return prom


def promtool_series(prom: Path, instance: str) -> list[dict]:
    """The metrics file as node_exporter serves it (its labels plus `instance`), in promtool's
    input_series format, constant for 8 hours at 1-minute steps. promtool's clock starts at 0: every
    *_timestamp_seconds value is shifted by the file's write time, so "written now" is time 0."""
    from prometheus_client.parser import text_string_to_metric_families

    written = prom.stat().st_mtime
    series = []
    for family in text_string_to_metric_families(prom.read_text()):
        for sample in family.samples:
            labels = {**sample.labels, "instance": instance}
            value = sample.value - written if sample.name.endswith("_timestamp_seconds") else sample.value
            inner = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(labels.items()))
            series.append({"series": f"{sample.name}{{{inner}}}", "values": f"{value!r}x480"})
    return series


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    """run_real(case) once per case in this module: its metrics file."""
    done: dict[str, Path] = {}

    def get(case: RealRun) -> Path:
        if case.id not in done:
            done[case.id] = run_real(case, tmp_path_factory.mktemp(case.id))
        return done[case.id]

    return get


@needs_promtool
@pytest.mark.xdist_group("zerogr-real-runs")
@pytest.mark.parametrize("case", RUNS, ids=[case.id for case in RUNS])
def test_each_alert_fires_on_the_metrics_a_real_run_writes(case: RealRun, real_runs, tmp_path: Path) -> None:
    """The run's real metrics file as promtool input: exactly the expected alerts fire (the ALERTS
    series), each with the job label; promtool prints what did fire when it differs."""
    prom = real_runs(case)
    firing_query = 'count by (alertname, job) (ALERTS{alertstate="firing"})'

    def firing(names: frozenset[str]) -> list[dict]:
        return [{"labels": f'{{alertname="{name}",job="rebuild"}}', "value": 1} for name in sorted(names)]

    unit_test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": promtool_series(prom, "buildbox:9100"),
                "promql_expr_test": [
                    {
                        "expr": firing_query,
                        "eval_time": at,
                        "exp_samples": firing(names),
                    }
                    for at, names in case.firing.items()
                ],
            }
        ],
    }
    test_file = tmp_path / "real-run.test.yml"
    test_file.write_text(yaml.safe_dump(unit_test, sort_keys=False))
    done = _promtool("test", "rules", str(test_file), cwd=tmp_path)
    assert done.returncode == 0, f"{prom.read_text()}\n{done.stdout}{done.stderr}"


# ------------------------------------------------------------------------------------ the dashboard


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_the_dashboard_shows_what_an_operator_watches() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] == "zerogr"
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "instance"}
    text = " ".join(_dashboard_queries())
    shown = ("zerogr_bundle_items", "zerogr_bundle_distinct_sids", "zerogr_bundle_shared_sid_items_ratio",
             "zerogr_bundle_version", "zerogr_job_stage_duration_seconds",
             "zerogr_rebuild_gate_worst_overlap", "zerogr_follower_live_version",
             "zerogr:fleet_latest_version:newest")  # fmt: skip
    for metric in shown:
        assert metric in text, f"the dashboard does not show {metric}"
    for panel in dashboard["panels"]:
        assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]


@needs_promtool
def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    """Each query, with the dashboard variables filled in, checked by promtool as a recording rule."""
    rules = [{"record": f"dashboard:query_{i}", "expr": expr.replace("$instance", ".*")}
             for i, expr in enumerate(_dashboard_queries())]  # fmt: skip
    (tmp_path / "queries.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = _promtool("check", "rules", str(tmp_path / "queries.yml"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.xdist_group("zerogr-real-runs")
def test_every_metric_the_rules_and_the_dashboard_name_exists(real_runs) -> None:
    """Each zerogr metric a rule or a dashboard query names is written by a real run (a gated success, a
    failure), exported by a real follower, recorded by the rules, or listed in CONTRACT."""
    import torch
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    import zerogr_build as zg

    def names(text: str) -> set[str]:
        return {s.name for family in text_string_to_metric_families(text) for s in family.samples}

    success = real_runs(RUNS[0])
    written = names(success.read_text()) | names(real_runs(RUNS[1]).read_text())
    registry = CollectorRegistry()
    weights = [torch.randn(16, 4) for _ in range(3)]
    with zg.follow(success.parent / "bundles", weights, device="cpu", plan=None, registry=registry):
        written |= names(generate_latest(registry).decode())
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    named = set(_METRIC.findall(RULES.read_text())) | set(_METRIC.findall(" ".join(_dashboard_queries())))
    assert "zerogr_rebuild_gate_worst_overlap" in written and "zerogr_follower_live_version" in written
    unknown = named - written - recorded - set(CONTRACT)
    assert not unknown, f"named by the rules or the dashboard, written by nothing: {sorted(unknown)}"
