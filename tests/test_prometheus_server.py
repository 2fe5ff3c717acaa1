"""The shipped alerting rules in a real Prometheus server, scraping real node_exporters' textfile
collectors that real `zerogr rebuild` and `zerogr pull` runs write into, and a real follower's gauges,
with the fleet on a moto S3 server; all on 127.0.0.1 with free ports.

The scenario: the build box pushes v1, the host pulls it and its serving process (a follower) serves it:
nothing fires. The build box pushes v2; the host's pulls fail twice (its trusted-keys file holds another
key); the next rebuild is refused by the guards (a truncated export). Then exactly ZerogrRebuildRefused,
ZerogrPullFailed and ZerogrFleetBehind fire, and the refused run's bundle gauges describe v2, the
version LATEST serves, not the refused one (the refused run renewed the fleet's signature, so it read the
fleet's LATEST itself).

Then the rebuild after it is killed (kill -9) once it runs, and the one after that fails at once (exit
2): neither reads the fleet, yet ZerogrFleetBehind keeps firing through both (each file carries the
build box's last view of the fleet's LATEST), beside ZerogrRebuildStuck, then ZerogrRebuildFailed.
Last, the host's LATEST is moved to a version that is not there: the follower cannot load it, and
ZerogrFollowerCannotLoad fires too.

Prometheus loads a copy of zerogr.rules.yml in which every `for:` is 0s (the shipped 30 minutes, 5
minutes and a day would outlast the test) and the maximum run time is 1 s instead of an hour; nothing
else differs. Scrape and evaluation intervals are 1 s. ZerogrRebuildStale, ZerogrFleetMetadataExpiring
and ZerogrPullHeld fire only in the promtool tests (hours of time, or a second host); here they stay
quiet.

Needs Debian's `prometheus` and `prometheus-node-exporter` (.ci/run installs them); skips without them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from .cli_runs import REPO, TUNE_ARGS, zerogr_command
from .conftest import S3_CREDENTIALS

PROMETHEUS = shutil.which("prometheus")
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
RULES = REPO / "deploy" / "prometheus" / "zerogr.rules.yml"
ALERTS = {"ZerogrRebuildFailed", "ZerogrRebuildRefused", "ZerogrRebuildStuck", "ZerogrRebuildStale",
          "ZerogrFleetBehind", "ZerogrFleetMetadataExpiring", "ZerogrPullFailed", "ZerogrPullHeld",
          "ZerogrFollowerCannotLoad"}  # fmt: skip
WAIT_S = 45  # the longest the test waits for Prometheus to agree with the files

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None or NODE_EXPORTER is None,
    reason="needs prometheus and node_exporter (apt-get install prometheus prometheus-node-exporter; "
    ".ci/run installs them)",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_catalog(path: Path, rows: int) -> None:
    """The first `rows` of a 600-item catalog (random SIDs of 3 tokens < 16)."""
    sids = np.random.default_rng(0).integers(0, 16, (600, 3))[:rows].tolist()
    pq.write_table(pa.table({"item_id": np.arange(rows, dtype=np.int64), "sid": sids}), path)


def rules_without_waits(target: Path) -> Path:
    """The shipped rules with every `for:` set to 0s and the maximum run time to 1 s (nothing else
    changed), written to `target`."""
    text, count = re.subn(r"(?m)^(\s+)for: \S+$", r"\g<1>for: 0s", RULES.read_text())
    assert count >= 3, "the shipped rules hold fewer `for:` than this test expects"
    max_run = r"(record: zerogr:config_rebuild_max_run_seconds\n\s+expr: )vector\(3600\)"
    text, count = re.subn(max_run, r"\g<1>vector(1)", text)
    assert count == 1, "the maximum run time is not where this test expects it"
    target.write_text(text)
    return target


@contextlib.contextmanager
def started(argv: list[str], log: Path) -> Iterator[subprocess.Popen]:
    """A server process for the block; stopped (SIGTERM, then SIGKILL) when it ends."""
    with log.open("w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def api(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
        return json.load(answer)


def alerts(port: int) -> dict[str, list[dict]]:
    """{alertname: [its alerts (labels, state)]} from /api/v1/alerts."""
    found: dict[str, list[dict]] = {}
    for alert in api(port, "/api/v1/alerts")["data"]["alerts"]:
        found.setdefault(alert["labels"]["alertname"], []).append(alert)
    return found


def query(port: int, expr: str) -> list[dict]:
    return api(port, "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))["data"]["result"]


def wait_for(what: str, check, logs: list[Path]) -> None:
    """Poll `check()` until it is true, for at most WAIT_S seconds."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            if check():
                return
        except OSError:  # the server is not listening yet
            pass
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
            raise AssertionError(f"Prometheus never showed {what} within {WAIT_S} s\n{tails}")
        time.sleep(0.5)


def metrics(path: Path) -> dict[str, float]:
    """The series of a metrics file labelled only with `job`, by name."""
    from prometheus_client.parser import text_string_to_metric_families

    return {s.name: s.value for f in text_string_to_metric_families(path.read_text()) for s in f.samples
            if set(s.labels) == {"job"}}  # fmt: skip


def test_a_real_prometheus_fires_on_a_refused_rebuild_a_failing_pull_and_a_host_behind(
    tmp_path: Path, s3_server: str
) -> None:
    import boto3
    import torch
    from prometheus_client import CollectorRegistry, start_http_server

    import zerogr_build as zg
    from zerogr_build.fleet.keys import new_key

    box, host = tmp_path / "box", tmp_path / "host"
    for machine in (box, host):
        (machine / "textfile").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "AWS_ENDPOINT_URL": s3_server, **S3_CREDENTIALS}
    bucket = f"zg-prom-{uuid.uuid4().hex[:16]}"
    boto3.client(
        "s3", endpoint_url=s3_server, aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=S3_CREDENTIALS["AWS_REGION"],
    ).create_bucket(Bucket=bucket)  # fmt: skip
    fleet = f"s3://{bucket}/fleet"
    key, other = new_key(tmp_path / "keys" / "build-box"), new_key(tmp_path / "keys" / "not-the-fleet")
    rebuild_prom, pull_prom = box / "textfile" / "zerogr_rebuild.prom", host / "textfile" / "zerogr_pull.prom"

    def zerogr(*args: str | Path, code: int | None = 0) -> int:
        done = subprocess.run([*zerogr_command(), *map(str, args)], cwd=box, env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        assert code is None or done.returncode == code, f"exit {done.returncode}\n{done.stderr}"
        return done.returncode

    def rebuild(*extra: str, code: int = 0) -> None:
        zerogr("rebuild", "catalog.parquet", "--out", box / "bundles", "--codebook-sizes", "16,16,16",
               "--device", "cpu", "--tune-args", TUNE_ARGS, "--push", fleet, "--push-signing-key",
               key.private_path, "--metrics-file", rebuild_prom, *extra, code=code)  # fmt: skip

    def pull(trusted: Path, code: int | None = 0) -> int:
        return zerogr("pull", fleet, host / "bundles", "--trusted-keys", trusted, "--quiet",
                      "--metrics-file", pull_prom, code=code)  # fmt: skip

    # Prometheus, two node_exporters (the build box, the host) and the host's serving process.
    ports = {name: free_port() for name in ("prometheus", "box", "host", "recommender")}
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules_without_waits(tmp_path / "zerogr.rules.yml"))],
        "scrape_configs": [
            {"job_name": "node", "honor_labels": True,
             "static_configs": [{"targets": [f"127.0.0.1:{ports['box']}", f"127.0.0.1:{ports['host']}"]}]},
            {"job_name": "recommender",
             "static_configs": [{"targets": [f"127.0.0.1:{ports['recommender']}"]}]},
        ],
    }  # fmt: skip
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    logs = [tmp_path / "prometheus.log", tmp_path / "node-box.log", tmp_path / "node-host.log"]
    prometheus = [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                  f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                  f"--web.listen-address=127.0.0.1:{ports['prometheus']}"]  # fmt: skip

    def node_exporter(machine: Path) -> list[str]:
        return [NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{ports[machine.name]}",
                "--collector.disable-defaults", "--collector.textfile",
                f"--collector.textfile.directory={machine / 'textfile'}"]  # fmt: skip

    port = ports["prometheus"]
    with contextlib.ExitStack() as stack:
        stack.enter_context(started(prometheus, logs[0]))
        stack.enter_context(started(node_exporter(box), logs[1]))
        stack.enter_context(started(node_exporter(host), logs[2]))

        # v1 on the fleet, pulled and served by the host: nothing fires.
        write_catalog(box / "catalog.parquet", 600)
        rebuild()
        pull(key.public_path)
        registry = CollectorRegistry()
        weights = [torch.randn(16, 4) for _ in range(3)]
        follower = stack.enter_context(zg.follow(host / "bundles", weights, device="cpu", plan=None,
                                                 registry=registry))  # fmt: skip
        server, _ = start_http_server(ports["recommender"], addr="127.0.0.1", registry=registry)
        stack.callback(server.shutdown)
        assert follower.version == 1
        wait_for("the host serving v1 and the fleet at v1, no alert", lambda: (
            [s["value"][1] for s in query(port, "zerogr_follower_live_version")] == ["1"]
            and [s["value"][1] for s in query(port, "zerogr:fleet_latest_version:newest")] == ["1"]
            and query(port, 'zerogr_job_exit_status{job="pull"}')
            and not alerts(port)), logs)  # fmt: skip

        # v2 on the fleet, then a rebuild the guards refuse; meanwhile the host's pulls fail twice.
        def box_runs() -> None:
            rebuild("--force")
            write_catalog(box / "catalog.parquet", 300)
            rebuild(code=6)

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            box_done = pool.submit(box_runs)
            codes = {pull(other.public_path, code=None) for _ in range(2)}
            box_done.result()
        assert 0 not in codes, codes

        box_metrics, host_metrics = metrics(rebuild_prom), metrics(pull_prom)
        assert box_metrics["zerogr_job_exit_status"] == 6
        # LATEST still serves v2 (600 items): the refused v3 (300 items) never shows
        assert box_metrics["zerogr_bundle_version"] == 2 and box_metrics["zerogr_bundle_items"] == 600
        assert box_metrics["zerogr_fleet_latest_version"] == 2
        assert host_metrics["zerogr_job_consecutive_failures"] == 2
        assert host_metrics["zerogr_bundle_version"] == 1  # what the host still serves
        assert follower.version == 1

        behind = {"ZerogrPullFailed": "pull", "ZerogrFleetBehind": "recommender"}

        def firing(expected: dict[str, str]) -> None:
            """Wait until exactly these alerts fire (alert name: its job label) and no other is active."""

            def now() -> bool:
                found = alerts(port)
                jobs = {
                    name: {a["labels"]["job"] for a in found[name] if a["state"] == "firing"}
                    for name in found
                }
                return jobs == {name: {job} for name, job in expected.items()}

            wait_for(f"exactly {sorted(expected)} firing", now, logs)
            (alert,) = alerts(port)["ZerogrFleetBehind"]
            assert alert["labels"]["instance"] == f"127.0.0.1:{ports['recommender']}"
            assert alert["annotations"]["description"] == "The fleet's LATEST is v2."

        firing({"ZerogrRebuildRefused": "rebuild", **behind})

        # A rebuild killed once it runs (its file says running 1): stuck; the fleet's LATEST stays known.
        write_catalog(box / "catalog.parquet", 600)
        argv = [*zerogr_command(), "rebuild", "catalog.parquet", "--out", str(box / "bundles"),
                "--codebook-sizes", "16,16,16", "--device", "cpu", "--force",
                "--metrics-file", str(rebuild_prom)]  # fmt: skip
        killed = subprocess.Popen(
            argv,
            cwd=box,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 120
            while metrics(rebuild_prom).get("zerogr_job_running") != 1:
                assert killed.poll() is None and time.monotonic() < deadline, "the run never reported running"
                time.sleep(0.05)
        finally:
            os.killpg(killed.pid, signal.SIGKILL)  # the run and anything it started
            killed.wait(timeout=30)
        firing({"ZerogrRebuildStuck": "rebuild", **behind})
        assert metrics(rebuild_prom)["zerogr_fleet_latest_version"] == 2  # carried over by the killed run

        # The next rebuild fails (no --codebook-sizes: exit 2).
        zerogr("rebuild", "catalog.parquet", "--out", box / "bundles", "--device", "cpu",
               "--metrics-file", rebuild_prom, code=2)  # fmt: skip
        firing({"ZerogrRebuildFailed": "rebuild", **behind})

        # The host's LATEST names a version that is not there: its follower cannot load it.
        (host / "bundles" / "LATEST").write_text("v000099\n")
        firing({"ZerogrRebuildFailed": "rebuild", "ZerogrFollowerCannotLoad": "recommender", **behind})
        assert follower.version == 1
