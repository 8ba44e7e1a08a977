"""Finding 8 of issue 31: where tsproxy answered differently from S3.

- a key holding a line feed (`%0A`) got aiohttp's plain 404 (no S3 error, no access line);
- a PUT with `Transfer-Encoding: chunked` and no length was accepted (S3: 411 MissingContentLength);
- aws-chunked bodies of 1-byte chunks were accepted (S3 wants 8 KiB in every chunk but the last);
- `partNumber=01` was taken for 1 (S3: 400 InvalidArgument);
- a backend error's `<Key>` named the backend's key (tenant prefix, escaped form) instead of the client's.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3

from tests.s3.s3_helpers import sign_with_botocore
from tests.server.harness import ACCESS_KEY, SECRET_KEY, RunningProxy
from tsproxy import errors
from tsproxy.server.dispatch import in_client_names
from tsproxy.service.namespace import Namespace

http = urllib3.PoolManager(retries=False)


@pytest.fixture
def served(restartable: Any) -> Iterator[tuple[RunningProxy, str]]:
    proxy = restartable("local", access_log=True).proxy
    bucket = f"h-{uuid.uuid4().hex[:12]}"
    proxy.client().create_bucket(Bucket=bucket)
    yield proxy, bucket


def _signed(method: str, url: str, payload: str, headers: dict[str, str] | None = None) -> dict[str, str]:
    wire = sign_with_botocore(
        method, url, headers=headers, payload=payload, secret=SECRET_KEY, access_key=ACCESS_KEY
    )
    return dict(wire.headers)


def _code(response: Any) -> tuple[int, str]:
    body = response.data.decode()
    assert "<Code>" in body, (response.status, body)
    return response.status, body.split("<Code>", 1)[1].split("</Code>", 1)[0]


def test_a_key_with_a_line_feed_is_an_s3_key(
    served: tuple[RunningProxy, str], caplog: pytest.LogCaptureFixture
) -> None:
    proxy, bucket = served
    s3 = proxy.client()
    caplog.set_level(logging.INFO, logger="tsproxy.access")
    missing = http.request(
        "GET",
        f"{proxy.endpoint}/{bucket}/a%0Ab",
        headers=_signed("GET", f"{proxy.endpoint}/{bucket}/a%0Ab", "UNSIGNED-PAYLOAD"),
    )
    assert _code(missing) == (404, "NoSuchKey")
    assert any(r.name == "tsproxy.access" for r in caplog.records)
    s3.put_object(Bucket=bucket, Key="line\nfeed", Body=b"lf")
    s3.put_object(Bucket=bucket, Key="carriage\r\nreturn", Body=b"crlf")
    assert s3.get_object(Bucket=bucket, Key="line\nfeed")["Body"].read() == b"lf"
    assert s3.get_object(Bucket=bucket, Key="carriage\r\nreturn")["Body"].read() == b"crlf"
    listed = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert listed == {"line\nfeed", "carriage\r\nreturn"}


def test_a_chunked_put_without_a_length_is_411(served: tuple[RunningProxy, str]) -> None:
    proxy, bucket = served
    url = f"{proxy.endpoint}/{bucket}/streamed"
    headers = _signed("PUT", url, "UNSIGNED-PAYLOAD")
    headers.pop("Content-Length", None)
    response = http.request("PUT", url, headers=headers, body=iter([b"abc", b"def"]), chunked=True)
    assert _code(response) == (411, "MissingContentLength")
    assert _code(http.request("GET", url, headers=_signed("GET", url, "UNSIGNED-PAYLOAD")))[1] == "NoSuchKey"


def _aws_chunked(sizes: list[int]) -> tuple[bytes, int]:
    body = b"".join(b"%x\r\n" % n + b"x" * n + b"\r\n" for n in sizes) + b"0\r\n\r\n"
    return body, sum(sizes)


@pytest.mark.parametrize(
    "sizes, ok",
    [([1, 1, 1], False), ([100, 8192], False), ([8192, 8192, 5], True), ([5], True)],
    ids=["one-byte-chunks", "short-then-long", "short-last", "one-short"],
)
def test_aws_chunked_chunks_of_at_least_8_kib_but_the_last(
    served: tuple[RunningProxy, str], sizes: list[int], ok: bool
) -> None:
    proxy, bucket = served
    url = f"{proxy.endpoint}/{bucket}/chunky"
    body, length = _aws_chunked(sizes)
    headers = _signed(
        "PUT",
        url,
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        {
            "Content-Encoding": "aws-chunked",
            "x-amz-decoded-content-length": str(length),
            "Content-Length": str(len(body)),
        },
    )
    response = http.request("PUT", url, headers=headers, body=body)
    if ok:
        assert response.status == 200, response.data
        assert proxy.client().get_object(Bucket=bucket, Key="chunky")["Body"].read() == b"x" * length
    else:
        assert _code(response) == (403, "InvalidChunkSizeError")


@pytest.mark.parametrize("raw", ["01", "001", "0", "+1", "1.0", "10001"])
def test_part_numbers_s3_refuses(served: tuple[RunningProxy, str], raw: str) -> None:
    proxy, bucket = served
    s3 = proxy.client()
    s3.put_object(Bucket=bucket, Key="whole", Body=b"abc")
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="parts")["UploadId"]
    url = f"{proxy.endpoint}/{bucket}/parts?partNumber={raw}&uploadId={upload_id}"
    put = http.request("PUT", url, headers=_signed("PUT", url, "UNSIGNED-PAYLOAD"), body=b"data")
    assert _code(put) == (400, "InvalidArgument")
    url = f"{proxy.endpoint}/{bucket}/whole?partNumber={raw}"
    assert _code(http.request("GET", url, headers=_signed("GET", url, "UNSIGNED-PAYLOAD"))) == (
        400,
        "InvalidArgument",
    )
    assert s3.list_parts(Bucket=bucket, Key="parts", UploadId=upload_id).get("Parts", []) == []


@pytest.mark.parametrize("mapped", [False, True])
def test_backend_errors_name_the_clients_key(mapped: bool) -> None:
    ns = Namespace("shared", "tenant/") if mapped else Namespace()
    for key in ("plain.log", "/escaped", "a\\b"):
        backend = ns.object("bkt", key)
        err = errors.NoSuchKey(Key=backend.key, BucketName=backend.bucket)
        in_client_names(err, ns, "bkt", key)
        assert (err.fields["Key"], err.fields["BucketName"]) == (key, "bkt")
        # The source of a copy (another key of the bucket) is named as the client knows it too.
        err = errors.NoSuchKey(Key=backend.key)
        in_client_names(err, ns, "bkt", "destination")
        assert err.fields["Key"] == key
    # tsproxy's own state is never named.
    err = errors.NoSuchKey(Key=ns.internal("bkt", "mpu/x/state").key)
    in_client_names(err, ns, "bkt", "k")
    assert "Key" not in err.fields
