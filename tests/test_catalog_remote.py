"""Catalogs on object storage, read from a real S3 API server (moto's server mode, tests/conftest.py):
the local file / directory / glob rules and messages, the same bundle as the same catalog read locally, and
credentials that never show up in output, manifests or errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zerogr_build.base.errors import InputError
from zerogr_build.catalog import find_catalog_files, read_catalog

from .cli_runs import invoke, one_error_line

SIZES = [6, 6, 6]


def part(rows: int, first_id: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    sids = rng.integers(0, 6, size=(rows, 3)).astype(np.uint16)
    return pa.table(
        {
            "item_id": pa.array(np.arange(rows) + first_id, pa.int64()),
            "sid": pa.FixedSizeListArray.from_arrays(pa.array(sids.reshape(-1)), 3),
        }
    )


@pytest.fixture()
def catalog_tree(tmp_path) -> Path:
    """An export as warehouses leave it: parts in a sub-dir, a _SUCCESS marker and a hidden .crc file."""
    root = tmp_path / "catalog"
    (root / "day=1").mkdir(parents=True)
    pq.write_table(part(500, 0, 1), root / "part-0.parquet", row_group_size=64)
    pq.write_table(part(300, 1000, 2), root / "part-1.parquet", row_group_size=64)
    pq.write_table(part(200, 5000, 3), root / "day=1" / "part-2.parquet", row_group_size=64)
    (root / "_SUCCESS").write_bytes(b"")
    (root / ".part-0.parquet.crc").write_bytes(b"not parquet")
    return root


def upload(tree: Path, bucket: str, prefix: str) -> str:
    import boto3

    client = boto3.client("s3")
    for path in sorted(tree.rglob("*")):
        if path.is_file():
            client.put_object(
                Bucket=bucket, Key=f"{prefix}/{path.relative_to(tree).as_posix()}", Body=path.read_bytes()
            )
    return f"s3://{bucket}/{prefix}"


def same_catalog(remote, local) -> None:
    assert remote.item_ids.equals(local.item_ids)
    np.testing.assert_array_equal(remote.packed.words, local.packed.words)
    np.testing.assert_array_equal(remote.packed.first, local.packed.first)
    assert remote.fingerprint == local.fingerprint  # the same bytes, wherever they are stored
    assert remote.rows == local.rows and remote.codebook_sizes == local.codebook_sizes


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize(
    ("remote_arg", "local_arg"),
    [
        ("{uri}/", "{root}"),  # a directory (prefix), searched recursively, _ and . names skipped
        ("{uri}", "{root}"),
        ("{uri}/part-1.parquet", "{root}/part-1.parquet"),  # one file
        ("{uri}/part-*.parquet", "{root}/part-*.parquet"),  # a glob: * stays in one component
        ("{uri}/**/*.parquet", "{root}/**/*.parquet"),  # ** spans directories
        ("{uri}/part-?.parquet", "{root}/part-?.parquet"),  # ? is a wildcard, not a query
        ("{uri}/part-[1].parquet", "{root}/part-[1].parquet"),  # [...] is a wildcard, not URI syntax
        ("{uri}/day=?/part-[0-9].parquet", "{root}/day=?/part-[0-9].parquet"),
        ("{uri}/*/part-?.parquet?region=us-east-1", "{root}/*/part-?.parquet"),  # URI options after a glob
    ],
)
def test_a_catalog_read_from_s3_equals_the_same_catalog_read_locally(
    s3_bucket, catalog_tree, remote_arg, local_arg, workers
):
    uri = upload(catalog_tree, s3_bucket, "exports/catalog")
    remote_path = remote_arg.format(uri=uri)
    local_path = local_arg.format(root=catalog_tree)
    remote_files = find_catalog_files(remote_path)
    local_files = find_catalog_files(local_path)
    assert [f.removeprefix(uri) for f in remote_files] == [
        f.removeprefix(str(catalog_tree)) for f in local_files
    ]
    assert all(f.startswith(f"s3://{s3_bucket}/") for f in remote_files)
    remote = read_catalog(remote_path, codebook_sizes=SIZES, pack=True, workers=workers)
    local = read_catalog(local_path, codebook_sizes=SIZES, pack=True, workers=workers)
    same_catalog(remote, local)
    assert remote.files == remote_files


def test_build_from_s3_publishes_the_bundle_a_local_build_publishes_and_verify_reads_s3(
    s3_bucket, s3_env, catalog_tree, tmp_path
):
    uri = upload(catalog_tree, s3_bucket, "exports/catalog") + "/"
    outputs = []
    for source, out in ((uri, tmp_path / "remote"), (str(catalog_tree), tmp_path / "local")):
        res = invoke("build", source, "-o", out, "--codebook-sizes", "6,6,6", "--json")
        assert res.exit_code == 0, res.output
        outputs.append(res.output)
    remote_dir, local_dir = tmp_path / "remote" / "v000001", tmp_path / "local" / "v000001"
    names = sorted(p.relative_to(remote_dir) for p in remote_dir.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(local_dir) for p in local_dir.rglob("*") if p.is_file())
    for name in names:
        if name.name != "manifest.json":
            assert (remote_dir / name).read_bytes() == (local_dir / name).read_bytes(), name
    remote_manifest = json.loads((remote_dir / "manifest.json").read_text())
    local_manifest = json.loads((local_dir / "manifest.json").read_text())
    assert remote_manifest["catalog"]["path"] == uri
    for key in ("fingerprint", "rows", "files", "distinct_sids"):
        assert remote_manifest["catalog"][key] == local_manifest["catalog"][key]
    assert remote_manifest["files"] == local_manifest["files"]

    verified = invoke("verify", remote_dir, "--catalog", uri)
    assert verified.exit_code == 0, verified.output
    outputs.append(verified.output)
    other = upload(catalog_tree / "day=1", s3_bucket, "other")  # a different catalog: not equal
    outputs.append(invoke("verify", remote_dir, "--catalog", other).output)
    outputs.append((remote_dir / "manifest.json").read_text())
    for text in outputs:
        assert s3_env["AWS_SECRET_ACCESS_KEY"] not in text and s3_env["AWS_ACCESS_KEY_ID"] not in text


@pytest.mark.parametrize(
    ("key", "body", "message"),
    [
        ("exports/missing.parquet", None, r"s3://{b}/exports/missing\.parquet: no such file or directory$"),
        (
            "exports/notes.parquet",
            b"these are not parquet bytes",
            r"s3://{b}/exports/notes\.parquet: not a readable Parquet file \(",
        ),
        ("exports/empty/", None, r"s3://{b}/exports/empty/: no such file or directory$"),
        ("exports/none-*.parquet", None, r"s3://{b}/exports/none-\*\.parquet: no files match this pattern$"),
    ],
)
def test_bad_remote_input_is_exit_2_with_one_line_naming_the_uri(
    s3_bucket, s3_env, tmp_path, key, body, message
):
    import boto3

    if body is not None:
        boto3.client("s3").put_object(Bucket=s3_bucket, Key=key, Body=body)
    res = invoke("build", f"s3://{s3_bucket}/{key}", "-o", tmp_path / "OUT", "--codebook-sizes", "6,6,6")
    line = one_error_line(res)
    assert re.search(message.format(b=s3_bucket), line), line
    assert s3_env["AWS_SECRET_ACCESS_KEY"] not in res.output and s3_env["AWS_ACCESS_KEY_ID"] not in res.output
    assert not (tmp_path / "OUT").exists() or not any((tmp_path / "OUT").glob("v*"))


def test_a_missing_bucket_and_a_directory_of_markers_only_are_one_line(s3_bucket, s3_env, tmp_path):
    import boto3

    res = invoke(
        "build", "s3://zerogr-no-such-bucket/x/", "-o", tmp_path / "OUT", "--codebook-sizes", "6,6,6"
    )
    line = one_error_line(res)
    assert "s3://zerogr-no-such-bucket/x/" in line
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="only/_SUCCESS", Body=b"")
    line = one_error_line(
        invoke("build", f"s3://{s3_bucket}/only/", "-o", tmp_path / "OUT", "--codebook-sizes", "6,6,6")
    )
    assert line.endswith(f"s3://{s3_bucket}/only/: directory holds no data files")


def test_credentials_in_the_uri_are_refused_and_never_shown(s3_bucket, s3_env, catalog_tree, tmp_path):
    """s3://KEY:SECRET@bucket/... would land in the manifest and in every message: refused, redacted."""
    upload(catalog_tree, s3_bucket, "exports/catalog")
    key, secret = s3_env["AWS_ACCESS_KEY_ID"], s3_env["AWS_SECRET_ACCESS_KEY"]
    for uri in (
        f"s3://{key}:{secret}@{s3_bucket}/exports/catalog/",
        f"s3://{s3_bucket}/exports/catalog/?secret_key={secret}&access_key={key}",
    ):
        res = invoke("build", uri, "-o", tmp_path / "OUT", "--codebook-sizes", "6,6,6")
        line = one_error_line(res)
        assert "credentials in a catalog URI are refused" in line
        assert secret not in res.output and key not in res.output
        assert not (tmp_path / "OUT").exists() or not any((tmp_path / "OUT").glob("v*"))
        with pytest.raises(InputError) as info:
            read_catalog(uri)
        assert secret not in str(info.value) and key not in str(info.value)


def test_build_output_and_logs_never_hold_the_credentials(s3_bucket, s3_env, catalog_tree, tmp_path):
    """Progress on stderr, the summary, the manifest: none holds the key id or the secret."""
    uri = upload(catalog_tree, s3_bucket, "exports/catalog")
    res = invoke("build", uri, "-o", tmp_path / "OUT", "--codebook-sizes", "6,6,6")
    assert res.exit_code == 0, res.output
    texts = [res.stdout, res.stderr, *(p.read_text() for p in (tmp_path / "OUT").rglob("*.json"))]
    for text in texts:
        assert s3_env["AWS_SECRET_ACCESS_KEY"] not in text and s3_env["AWS_ACCESS_KEY_ID"] not in text


def test_an_object_overwritten_after_its_footer_was_read_is_refused(s3_bucket, s3_env, tmp_path):
    """An upload replaces the object between the footer pass and the data: refused, naming the URI."""
    import boto3

    pq.write_table(part(500, 0, 1), tmp_path / "old.parquet", row_group_size=64)
    pq.write_table(part(700, 0, 2), tmp_path / "new.parquet", row_group_size=64)
    client = boto3.client("s3")
    client.put_object(Bucket=s3_bucket, Key="c/cat.parquet", Body=(tmp_path / "old.parquet").read_bytes())

    class Overwrite:
        def stage(self, name, total=None):
            if name == "read":
                client.put_object(
                    Bucket=s3_bucket, Key="c/cat.parquet", Body=(tmp_path / "new.parquet").read_bytes()
                )

        def advance(self, n=1):
            pass

    with pytest.raises(InputError, match=rf"^s3://{s3_bucket}/c/cat\.parquet: the file changed while"):
        read_catalog(f"s3://{s3_bucket}/c/cat.parquet", codebook_sizes=SIZES, progress=Overwrite())


def test_glob_rule_matches_pythons_glob(tmp_path):
    """The object-store glob applies glob.glob's rules (recursive=True) to object paths."""
    import glob

    from zerogr_build.catalog.storage import glob_match

    names = [
        "a/x.parquet",
        "a/b/x.parquet",
        "a/.h/x.parquet",
        "a/.x.parquet",
        "a/b/c/y.parquet",
        "a/x1.parquet",
        "a/[x].parquet",
        "b/x.parquet",
    ]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    patterns = [
        "a/*.parquet",
        "a/**/*.parquet",
        "a/**",
        "*/x?.parquet",
        "a/[xy]*.parquet",
        "**/x.parquet",
        "a/.*.parquet",
        "a/**/.h/*",
    ]
    for pattern in patterns:
        expected = {
            Path(p).relative_to(tmp_path).as_posix()
            for p in glob.glob(str(tmp_path / pattern), recursive=True)
            if Path(p).is_file()
        }
        assert {n for n in names if glob_match(n, pattern)} == expected, pattern
