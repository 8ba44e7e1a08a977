"""Real clients other than boto3: the aws cli and pyarrow's S3 filesystem; passthrough objects."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.server.harness import ACCESS_KEY, SECRET_KEY, RunningProxy


def _aws(proxy: RunningProxy, *args: str) -> subprocess.CompletedProcess[str]:
    aws = shutil.which("aws")
    if aws is None:
        pytest.fail("the aws cli is not installed (make test installs it under .tools/awscli)")
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }
    proc = subprocess.run(
        [aws, "--endpoint-url", proxy.endpoint, *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"aws {' '.join(args)} failed: {proc.stderr}"
    return proc


@pytest.mark.slow
def test_aws_cli_100mib_multipart_and_range(proxy: RunningProxy, bucket: str, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    block = os.urandom(1 << 20)
    with src.open("wb") as f:
        for i in range(100):
            f.write(block[i:] + block[:i])
    _aws(proxy, "s3", "cp", str(src), f"s3://{bucket}/big.bin")  # 8 MiB parts, 10 in parallel
    dst = tmp_path / "back.bin"
    _aws(proxy, "s3", "cp", f"s3://{bucket}/big.bin", str(dst))
    assert hashlib.md5(dst.read_bytes()).digest() == hashlib.md5(src.read_bytes()).digest()
    part = tmp_path / "part.bin"
    _aws(
        proxy,
        "s3api",
        "get-object",
        "--bucket",
        bucket,
        "--key",
        "big.bin",
        "--range",
        "bytes=12345678-23456789",
        str(part),
    )
    with src.open("rb") as f:
        f.seek(12345678)
        assert part.read_bytes() == f.read(23456789 - 12345678 + 1)
    listing = _aws(proxy, "s3", "ls", f"s3://{bucket}/")
    assert str(100 << 20) in listing.stdout


def test_pyarrow_parquet_through_proxy(proxy: RunningProxy, bucket: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import fs

    s3fs = fs.S3FileSystem(
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        endpoint_override=proxy.endpoint,
        scheme="http",
        region="us-east-1",
        allow_bucket_creation=False,
    )
    table = pa.table({"offset": list(range(50_000)), "value": [f"record-{i}" for i in range(50_000)]})
    pq.write_table(table, f"{bucket}/data/part-0.parquet", filesystem=s3fs, row_group_size=10_000)
    back = pq.read_table(f"{bucket}/data/part-0.parquet", filesystem=s3fs)
    assert back.equals(table)
    # Column projection reads ranges of the file, not the whole object.
    only = pq.read_table(f"{bucket}/data/part-0.parquet", filesystem=s3fs, columns=["offset"])
    assert only.column("offset").to_pylist() == list(range(50_000))


def test_passthrough_objects_served_as_they_are(weed_proxy: RunningProxy, seaweed: object) -> None:
    direct = seaweed.boto3_client()  # type: ignore[attr-defined]
    direct.create_bucket(Bucket="legacy")
    data = os.urandom(300_000)
    direct.put_object(Bucket="legacy", Key="old/segment.log", Body=data, Metadata={"origin": "before"})
    s3 = weed_proxy.client()
    head = s3.head_object(Bucket="legacy", Key="old/segment.log")
    assert head["ContentLength"] == len(data) and head["Metadata"] == {"origin": "before"}
    assert s3.get_object(Bucket="legacy", Key="old/segment.log")["Body"].read() == data
    assert (
        s3.get_object(Bucket="legacy", Key="old/segment.log", Range="bytes=10-19")["Body"].read()
        == data[10:20]
    )
    listed = s3.list_objects_v2(Bucket="legacy")["Contents"]
    assert [(o["Key"], o["Size"]) for o in listed] == [("old/segment.log", len(data))]


def test_stored_bytes_are_transformed(weed_proxy: RunningProxy, seaweed: object) -> None:
    s3 = weed_proxy.client()
    s3.create_bucket(Bucket="secret-stuff")
    plain = b"very secret kafka record value " * 10_000
    s3.put_object(Bucket="secret-stuff", Key="k", Body=plain)
    stored = seaweed.boto3_client().get_object(Bucket="secret-stuff", Key="k")["Body"].read()  # type: ignore[attr-defined]
    assert b"very secret" not in stored
    assert len(stored) < len(plain) // 5  # compressed before it was encrypted
