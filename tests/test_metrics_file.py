"""`--metrics-file`: Prometheus text format, parsed back with prometheus-client's own parser."""

import pytest
import typer
from prometheus_client.parser import text_string_to_metric_families

from zerogr_build.cli._metrics import job_metrics


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
