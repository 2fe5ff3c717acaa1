"""deploy/prometheus: the alerting rules and their unit tests pass promtool; every alert is tested firing
and quiet, keeps the `job` label and says what to do; each alert fires on the metrics file a real failing
`zerogr rebuild` writes (and a real successful run fires nothing until it goes stale); the Grafana
dashboard's queries parse and name only metrics that zerogr writes or the rules record.

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
import uuid
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
                           "ZerogrRebuildStuck", "ZerogrFleetBehind", "ZerogrFleetMetadataExpiring",
                           "ZerogrPullFailed", "ZerogrPullHeld", "ZerogrFollowerCannotLoad"}  # fmt: skip
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    cases = [case for test in tests for case in test.get("alert_rule_test", [])]
    for name, rule in alerts.items():
        mine = [case for case in cases if case["alertname"] == name]
        firing = [alert for case in mine for alert in case["exp_alerts"]]
        assert firing, f"{name}: no unit test where it fires"
        assert any(not case["exp_alerts"] for case in mine), f"{name}: no unit test where it stays quiet"
        assert all("job" in alert["exp_labels"] for alert in firing), f"{name}: loses the job label"
        assert len(rule["annotations"]["summary"]) > 80, f"{name}: the summary must say what to do"


def _anchors(markdown: str) -> set[str]:
    """The ids mkdocs gives the headings of a page (lower case; punctuation dropped; spaces to -)."""
    headings = re.findall(r"^#+ (.+)$", markdown, re.MULTILINE)
    return {re.sub(r"[^a-z0-9_ -]", "", h.lower()).strip().replace(" ", "-") for h in headings}


def test_every_alert_has_a_runbook_section_in_the_operations_docs() -> None:
    """runbook_url is docs/operations.md#<the alert's name in lower case>, and that section exists and
    is more than a heading."""
    docs = (REPO / "docs" / "operations.md").read_text()
    anchors = _anchors(docs)
    for rule in _rules():
        if "alert" not in rule:
            continue
        url = rule["annotations"].get("runbook_url", "")
        assert url == f"docs/operations.md#{rule['alert'].lower()}", f"{rule['alert']}: runbook_url {url!r}"
        assert url.split("#")[1] in anchors, f"{rule['alert']}: no section {url} in docs/operations.md"
        section = docs.split(f"#### {rule['alert']}\n", 1)[1].split("\n#", 1)[0]
        assert len(section.split()) > 30, f"{rule['alert']}: its runbook section says too little"


@needs_promtool
def test_the_rebuild_thresholds_and_their_texts_come_from_one_place(tmp_path: Path) -> None:
    """A copy of the rules with the stale time set to 2 hours and the maximum run time to 30 minutes: a
    run killed at 0 fires Stuck at 35 minutes and Stale at 2h 5m, each summary naming its threshold."""
    rules = RULES.read_text()
    for name, value in (("max_run", "vector(1800)"), ("stale_after", "vector(2 * 3600)")):
        rules, n = re.subn(
            rf"(record: zerogr:config_rebuild_{name}_seconds\n\s+expr: ).*", rf"\g<1>{value}", rules
        )
        assert n == 1, name
    (tmp_path / "rules.yml").write_text(rules)
    box = '{job="rebuild",instance="box:9100"}'
    series = [{"series": f"zerogr_job_running{box}", "values": "1x200"},
              {"series": f"zerogr_job_start_timestamp_seconds{box}", "values": "0x200"}]  # fmt: skip

    def quiet(at: str, alert: str) -> dict:
        return {"expr": f'count by (alertname) (ALERTS{{alertstate="firing",alertname="{alert}"}})',
                "eval_time": at, "exp_samples": []}  # fmt: skip

    test = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [quiet("25m", "ZerogrRebuildStuck"), quiet("115m", "ZerogrRebuildStale")],
        "alert_rule_test": [
            {"eval_time": "35m", "alertname": "ZerogrRebuildStuck", "exp_alerts": [{
                "exp_labels": {"job": "rebuild", "instance": "box:9100", "severity": "warning"},
                "exp_annotations": {**_annotations("ZerogrRebuildStuck"), "summary": (
                    "zerogr rebuild on box:9100 started 35m 0s ago and has not ended, past the maximum run "
                    "time of 30m 0s: it hangs, or it was killed without writing its end (kill -9, out of "
                    "memory, a reboot). Look for the process (systemctl status, the run id in the log); a "
                    "killed run's leftovers are cleaned up by the next run."),
                    "description": "Run (unknown id)."}}]},
            {"eval_time": "125m", "alertname": "ZerogrRebuildStale", "exp_alerts": [{
                "exp_labels": {"job": "rebuild", "instance": "box:9100", "severity": "critical"},
                "exp_annotations": {**_annotations("ZerogrRebuildStale"), "summary": (
                    "zerogr rebuild on box:9100 has not succeeded for 2h 0m 0s: the fleet serves an old "
                    "catalog. Check that the timer or cron job still runs (systemctl list-timers, the log) "
                    "and whether a run hangs or was killed (zerogr_job_running stays 1)."),
                    "description": "Last success never."}}]},
        ]}]}  # fmt: skip
    (tmp_path / "t.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    done = _promtool("test", "rules", "t.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def _annotations(alert: str) -> dict[str, str]:
    """The alert's annotations that need no template (runbook_url)."""
    rule = next(r for r in _rules() if r.get("alert") == alert)
    return {"runbook_url": rule["annotations"]["runbook_url"]}


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
    then big enough for its items file to pass the limit while the metrics file stays under it);
    truncate_to: the catalog keeps only its first rows for the run itself (after the `before` runs), as a
    truncated export does; fleet_expiry_days: the run pushes, signed, to a fresh bucket on the moto
    server with this [fleet] timestamp_expiry_days."""

    id: str
    args: tuple[str, ...]
    exit_code: int
    firing: dict[str, frozenset[str]]
    stop_with: int | None = None
    file_size_limit: int | None = None
    before: tuple[tuple[str, ...], ...] = field(default=())  # rebuild ARGS run first, e.g. a good version
    items: int = 600  # catalog rows
    truncate_to: int | None = None
    fleet_expiry_days: float | None = None


FAILED = frozenset({"ZerogrRebuildFailed"})
REFUSED = frozenset({"ZerogrRebuildRefused"})
STALE = frozenset({"ZerogrRebuildStale"})
STUCK = frozenset({"ZerogrRebuildStuck"})
QUIET: frozenset[str] = frozenset()
RUNS = (
    RealRun("exit-0-gated", (*SIZES, *TUNE, *gate("tests.compare_models:model_fn")), 0,
            {"5m": QUIET, "7h": STALE}),
    RealRun("exit-2-no-codebook-sizes", ("--device", "cpu"), 2, {"5m": FAILED, "7h": FAILED}),
    RealRun("exit-3-file-too-large", (*SIZES, *TUNE), 3, {"5m": FAILED}, file_size_limit=16384, items=8000),
    RealRun("exit-4-verify-failed", (*SIZES, *TUNE, *gate("gate_models:corrupting")), 4, {"5m": FAILED}),
    RealRun("exit-143-sigterm", (*SIZES, *TUNE, *gate("gate_models:slow")), 143, {"5m": FAILED},
            stop_with=signal.SIGTERM),
    RealRun("exit-6-truncated-export", (*SIZES, *TUNE), 6, {"5m": REFUSED, "7h": REFUSED | STALE},
            before=((*SIZES, *TUNE),), truncate_to=300),
    # kill -9 leaves the file its start wrote: running 1, no exit status; stale once 6 hours have passed
    RealRun("killed-first-run", (*SIZES, *TUNE, *gate("gate_models:slow")), 128 + signal.SIGKILL,
            {"5m": QUIET, "2h": STUCK, "7h": STALE | STUCK}, stop_with=signal.SIGKILL),
    RealRun("exit-0-pushed-short-freshness", (*SIZES, *TUNE), 0,
            {"5m": frozenset({"ZerogrFleetMetadataExpiring"})}, fleet_expiry_days=0.5),
)  # fmt: skip


def write_catalog(path: Path, rows: int, of: int) -> None:
    """The first `rows` of a catalog of `of` items (ids 0.., random SIDs of 3 tokens < 16)."""
    sids = np.random.default_rng(0).integers(0, 16, (of, 3))[:rows].tolist()
    pq.write_table(pa.table({"item_id": np.arange(rows, dtype=np.int64), "sid": sids}), path)


def push_to_new_bucket(case: RealRun, work: Path, s3_endpoint: str, env: dict) -> tuple[str, ...]:
    """A fresh bucket, a signing key and a config for the case's push; its rebuild ARGS. Points `env` at
    the moto server."""
    import boto3

    from zerogr_build.fleet.keys import new_key

    from .conftest import S3_CREDENTIALS

    env.update({"AWS_ENDPOINT_URL": s3_endpoint, **S3_CREDENTIALS})
    bucket = f"zg-alerts-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=s3_endpoint, **_boto3_credentials()).create_bucket(Bucket=bucket)
    key = new_key(work / "keys" / "fleet")
    (work / "fleet-url").write_text(f"s3://{bucket}/fleet")
    (work / "zerogr.toml").write_text(f"[fleet]\ntimestamp_expiry_days = {case.fleet_expiry_days}\n")
    return ("--push", f"s3://{bucket}/fleet", "--push-signing-key", str(key.private_path),
            "--config", "zerogr.toml")  # fmt: skip


def _boto3_credentials() -> dict[str, str]:
    from .conftest import S3_CREDENTIALS

    return {"aws_access_key_id": S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "region_name": S3_CREDENTIALS["AWS_REGION"]}  # fmt: skip


def run_real(case: RealRun, work: Path, s3_endpoint: str | None = None) -> Path:
    """Run the case's rebuild in `work` (a catalog, requests and the gate models beside it); returns its
    metrics file. s3_endpoint: the moto server, for a case that pushes."""
    write_catalog(work / "catalog.parquet", case.items, case.items)
    pq.write_table(pa.table({"request_id": list(range(8))}), work / "requests.parquet")
    (work / "gate_models.py").write_text(GATE_MODELS)
    env = {**os.environ, "PYTHONPATH": f"{work}:{REPO}"}
    prom = work / "rebuild.prom"
    push: tuple[str, ...] = ()
    if case.fleet_expiry_days is not None:
        assert s3_endpoint is not None, "a case that pushes needs the moto server"
        push = push_to_new_bucket(case, work, s3_endpoint, env)

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
    if case.truncate_to is not None:
        write_catalog(work / "catalog.parquet", case.truncate_to, case.items)
    proc = start((*case.args, *push), case.file_size_limit)
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
def real_runs(tmp_path_factory, request):
    """run_real(case) once per case in this module: its metrics file."""
    done: dict[str, Path] = {}

    def get(case: RealRun) -> Path:
        if case.id not in done:
            endpoint = None if case.fleet_expiry_days is None else request.getfixturevalue("s3_server")
            done[case.id] = run_real(case, tmp_path_factory.mktemp(case.id), endpoint)
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


@pytest.mark.xdist_group("zerogr-real-runs")
def test_a_run_that_promoted_nothing_reports_the_version_latest_serves(real_runs) -> None:
    """The bundle gauges of a refused run describe LATEST's version (v1, 600 items), never the refused
    one it built (v2, 300 items); a first run that failed verification, and one killed before its end,
    report no version at all (nothing is live)."""
    from prometheus_client.parser import text_string_to_metric_families

    def bundle(case_id: str) -> dict[str, float]:
        text = real_runs(next(case for case in RUNS if case.id == case_id)).read_text()
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name.startswith("zerogr_bundle_")}  # fmt: skip

    refused = bundle("exit-6-truncated-export")
    assert refused["zerogr_bundle_version"] == 1 and refused["zerogr_bundle_items"] == 600, refused
    assert bundle("exit-4-verify-failed") == {} and bundle("killed-first-run") == {}


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
             "zerogr:fleet_latest_version:newest", 'zerogr_bundle_version{job="pull"}',
             'zerogr_job_consecutive_failures{job="pull"}', 'zerogr_pull_held{job="pull"}')  # fmt: skip
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
def test_every_metric_the_rules_and_the_dashboard_name_exists(real_runs, s3_server, tmp_path: Path) -> None:
    """Each zerogr metric a rule or a dashboard query names is written by a real run of RUNS, by a real
    host's pull of the version a case pushed, exported by a real follower (after a load that failed), or
    recorded by the rules."""
    import shutil

    import torch
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    import zerogr_build as zg

    from .conftest import S3_CREDENTIALS

    def names(text: str) -> set[str]:
        return {s.name for family in text_string_to_metric_families(text) for s in family.samples}

    success = real_runs(RUNS[0])
    written = set().union(*(names(real_runs(case).read_text()) for case in RUNS))
    pushed = real_runs(next(case for case in RUNS if case.fleet_expiry_days is not None)).parent
    env = {**os.environ, "PYTHONPATH": str(REPO), "AWS_ENDPOINT_URL": s3_server, **S3_CREDENTIALS}
    pull = [*zerogr_command(), "pull", (pushed / "fleet-url").read_text(), str(tmp_path / "host"),
            "--trusted-keys", str(pushed / "keys" / "fleet.pub"),
            "--metrics-file", str(tmp_path / "pull.prom")]  # fmt: skip
    done = subprocess.run(pull, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    written |= names((tmp_path / "pull.prom").read_text())
    registry = CollectorRegistry()
    weights = [torch.randn(16, 4) for _ in range(3)]
    bundles = shutil.copytree(success.parent / "bundles", tmp_path / "bundles", symlinks=True)
    with zg.follow(bundles, weights, device="cpu", plan=None, registry=registry) as follower:
        (bundles / "LATEST").write_text("v000099\n")  # a version that is not there: the load fails
        follower.poll()
        written |= names(generate_latest(registry).decode())
    assert "zerogr_follower_last_failure_timestamp_seconds" in written and "zerogr_pull_held" in written
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    named = set(_METRIC.findall(RULES.read_text())) | set(_METRIC.findall(" ".join(_dashboard_queries())))
    assert "zerogr_rebuild_gate_worst_overlap" in written and "zerogr_follower_live_version" in written
    unknown = named - written - recorded
    assert not unknown, f"named by the rules or the dashboard, written by nothing: {sorted(unknown)}"
