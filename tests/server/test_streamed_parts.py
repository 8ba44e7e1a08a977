"""Parts stored uncompressed (a Kafka segment whose producer compressed its batches, or compression off)
have a stored size known from their declared length: they go to the backend as they are received and
sealed, not after their last byte. Over SeaweedFS and the local store, with real clients."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest

from tests.server.conftest import start_proxy
from tests.server.test_backend_requests import _delta, _requests, upload_objects
from tests.support.kafka_batches import producer_batch

MIB = 1 << 20
CODEC_ZSTD = 4


def compressed_segment(size: int) -> bytes:
    """Producer-compressed (zstd) record batches, about `size` bytes: tsproxy stores them as they are."""
    out = bytearray()
    base = 0
    while len(out) < size:
        values = [os.urandom(64).hex().encode() * 4 for _ in range(200)]
        out += producer_batch(CODEC_ZSTD, values, base_offset=base)
        base += len(values)
    return bytes(out[:size])


@pytest.mark.parametrize("kind", ["local", "seaweed"])
def test_parts_larger_than_a_backend_part_go_straight_when_stored_as_they_are(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # Parts of 6 MiB against 5 MiB backend parts: held whole, each would be a part too big to buffer and
    # be stored aside, then copied at completion; streamed, each is a backend part of its own.
    proxy = start_proxy(kind, tmp_path, request, backend_part_size="5MiB", janitor_interval="0")
    try:
        s3 = proxy.client()
        bucket = f"t-{uuid.uuid4().hex[:12]}"
        s3.create_bucket(Bucket=bucket)
        data = compressed_segment(12 * MIB + 1000)
        bodies = [data[: 6 * MIB], data[6 * MIB : 12 * MIB], data[12 * MIB :]]
        before = _requests(proxy)
        uid = s3.create_multipart_upload(Bucket=bucket, Key="seg.log")["UploadId"]
        parts = []
        for no, body in enumerate(bodies, 1):
            etag = s3.upload_part(Bucket=bucket, Key="seg.log", UploadId=uid, PartNumber=no, Body=body)[
                "ETag"
            ]
            parts.append({"PartNumber": no, "ETag": etag})
        assert upload_objects(proxy, bucket, uid) == set()  # nothing stored aside
        s3.complete_multipart_upload(
            Bucket=bucket, Key="seg.log", UploadId=uid, MultipartUpload={"Parts": parts}
        )
        spent = _delta(before, _requests(proxy))
        assert s3.get_object(Bucket=bucket, Key="seg.log")["Body"].read() == data
        got = s3.get_object(Bucket=bucket, Key="seg.log", Range=f"bytes={6 * MIB - 5}-{6 * MIB + 4}")["Body"]
        assert got.read() == data[6 * MIB - 5 : 6 * MIB + 5]
        assert spent.get("UploadPartCopy", 0) == 0 and spent.get("PutObject", 0) == 0, spent
        assert spent["UploadPart"] == len(bodies), spent  # the small last part rides with the tail
    finally:
        proxy.stop()


@pytest.mark.parametrize("kind", ["local", "seaweed"])
def test_a_part_whose_client_stops_short_stores_nothing_and_its_earlier_upload_stays(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    proxy = start_proxy(kind, tmp_path, request, janitor_interval="0")
    try:
        s3 = proxy.client()
        bucket = f"t-{uuid.uuid4().hex[:12]}"
        s3.create_bucket(Bucket=bucket)
        data = compressed_segment(6 * MIB + 500)
        uid = s3.create_multipart_upload(Bucket=bucket, Key="seg.log")["UploadId"]
        good = s3.upload_part(Bucket=bucket, Key="seg.log", UploadId=uid, PartNumber=1, Body=data[: 6 * MIB])
        # The same part again, signed for 6 MiB, but the client hangs up after 3 MiB: streamed to the
        # backend as it came, that request is cut off there, and the backend keeps the first upload.
        url = s3.generate_presigned_url(
            "upload_part",
            Params={"Bucket": bucket, "Key": "seg.log", "UploadId": uid, "PartNumber": 1},
        )
        path = url.split(proxy.endpoint, 1)[1]
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            head = f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1:{proxy.port}\r\nContent-Length: {6 * MIB}\r\n\r\n"
            sock.sendall(head.encode())
            sock.sendall(os.urandom(3 * MIB))
        last = s3.upload_part(Bucket=bucket, Key="seg.log", UploadId=uid, PartNumber=2, Body=data[6 * MIB :])
        parts = [{"PartNumber": 1, "ETag": good["ETag"]}, {"PartNumber": 2, "ETag": last["ETag"]}]
        s3.complete_multipart_upload(
            Bucket=bucket, Key="seg.log", UploadId=uid, MultipartUpload={"Parts": parts}
        )
        assert s3.get_object(Bucket=bucket, Key="seg.log")["Body"].read() == data
    finally:
        proxy.stop()
