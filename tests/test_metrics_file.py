"""`--metrics-file`: Prometheus text format, parsed back with prometheus-client's own parser."""

import pytest
import typer
from prometheus_client.parser import text_string_to_metric_families

from zerogr_build.cli._metrics import JobMetrics, job_metrics


def samples(path) -> dict:
    out = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_success_then_failure_keeps_the_last_success_timestamp(tmp_path):
    path = tmp_path / "m" / "build.prom"
    with job_metrics("build", path) as metrics:
        with metrics.stage("read"):
            pass
        metrics.bundle(items=10, distinct_sids=9, index_bytes=123, version=4)
    first = samples(path)
    ok_at = first[("zerogr_job_last_success_timestamp_seconds", (("job", "build"),))]
    assert first[("zerogr_job_exit_status", (("job", "build"),))] == 0
    assert first[("zerogr_bundle_items", (("job", "build"),))] == 10
    assert first[("zerogr_bundle_version", (("job", "build"),))] == 4
    assert ("zerogr_job_stage_duration_seconds", (("job", "build"), ("stage", "read"))) in first

    with pytest.raises(typer.Exit), job_metrics("build", path):
        raise typer.Exit(2)
    second = samples(path)
    assert second[("zerogr_job_exit_status", (("job", "build"),))] == 2
    assert second[("zerogr_job_last_success_timestamp_seconds", (("job", "build"),))] == ok_at
    assert ("zerogr_bundle_items", (("job", "build"),)) not in second
    assert not [p for p in path.parent.iterdir() if p.name != "build.prom"]  # no temp file left


def test_an_exception_counts_as_exit_1_and_a_never_successful_job_has_no_success_timestamp(tmp_path):
    path = tmp_path / "tune.prom"
    with pytest.raises(RuntimeError), job_metrics("tune", path):
        raise RuntimeError("boom")
    got = samples(path)
    assert got[("zerogr_job_exit_status", (("job", "tune"),))] == 1
    assert not [k for k in got if k[0] == "zerogr_job_last_success_timestamp_seconds"]


def test_a_bundle_fact_that_is_not_a_number_is_left_out_not_an_error(tmp_path):
    """pull records facts from a remote manifest: a hostile `"index_bytes": "abc"` used to raise
    ValueError after the version was installed (exit 1)."""
    path = tmp_path / "pull.prom"
    with job_metrics("pull", path) as metrics:
        metrics.bundle(items=5, index_bytes="abc", distinct_sids=True, version=float("nan"))
    got = samples(path)
    assert got[("zerogr_bundle_items", (("job", "pull"),))] == 5
    assert not [k for k in got if k[0] in ("zerogr_bundle_index_bytes", "zerogr_bundle_distinct_sids")]
    assert got[("zerogr_job_exit_status", (("job", "pull"),))] == 0


def test_the_fleet_view_and_the_failures_in_a_row_carry_over_runs_that_read_nothing(tmp_path):
    """A run that read the fleet's metadata writes LATEST, when it was seen and the expiry; a failed run,
    a running one and one ended by a signal before its command started (cli/_early_metrics) carry that
    view over unchanged (so ZerogrFleetBehind keeps its fleet version), and count failures in a row."""
    from zerogr_build.cli._early_metrics import write_terminated

    path = tmp_path / "rebuild.prom"
    job = (("job", "rebuild"),)

    def fleet_and_failures() -> tuple:
        got = samples(path)
        names = ("fleet_latest_version", "fleet_latest_seen_timestamp_seconds",
                 "fleet_metadata_expires_timestamp_seconds", "job_consecutive_failures")  # fmt: skip
        return tuple(got.get((f"zerogr_{name}", job)) for name in names)

    with job_metrics("rebuild", path) as metrics:
        metrics.fleet(expires=2_000_000_000, latest=7)
    latest, seen, expires, failures = fleet_and_failures()
    assert (latest, expires, failures) == (7, 2_000_000_000, 0) and seen > 1_700_000_000
    with pytest.raises(typer.Exit), job_metrics("rebuild", path):
        raise typer.Exit(6)
    assert fleet_and_failures() == (7, seen, expires, 1)
    JobMetrics("rebuild", path).write_start("run-3")  # the file a killed run leaves
    assert fleet_and_failures() == (7, seen, expires, 1)
    write_terminated(["rebuild", "--metrics-file", str(path)], 15, "SIGTERM", 0.0)
    assert fleet_and_failures() == (7, seen, expires, 2)
    with pytest.raises(typer.Exit), job_metrics("rebuild", path) as metrics:
        metrics.fleet(expires=2_000_000_100)  # an expired-metadata refusal: the expiry alone is new
        raise typer.Exit(4)
    assert fleet_and_failures() == (7, seen, 2_000_000_100, 3)
    with job_metrics("rebuild", path) as metrics:
        metrics.fleet(latest=6)  # a rollback, read now
    latest, newer, _, failures = fleet_and_failures()
    assert (latest, failures) == (6, 0) and newer > seen


def test_a_running_run_keeps_what_latest_served_and_every_file_is_readable_by_all(tmp_path):
    """The file a rebuild writes as it starts keeps the last run's bundle facts (LATEST's version still
    serves); the file is mode 644 under a umask of 077 (node_exporter reads it as another user), from
    both writers."""
    import os

    from zerogr_build.cli._early_metrics import write_terminated

    path = tmp_path / "rebuild.prom"
    old = os.umask(0o077)
    try:
        with job_metrics("rebuild", path) as metrics:
            metrics.bundle(items=600, distinct_sids=559, index_bytes=2622, version=3)
        assert path.stat().st_mode & 0o777 == 0o644
        JobMetrics("rebuild", path).write_start("run-2")
        got = samples(path)
        assert path.stat().st_mode & 0o777 == 0o644
        write_terminated(["rebuild", "--metrics-file", str(path)], 15, "SIGTERM", 0.0)
        assert path.stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)
    assert got[("zerogr_bundle_version", (("job", "rebuild"),))] == 3
    assert got[("zerogr_bundle_items", (("job", "rebuild"),))] == 600
    assert got[("zerogr_job_running", (("job", "rebuild"),))] == 1
