"""Finding 7 of issue 31: bad input got 500 and a logged traceback where S3 answers 400 or 403.

Each request here is one an unauthenticated (or merely odd) client can send; each must get S3's XML
error with the status S3 gives, and leave no traceback in the log.
"""

from __future__ import annotations

import logging
import socket
import urllib.parse
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import urllib3
from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.server.harness import ACCESS_KEY, SECRET_KEY, RunningProxy
from tests.support.seaweed import SeaweedFS

http = urllib3.PoolManager(retries=False)


@pytest.fixture
def served(restartable: Any) -> Iterator[tuple[RunningProxy, str]]:
    proxy = restartable("local").proxy
    bucket = f"h-{uuid.uuid4().hex[:12]}"
    s3 = proxy.client()
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="k", Body=b"hello")
    yield proxy, bucket


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def _error(response: Any) -> tuple[int, str]:
    body = response.data.decode()
    assert response.headers["Content-Type"].startswith("application/xml"), body
    code = body.split("<Code>", 1)[1].split("</Code>", 1)[0]
    return response.status, code


def _presign(url: str, when: datetime, expires: int = 3600) -> str:
    request = AWSRequest(method="GET", url=url)
    auth = S3SigV4QueryAuth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1", expires=expires)
    import botocore.auth

    real = botocore.auth.get_current_datetime
    botocore.auth.get_current_datetime = lambda: when.replace(tzinfo=None)  # type: ignore[assignment]
    try:
        auth.add_auth(request)
    finally:
        botocore.auth.get_current_datetime = real
    return str(request.url)


def test_sigv2_expires_past_the_last_datetime(
    served: tuple[RunningProxy, str], caplog: pytest.LogCaptureFixture
) -> None:
    proxy, bucket = served
    for expires in ("999999999999", "253402300800"):  # year 33658; one second past 9999-12-31
        url = f"{proxy.endpoint}/{bucket}/k?AWSAccessKeyId={ACCESS_KEY}&Expires={expires}&Signature=abc"
        assert _error(http.request("GET", url)) == (403, "SignatureDoesNotMatch")
        url = f"{proxy.endpoint}/{bucket}/k?AWSAccessKeyId=nobody&Expires={expires}&Signature=abc"
        assert _error(http.request("GET", url)) == (403, "InvalidAccessKeyId")
    assert _tracebacks(caplog) == []


def test_sigv4_presign_dated_in_year_9999(
    served: tuple[RunningProxy, str], caplog: pytest.LogCaptureFixture
) -> None:
    proxy, bucket = served
    url = _presign(f"{proxy.endpoint}/{bucket}/k", datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC), 604800)
    assert "X-Amz-Date=99991231T235959Z" in url
    assert _error(http.request("GET", url)) == (403, "AccessDenied")
    # And one that is signed now is served: the presigning above is sound.
    url = _presign(f"{proxy.endpoint}/{bucket}/k", datetime.now(UTC))
    assert http.request("GET", url).data == b"hello"
    assert _tracebacks(caplog) == []


@pytest.mark.parametrize(
    "param", ["response-content-type", "response-content-disposition", "response-expires"]
)
@pytest.mark.parametrize("value", ["a\r\nX-Evil: 1", "a\nb", "a\x00b"])
def test_control_characters_in_a_response_override(
    served: tuple[RunningProxy, str], caplog: pytest.LogCaptureFixture, param: str, value: str
) -> None:
    proxy, bucket = served
    query = urllib.parse.urlencode({param: value})
    url = _presign(f"{proxy.endpoint}/{bucket}/k?{query}", datetime.now(UTC))
    response = http.request("GET", url)
    assert _error(response) == (400, "InvalidArgument")
    assert "X-Evil" not in response.headers
    assert _tracebacks(caplog) == []


@pytest.mark.seaweed
def test_backend_metadata_that_decodes_to_control_characters(
    seaweed: SeaweedFS, restartable: Any, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = restartable("seaweed")
    s3 = proxy.client()
    bucket = f"h-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    # Written straight into the backend (passthrough): its metadata is percent-decoded when served.
    seaweed.boto3_client().put_object(
        Bucket=bucket,
        Key="planted",
        Body=b"data",
        Metadata={"note": "a%0D%0AX-Evil: 1", "plain": "ok"},
        ContentType="text/plain%0D%0AX-Evil: 2",
    )
    head = s3.head_object(Bucket=bucket, Key="planted")
    got = s3.get_object(Bucket=bucket, Key="planted")
    assert got["Body"].read() == b"data"
    for answer in (head, got):
        headers = answer["ResponseMetadata"]["HTTPHeaders"]
        assert "x-evil" not in headers
        assert answer["Metadata"]["plain"] == "ok"
        assert answer["Metadata"]["note"].startswith("=?UTF-8?B?")
    assert _tracebacks(caplog) == []


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.mark.parametrize(
    "request_bytes, code",
    [
        (
            b"GET /b/k HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 70000 + b"\r\n\r\n",
            "RequestHeaderSectionTooLarge",
        ),
        (b"GET /b/" + b"k" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", "RequestHeaderSectionTooLarge"),
        (
            b"GET /b/k HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: 1\r\n" % i for i in range(200)) + b"\r\n",
            None,
        ),
        (b"GET /b/k HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n", "BadRequest"),
    ],
    ids=["long-header", "long-request-line", "many-headers", "malformed-header"],
)
def test_requests_aiohttp_cannot_parse(
    served: tuple[RunningProxy, str], caplog: pytest.LogCaptureFixture, request_bytes: bytes, code: str | None
) -> None:
    proxy, _ = served
    answer = _raw(proxy.port, request_bytes)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ", 2)[1] == b"400", head
    assert b"Content-Type: application/xml" in head
    assert body.startswith(b"<?xml") or body.startswith(b"<Error>"), body
    if code is not None:
        assert f"<Code>{code}</Code>".encode() in body
    assert _tracebacks(caplog) == []
