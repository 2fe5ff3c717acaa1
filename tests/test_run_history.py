"""OUT's run history and the report's health sections: real `zerogr rebuild` runs (pushed and signed,
refused by the guards, a failed push, killed with -9) each leave their line, a killed run is marked by the
next one, and `zerogr report` shows the runs and the fleet as the newest push saw it. The history and the
manifests are untrusted: a damaged or hostile history file, or a version with numbers no float holds,
never fails a run or loses the page."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zerogr_build.bundle import run_history
from zerogr_build.report import report_html

from .cli_runs import REPO, TUNE_ARGS, invoke, zerogr_command
from .test_report import tables

SIZES = ("--codebook-sizes", "16,16,16")
HUGE = 10**400


def write_catalog(path: Path, rows: int, of: int = 600) -> Path:
    sids = np.random.default_rng(0).integers(0, 16, (of, 3))[:rows].tolist()
    pq.write_table(pa.table({"item_id": np.arange(rows, dtype=np.int64), "sid": sids}), path)
    return path


def rebuild_args(catalog: Path, out: Path, *extra) -> list:
    return [catalog, "--out", out, *SIZES, "--device", "cpu", "--tune-args", TUNE_ARGS, *extra]


def runs_by_id(out: Path) -> dict[str, dict]:
    return {run["run_id"]: run for run in run_history.read_runs(out)}


def newest(out: Path) -> dict:
    return run_history.read_runs(out)[-1]


def test_real_runs_leave_their_lines_and_the_report_shows_them(tmp_path, s3_bucket):
    import boto3

    from zerogr_build.fleet.keys import new_key

    out, url = tmp_path / "bundles", f"s3://{s3_bucket}/fleet"
    full, cut = write_catalog(tmp_path / "full.parquet", 600), write_catalog(tmp_path / "cut.parquet", 300)
    key = Path(new_key(tmp_path / "keys" / "build-box").private_path)
    signed = ("--push", url, "--push-signing-key", key)

    pushed = invoke("rebuild", *rebuild_args(full, out, *signed))
    assert pushed.exit_code == 0, pushed.stderr
    run = newest(out)
    assert (run["status"], run["exit_code"], run["version"], run["promoted"]) == ("ended", 0, "v000001", True)
    assert run["push"]["outcome"] == "pushed" and run["push"]["fleet_latest"] == 1
    assert run["push"]["expires"] > time.time()

    refused = invoke("rebuild", *rebuild_args(cut, out, *signed))  # half the catalog gone: the guards fire
    assert refused.exit_code == 6, refused.stderr
    run = newest(out)
    assert (run["exit_code"], run["stage"], run["promoted"]) == (6, "guards", False)
    assert "items_removed" in run["guards_fired"] and run["version"] == "v000002"

    # a failed push: the remote LATEST names a signed version, and this run pushes unsigned
    s3 = boto3.client("s3")
    s3.put_object(Bucket=s3_bucket, Key="signed/v000009/manifest.json.sig", Body=b"{}")
    s3.put_object(Bucket=s3_bucket, Key="signed/LATEST", Body=b"v000009\n")
    failed = invoke("rebuild", *rebuild_args(full, out, "--push", f"s3://{s3_bucket}/signed", "--force"))
    assert failed.exit_code == 12, failed.stderr
    run = newest(out)
    assert (run["exit_code"], run["stage"], run["push"]["outcome"]) == (12, "push", "failed")

    # kill -9 during the build: its line stays "running"; the next run marks it killed
    killed = subprocess.Popen(
        [*zerogr_command(), "rebuild", *map(str, rebuild_args(full, out, "--force"))], cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert killed.stderr is not None
    for line in killed.stderr:
        if "rebuild: build " in line:
            break
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    dead = newest(out)
    assert dead["status"] == "running" and "end" not in dead
    after = invoke("rebuild", *rebuild_args(full, out))
    assert after.exit_code == 0, after.stderr
    assert f"{dead['run_id']} never ended: marked killed" in after.stderr
    assert runs_by_id(out)[dead["run_id"]]["status"] == "killed"

    page = report_html(out, plots=False)
    shown = tables(page)
    runs = shown["Rebuild runs"]  # newest first
    assert [row["exit"].split()[0] for row in runs] == ["0", "killed", "12", "6", "0"]
    assert runs[3]["failed stage"] == "guards" and "items_removed" in runs[3]["guards fired"]
    assert runs[2]["push"] == "failed" and runs[4]["push"] == "pushed"
    (fleet,) = shown["Fleet"]
    # the newest run that saw the fleet: the refused one, which renewed its signed metadata
    assert fleet["remote LATEST"] == "v000001" and runs[3]["push"] == "renewed"
    assert fleet["remote OUT"] == url and fleet["seen by run"] == runs[3]["run"]
    assert "expired" not in fleet["signed metadata expires"] and fleet["signed metadata expires"] != "unknown"


def test_a_hostile_history_file_never_fails_a_run_or_the_page(tmp_path):
    out = tmp_path / "bundles"
    catalog = write_catalog(tmp_path / "c.parquet", 600)
    assert invoke("rebuild", *rebuild_args(catalog, out)).exit_code == 0
    first = newest(out)
    hostile = [
        b"\xff\xfe not utf-8",
        b"[1, 2]",
        b'{"run_id": 5, "status": "ended"}',
        b'{"run_id": "no-status"}',
        b"[" * 100_000,  # deeper than the parser recurses
        json.dumps(
            {
                "run_id": "big",
                "status": "ended",
                "exit_code": HUGE,
                "start": HUGE,
                "end": "2026-12-07T05:00:00+00:00",
                "guards_fired": [HUGE, "x" * 5000],
                "push": {"outcome": "pushed", "fleet_latest": HUGE, "expires": 1e308, "url": ["x"]},
                "reason": "<script>alert(1)</script>",
            }
        ).encode(),  # fmt: skip
        b'{"run_id": "inf", "status": "ended", "push": {"expires": 1e999, "fleet_latest": 3}}',
        b'{"run_id": "old-running", "status": "running", "start": "2026-12-07T04:00:00+00:00"}',
        json.dumps(first).encode(),
    ]
    history = run_history.history_path(out)
    history.write_bytes(b"\n".join(hostile) + b"\n")
    page = report_html(out, plots=False)
    runs = {row["run"]: row for row in tables(page)["Rebuild runs"]}
    assert set(runs) == {"big", "inf", "old-running", first["run_id"]}
    assert runs["big"]["exit"] == "unknown" and runs["big"]["started"] == "—"
    assert runs["old-running"]["exit"].startswith("killed")
    assert "<script>" not in page
    (fleet,) = tables(page)["Fleet"]  # the newest run that saw the fleet, "inf": latest 3, expiry unknown
    assert (fleet["seen by run"], fleet["remote LATEST"], fleet["signed metadata expires"]) == (
        "inf",
        "v000003",
        "unknown",
    )

    again = invoke("rebuild", *rebuild_args(catalog, out))
    assert again.exit_code == 0, again.stderr
    kept = run_history.read_runs(out)
    assert [r["run_id"] for r in kept] == ["big", "inf", "old-running", first["run_id"], kept[-1]["run_id"]]
    assert kept[2]["status"] == "killed" and kept[-1]["status"] == "ended"
    assert len(history.read_bytes().splitlines()) == 5  # the lines that were no run records dropped

    # a FIFO where the history goes: never opened for writing or waited on; the run still ends 0
    history.unlink()
    os.mkfifo(history)
    blocked = invoke("rebuild", *rebuild_args(catalog, out))
    assert blocked.exit_code == 0, blocked.stderr
    assert "could not write the run history" in blocked.stderr
    assert "Rebuild runs" in report_html(out, plots=False)


def test_the_history_keeps_the_newest_runs(tmp_path):
    runs = [
        {"run_id": f"r{i:04d}", "status": "ended", "exit_code": 0} for i in range(run_history.MAX_RUNS + 50)
    ]
    run_history.write_runs(tmp_path, runs)
    killed = run_history.record_start(tmp_path, {"run_id": "new"})
    kept = run_history.read_runs(tmp_path)
    assert len(kept) == run_history.MAX_RUNS and killed == []
    assert kept[0]["run_id"] == "r0051" and kept[-1] == {"run_id": "new", "status": "running"}
    run_history.record_end(tmp_path, {"run_id": "new", "exit_code": 3})
    assert run_history.read_runs(tmp_path)[-1] == {"run_id": "new", "status": "ended", "exit_code": 3}


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory) -> Path:
    """An OUT with v000001 and v000002 (built by zerogr build)."""
    root = tmp_path_factory.mktemp("two-versions")
    catalog = write_catalog(root / "c.parquet", 600)
    for _ in range(2):
        done = invoke("build", catalog, "-o", root / "bundles", *SIZES, "-q")
        assert done.exit_code == 0, done.output
    return root / "bundles"


@pytest.mark.parametrize(
    ("field", "where"),
    [
        ("build_timings", lambda m: m.__setitem__("build_timings", {"read": HUGE})),
        ("index_bytes", lambda m: m.__setitem__("index_bytes", HUGE)),
        (
            "guard value",
            lambda m: m.__setitem__(
                "guards",
                [
                    {
                        "guard": "g",
                        "value": HUGE,
                        "threshold": -HUGE,
                        "bound": "max",
                        "fired": True,
                        "note": "",
                    }
                ],
            ),
        ),  # fmt: skip
    ],
)
def test_numbers_no_float_holds_are_unknown_and_the_page_is_written(two_versions, tmp_path, field, where):
    out = tmp_path / "bundles"
    shutil.copytree(two_versions, out, symlinks=True)
    path = out / "v000002" / "manifest.json"
    manifest = json.loads(path.read_text())
    where(manifest)
    path.write_text(json.dumps(manifest))
    assert invoke("verify", out / "v000002").exit_code == 0  # informational fields: the version is valid
    written = invoke("report", out, "-o", tmp_path / "page.html", "--no-plots")
    assert written.exit_code == 0, written.output
    page = (tmp_path / "page.html").read_text()
    rows = {row["version"].split()[0]: row for row in tables(page)["Versions"]}
    assert set(rows) == {"v000001", "v000002"}
    if field == "index_bytes":
        assert rows["v000002"]["index bytes"] == "—"
    if field == "build_timings":
        assert rows["v000002"]["build s"] == "—"
    if field == "guard value":
        (guard,) = tables(page)["Catalog guards"]
        assert (guard["value"], guard["threshold"]) == ("—", "—")
