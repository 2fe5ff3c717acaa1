"""The fleet example of docs/fleet.md (the whole path: build box, store, two serving hosts) runs twice in a
row in one dir, starting without its bucket: it creates the bucket, starts from a clean state and leaves
no marker files behind."""

from __future__ import annotations

from pathlib import Path

from .test_docs_examples import REPO, S3_BUCKET, _scratch, fenced_blocks, run_block


def _fleet_block():
    blocks = fenced_blocks((REPO / "docs" / "fleet.md").read_text(), "docs/fleet.md")
    (block,) = [b for b in blocks if "s3" in b.needs and "ship()" in b.code]
    return block


def test_the_fleet_example_runs_twice_in_one_dir_without_its_bucket(tmp_path: Path, s3_env) -> None:
    import boto3

    bucket = boto3.resource("s3").Bucket(S3_BUCKET)
    if bucket.creation_date is not None:  # start without the bucket: the example creates it
        bucket.object_versions.delete()
        bucket.objects.all().delete()
        bucket.delete()
    work, env = _scratch(tmp_path)
    env = {**env, **s3_env}
    scripts = tmp_path / "blocks"
    scripts.mkdir()
    block = _fleet_block()
    for run in range(2):
        run_block(block, work, env, scripts, run)
        assert not (work / "ready").exists() and not (work / "stop").exists()
    assert boto3.resource("s3").Bucket(S3_BUCKET).creation_date is not None
