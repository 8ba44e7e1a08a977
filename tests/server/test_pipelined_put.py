"""PutObject through the overlapping store path, over a real SeaweedFS with 5 MiB backend parts and no
compression, so that a few MiB of payload already make a streamed, multipart backend upload: bytes come
back in order, Content-MD5 is checked by the transform (BadDigest, nothing stored, the old version kept),
and a client that goes away mid-body leaves nothing behind."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.server.conftest import start_proxy
from tests.server.harness import ACCESS_KEY, SECRET_KEY, RunningProxy
from tests.support.seaweed import SeaweedFS
from tests.support.waiting import eventually

MIB = 1 << 20
WAIT = 30.0  # bound for what the server does within a fraction of a second


@pytest.fixture
def streaming(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningProxy]:
    running = start_proxy("seaweed", tmp_path, request, backend_part_size="5MiB", compression="off")
    yield running
    running.stop()


@pytest.fixture
def bucket(streaming: RunningProxy) -> str:
    name = f"t-{uuid.uuid4().hex[:16]}"
    streaming.client().create_bucket(Bucket=name)
    return name


def _md5_header(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def _backend_state(seaweed: SeaweedFS, bucket: str) -> tuple[set[str], list[Any]]:
    """The client objects tsproxy holds for `bucket` in the backend, and the backend's open uploads."""
    s3 = seaweed.boto3_client()
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])}
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    return {k for k in keys if ".tsproxy" not in k}, uploads


def _backend_calls(running: RunningProxy, operation: str) -> float:
    value = running.proxy.metrics.registry.get_sample_value(
        "tsproxy_backend_requests_total", {"operation": operation, "outcome": "ok"}
    )
    return value or 0.0


def _eventually(check: Callable[[], bool]) -> None:
    eventually(check, WAIT)


@pytest.mark.parametrize("size", [3 * MIB + 5, 23 * MIB + 12345])
def test_bytes_come_back_in_order(streaming: RunningProxy, bucket: str, size: int) -> None:
    s3 = streaming.client()
    data = os.urandom(size)
    put = s3.put_object(Bucket=bucket, Key="k", Body=data, ContentMD5=_md5_header(data))
    assert put["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == data
    first, last = size // 3, size // 3 + 5 * MIB
    got = s3.get_object(Bucket=bucket, Key="k", Range=f"bytes={first}-{last}")["Body"].read()
    assert got == data[first : last + 1]


@pytest.mark.parametrize("size", [100_000, 17 * MIB])
def test_a_wrong_content_md5_stores_nothing(
    streaming: RunningProxy, bucket: str, seaweed: SeaweedFS, size: int
) -> None:
    s3 = streaming.client()
    old = b"the version before" * 1000
    s3.put_object(Bucket=bucket, Key="k", Body=old)
    before = _backend_state(seaweed, bucket)
    created = _backend_calls(streaming, "CreateMultipartUpload")
    aborted = _backend_calls(streaming, "AbortMultipartUpload")
    data = os.urandom(size)
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="k", Body=data, ContentMD5=_md5_header(data + b"x"))
    error = exc.value.response
    assert (error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"]) == ("BadDigest", 400)
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == old
    assert _backend_state(seaweed, bucket) == before
    if size > 5 * MIB:
        # The stored bytes streamed into a backend upload, which the failed check aborted (boto3 may
        # send the request again after a BadDigest: each attempt's upload is aborted).
        begun = _backend_calls(streaming, "CreateMultipartUpload") - created
        assert begun >= 1
        assert _backend_calls(streaming, "AbortMultipartUpload") - aborted == begun
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="k", Body=data, ContentMD5="not base64!")
    assert exc.value.response["Error"]["Code"] == "InvalidDigest"


def test_upload_part_checks_content_md5_against_the_transform_s_md5(
    streaming: RunningProxy, bucket: str
) -> None:
    """A wrong Content-MD5 on a part, straight (large) or kept aside (small): BadDigest, nothing kept."""
    s3 = streaming.client()
    upload = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    data, small = os.urandom(6 * MIB), os.urandom(1000)
    for number, body in ((1, data), (2, small)):
        with pytest.raises(ClientError) as exc:
            s3.upload_part(
                Bucket=bucket, Key="mp", UploadId=upload, PartNumber=number, Body=body,
                ContentMD5=_md5_header(b"x"),
            )  # fmt: skip
        assert exc.value.response["Error"]["Code"] == "BadDigest"
    assert s3.list_parts(Bucket=bucket, Key="mp", UploadId=upload).get("Parts", []) == []
    parts = [
        s3.upload_part(
            Bucket=bucket, Key="mp", UploadId=upload, PartNumber=number, Body=body,
            ContentMD5=_md5_header(body),
        )["ETag"]
        for number, body in ((1, data), (2, small))
    ]  # fmt: skip
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="mp",
        UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": n + 1, "ETag": e} for n, e in enumerate(parts)]},
    )
    assert s3.get_object(Bucket=bucket, Key="mp")["Body"].read() == data + small


def _unsigned_put_head(url: str, length: int) -> bytes:
    headers = {"Content-Length": str(length)}
    request = AWSRequest(method="PUT", url=url, headers=headers)

    class Unsigned(S3SigV4Auth):
        def payload(self, request: AWSRequest) -> str:
            return "UNSIGNED-PAYLOAD"

    Unsigned(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(request)
    parts = urlsplit(url)
    lines = [f"PUT {parts.path} HTTP/1.1", f"Host: {parts.netloc}"]
    lines += [f"{name}: {value}" for name, value in request.headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_a_client_gone_mid_body_leaves_nothing(
    streaming: RunningProxy, bucket: str, seaweed: SeaweedFS
) -> None:
    before = _backend_state(seaweed, bucket)
    created = _backend_calls(streaming, "CreateMultipartUpload")
    aborted = _backend_calls(streaming, "AbortMultipartUpload")
    with socket.create_connection(("127.0.0.1", streaming.port), timeout=WAIT) as sock:
        sock.sendall(_unsigned_put_head(f"{streaming.endpoint}/{bucket}/gone", 40 * MIB))
        chunk = os.urandom(MIB)
        for _ in range(16):
            sock.sendall(chunk)
        # The stored bytes are streaming into a backend upload by now; then the client goes away.
        _eventually(lambda: _backend_calls(streaming, "CreateMultipartUpload") > created)
    _eventually(lambda: _backend_calls(streaming, "AbortMultipartUpload") > aborted)
    assert _backend_state(seaweed, bucket) == before
    with pytest.raises(ClientError):
        streaming.client().head_object(Bucket=bucket, Key="gone")
    # The server is none the worse for it.
    streaming.client().put_object(Bucket=bucket, Key="after", Body=b"fine")
    assert streaming.client().get_object(Bucket=bucket, Key="after")["Body"].read() == b"fine"
