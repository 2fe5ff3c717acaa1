"""`?` and `[...]` in catalog URIs are glob wildcards, as in a local path (docs/object-storage.md): on a
real S3 API server (moto, tests/conftest.py), through `zerogr build`, and in `file://` URIs; URI options
still follow as a trailing `?name=value` query."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from zerogr_build.catalog import find_catalog_files
from zerogr_build.catalog.storage import split_glob_uri

from .cli_runs import invoke, one_error_line
from .test_catalog_remote import part, upload


@pytest.fixture()
def partitions(tmp_path):
    """Two Hive-style partitions, dt=1 and dt=2, one part each."""
    root = tmp_path / "cat"
    for dt in (1, 2):
        (root / f"dt={dt}").mkdir(parents=True)
        pq.write_table(part(100, 1000 * dt, dt), root / f"dt={dt}" / "part-0.parquet")
    return root


@pytest.mark.parametrize(
    "pattern", ["dt=?/part-0.parquet", "dt=[12]/part-0.parquet", "dt=[!3]/part-?.parquet"]
)
def test_a_build_from_an_s3_glob_with_question_mark_or_brackets_reads_every_match(
    s3_bucket, s3_env, partitions, tmp_path, pattern
):
    uri = upload(partitions, s3_bucket, "exports/cat")
    res = invoke("build", f"{uri}/{pattern}", "-o", tmp_path / "OUT", "--codebook-sizes", "6,6,6", "--json")
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "OUT" / "v000001" / "manifest.json").read_text())
    assert manifest["catalog"]["path"] == f"{uri}/{pattern}"
    assert manifest["leaves"]["items"] == 200
    assert find_catalog_files(f"{uri}/{pattern}") == [
        f"{uri}/dt=1/part-0.parquet",
        f"{uri}/dt=2/part-0.parquet",
    ]


def test_an_s3_glob_that_matches_nothing_and_a_wildcard_bucket_are_one_line(s3_bucket, s3_env, tmp_path):
    uri = f"s3://{s3_bucket}/exports/cat/dt=?/part-0.parquet"
    line = one_error_line(invoke("build", uri, "-o", tmp_path / "OUT", "--codebook-sizes", "6,6,6"))
    assert line == f"error: {uri}: no files match this pattern"
    line = one_error_line(
        invoke("build", "s3://zg-*/x.parquet", "-o", tmp_path / "OUT", "--codebook-sizes", "6")
    )
    assert "a wildcard in the bucket name is not supported" in line


def test_file_uris_take_the_same_wildcards(partitions):
    local = find_catalog_files(f"{partitions}/dt=?/part-0.parquet")
    assert len(local) == 2
    for pattern in ("dt=?/part-0.parquet", "dt=[12]/part-?.parquet"):
        assert find_catalog_files(f"file://{partitions}/{pattern}") == local


@pytest.mark.parametrize(
    ("uri", "split"),
    [
        ("s3://b/e/dt=?/p.parquet", ("s3://b/e", "dt=?/p.parquet", "")),
        ("s3://b/e/dt=[12]/p.parquet", ("s3://b/e", "dt=[12]/p.parquet", "")),
        ("s3://b/e/part-?.parquet", ("s3://b/e", "part-?.parquet", "")),
        ("s3://b/e/?region=eu-west-1", ("s3://b/e/", "", "?region=eu-west-1")),
        (
            "s3://b/*/p-?.parquet?region=eu-west-1&scheme=http",
            ("s3://b", "*/p-?.parquet", "?region=eu-west-1&scheme=http"),
        ),
        ("s3://b/e/p.parquet", ("s3://b/e/p.parquet", "", "")),
        ("gs://b/e/**/*.parquet", ("gs://b/e", "**/*.parquet", "")),
    ],
)
def test_split_glob_uri_keeps_wildcards_away_from_the_uri_parser(uri, split):
    assert split_glob_uri(uri) == split


@pytest.mark.parametrize(
    ("uri", "secret"),
    [("s3://b/dt=?/monkey_keys.parquet", False), ("s3://b/events/??/signups-[ab].parquet", False),
     ("s3://b/dt=?/author=x/part.parquet", False), ("s3://b/x?/partition_key=1/p.parquet", False),
     ("s3://b/dt=?/part.parquet?region=us-east-1", False), ("s3://b/x.parquet?secret_key=abc", True),
     ("s3://b/dt=?/x.parquet?region=us&x-amz-security-token=t", True), ("s3://me:pw@b/x.parquet", True)],
)  # fmt: skip
def test_a_glob_question_mark_is_not_read_as_a_query_that_carries_credentials(uri, secret):
    """A path after a glob's `?` that merely contains "key" or "sig" is no credential; a real one is."""
    from zerogr_build.base.redact import has_credentials

    assert has_credentials(uri) is secret
