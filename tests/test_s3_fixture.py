"""The test S3 server is a real S3 API: conditional writes are enforced and pyarrow reads through it."""

import pytest


def test_server_enforces_conditional_writes_and_pyarrow_reads_it(s3_bucket):
    import boto3
    from botocore.exceptions import ClientError
    from pyarrow import fs as pafs

    client = boto3.client("s3")
    first = client.put_object(Bucket=s3_bucket, Key="k", Body=b"one", IfNoneMatch="*")
    with pytest.raises(ClientError, match="PreconditionFailed"):
        client.put_object(Bucket=s3_bucket, Key="k", Body=b"two", IfNoneMatch="*")
    with pytest.raises(ClientError, match="PreconditionFailed"):
        client.put_object(Bucket=s3_bucket, Key="k", Body=b"two", IfMatch='"not-the-etag"')
    client.put_object(Bucket=s3_bucket, Key="k", Body=b"three", IfMatch=first["ETag"])
    filesystem, path = pafs.FileSystem.from_uri(f"s3://{s3_bucket}/k")
    with filesystem.open_input_stream(path) as stream:
        assert stream.read() == b"three"
