"""`zerogr status` shows the quality gate's recorded decision(s) per version, local and remote (moto server).

A remote record is read by the same rules as a local one and checked against the manifest's size and
sha256: a hostile or corrupt one is flagged (an error row, the version fails its check), never shown as a
decision.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from zerogr_build.bundle.amend import add_bundle_files
from zerogr_build.bundle.quality import quality_bytes, quality_file_name
from zerogr_build.cli import app
from zerogr_build.testing import publish_catalog, random_catalog


def zerogr(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout


def record(model_version: str, order: str, worst: float) -> bytes:
    return quality_bytes(
        {
            "format": "zerogr-quality",
            "format_version": 1,
            "model_version": model_version,
            "order": order,
            "passed": order == "filter_first",
            "thresholds": {"min_overlap": 0.995, "max_recall_gap": None},
            "overlap": {"1": worst, "10": min(1.0, worst + 0.001)},
        }
    )


def decisions(version: dict) -> dict[str, str]:
    return {row["model_version"]: row["order"] for row in version["quality"] if "error" not in row}


def make_out(tmp_path):
    """OUT with v1 (no record) and v2 (two records: m-1 passed, m-2 failed)."""
    out = tmp_path / "build"
    publish_catalog(random_catalog(seed=1), out)
    publish_catalog(random_catalog(seed=2), out)
    add_bundle_files(
        out / "v000002",
        {
            quality_file_name("m-1"): record("m-1", "filter_first", 0.998),
            quality_file_name("m-2@2026"): record("m-2@2026", "score_first", 0.91),
        },
    )
    return out


def test_status_shows_the_gate_decisions_of_a_local_out(tmp_path):
    out = make_out(tmp_path)
    code, text = zerogr("status", str(out), "--json")
    assert code == 0
    v1, v2 = json.loads(text)["versions"]
    assert v1["quality"] == []
    assert decisions(v2) == {"m-1": "filter_first", "m-2@2026": "score_first"}
    row = next(r for r in v2["quality"] if r["model_version"] == "m-2@2026")
    assert row["passed"] is False and row["worst_overlap"] == 0.91 and row["min_overlap"] == 0.995
    code, table = zerogr("status", str(out))
    assert code == 0 and "gate" in table
    assert "m-1: filter_first" in table and "m-2@2026: score_first" in table


def test_status_shows_the_gate_decisions_of_a_remote_out_and_flags_a_hostile_record(tmp_path, s3_bucket):
    import boto3

    out = make_out(tmp_path)
    remote = f"s3://{s3_bucket}/fleet/bundles"
    signing_key = tmp_path / "keys" / "build-box"
    assert zerogr("keys", "new", str(signing_key))[0] == 0
    trusted = ("--trusted-keys", f"{signing_key}.pub")
    signed = ("--quiet", "--signing-key", str(signing_key))
    assert zerogr("push", str(out / "v000002"), remote, *signed)[0] == 0
    code, text = zerogr("status", remote, "--json", *trusted)
    assert code == 0
    (v1,) = json.loads(text)["versions"]
    assert decisions(v1) == {"m-1": "filter_first", "m-2@2026": "score_first"}
    code, table = zerogr("status", remote, *trusted)
    assert code == 0 and "m-1: filter_first" in table and "m-2@2026: score_first" in table

    # Someone rewrites the failed record on the store (the fleet holds the version under its own number,
    # v000002) to claim the gate passed, same size: the sha256 no longer matches the manifest, so the
    # decision is not trusted and the version fails its check.
    key = f"fleet/bundles/v000002/{quality_file_name('m-2@2026')}"
    s3 = boto3.client("s3")
    body = s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
    forged = body.replace(b'"score_first"', b'"filter_first"').replace(b'"passed": false', b'"passed": true')
    assert len(forged) == len(body) and forged != body
    s3.put_object(Bucket=s3_bucket, Key=key, Body=forged)
    code, text = zerogr("status", remote, "--json", *trusted)
    assert code == 4
    (v1,) = json.loads(text)["versions"]
    assert decisions(v1) == {"m-1": "filter_first"}
    bad = next(r for r in v1["quality"] if "error" in r)
    assert bad["file"] == quality_file_name("m-2@2026") and "sha256" in bad["error"]
    assert v1["ok"] is False and quality_file_name("m-2@2026") in v1["error"]
    code, table = zerogr("status", remote, *trusted)
    assert code == 4 and f"BROKEN {quality_file_name('m-2@2026')}" in table

    # A record far over the size limit is refused unread.
    s3.put_object(Bucket=s3_bucket, Key=key, Body=b" " * (2 << 20))
    code, text = zerogr("status", remote, "--json", *trusted)
    (v1,) = json.loads(text)["versions"]
    assert code == 4 and any("error" in r and "bytes" in r["error"] for r in v1["quality"])
