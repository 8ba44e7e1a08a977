"""`format_version`: new objects, single PUTs and multipart uploads alike, are written in the version the
setting names (1 while older instances still read the bucket), and every instance reads both."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.server.conftest import start_proxy
from tests.server.harness import RunningProxy

MIB = 1 << 20


def _text(size: int) -> bytes:
    line = b'{"offset": %d, "key": "user-%d", "value": "clicked"}\n'
    out = bytearray()
    i = 0
    while len(out) < size:
        out += line % (i, i % 97)
        i += 1
    return bytes(out[:size])


def _version(proxy: RunningProxy, bucket: str, key: str) -> int:
    service = proxy.proxy.service
    assert service is not None
    service.invalidate(bucket, key)
    obj = proxy.call(service.resolve(bucket, key))
    assert obj.manifest is not None
    return int(obj.manifest.version)


@pytest.mark.parametrize("kind", ["local", "seaweed"])
@pytest.mark.parametrize("version", [1, 2])
def test_objects_are_written_in_the_configured_version_and_read_by_any_instance(
    kind: str, version: int, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    writer = start_proxy(kind, tmp_path, request, chunk_size="2MiB", format_version=str(version))
    (tmp_path / "reader").mkdir()
    shared = {"key_ring": str(tmp_path / "ring.json")}
    if kind == "local":
        shared["backend"] = f"file://{tmp_path / 'data'}"
    reader = start_proxy(kind, tmp_path / "reader", request, chunk_size="2MiB", **shared)  # writes 2
    try:
        s3 = writer.client()
        bucket = f"t-{uuid.uuid4().hex[:12]}"
        s3.create_bucket(Bucket=bucket)
        single = _text(5 * MIB + 123)
        s3.put_object(Bucket=bucket, Key="single", Body=single)
        parts = [_text(6 * MIB), _text(6 * MIB)[::-1], os.urandom(1000)]
        uid = s3.create_multipart_upload(Bucket=bucket, Key="multi")["UploadId"]
        done = [
            {
                "PartNumber": n,
                "ETag": s3.upload_part(Bucket=bucket, Key="multi", UploadId=uid, PartNumber=n, Body=b)[
                    "ETag"
                ],
            }
            for n, b in enumerate(parts, 1)
        ]
        s3.complete_multipart_upload(
            Bucket=bucket, Key="multi", UploadId=uid, MultipartUpload={"Parts": done}
        )
        assert _version(writer, bucket, "single") == version
        assert _version(writer, bucket, "multi") == version
        other = reader.client()
        assert other.get_object(Bucket=bucket, Key="single")["Body"].read() == single
        assert other.get_object(Bucket=bucket, Key="multi")["Body"].read() == b"".join(parts)
        # A seek into the second frame of a chunk reads the same bytes from either version.
        got = other.get_object(Bucket=bucket, Key="single", Range="bytes=1500000-1600000")["Body"].read()
        assert got == single[1_500_000:1_600_001]
    finally:
        reader.stop()
        writer.stop()
