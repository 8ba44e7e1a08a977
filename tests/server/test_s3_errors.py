"""Bad input gets the S3 error S3 gives: code, status and XML body; nothing is stored."""

from __future__ import annotations

import urllib.parse
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from unittest import mock

import boto3
import pytest
import urllib3
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.server.harness import ACCESS_KEY, SECRET_KEY, RunningProxy

NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
http = urllib3.PoolManager(retries=False)


def _signed(
    method: str,
    url: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    secret: str = SECRET_KEY,
    when: datetime | None = None,
) -> urllib3.BaseHTTPResponse:
    req = AWSRequest(method=method, url=url, data=body, headers=headers or {})
    streaming = (headers or {}).get("x-amz-content-sha256", "")
    auth = (_StreamingAuth if streaming.startswith("STREAMING-") else S3SigV4Auth)(
        Credentials(ACCESS_KEY, secret), "s3", "us-east-1"
    )
    with mock.patch(
        "botocore.auth.get_current_datetime", lambda: (when or datetime.now(UTC)).replace(tzinfo=None)
    ):
        auth.add_auth(req)
    return http.request(method, url, body=body, headers=dict(req.headers.items()))


class _StreamingAuth(S3SigV4Auth):
    """Signs an aws-chunked request the way SDKs do: the payload hash is the streaming mode's name."""

    def payload(self, request: AWSRequest) -> str:
        return "STREAMING-UNSIGNED-PAYLOAD-TRAILER"


def _error(resp: urllib3.BaseHTTPResponse) -> tuple[int, str]:
    root = ET.fromstring(resp.data)
    assert root.tag == "Error", resp.data
    assert root.find("RequestId") is not None and root.find("Message") is not None
    return resp.status, root.findtext("Code") or ""


@pytest.fixture
def weed_bucket(local_proxy: RunningProxy) -> str:
    local_proxy.client().create_bucket(Bucket="errs")
    return "errs"


def test_wrong_secret_and_unknown_key(local_proxy: RunningProxy, weed_bucket: str) -> None:
    url = f"{local_proxy.endpoint}/{weed_bucket}/k"
    assert _error(_signed("PUT", url, b"x", secret="wrong")) == (403, "SignatureDoesNotMatch")
    bad = boto3.client(
        "s3",
        endpoint_url=local_proxy.endpoint,
        aws_access_key_id="nobody",
        aws_secret_access_key="x",
        region_name="us-east-1",
    )
    with pytest.raises(ClientError) as exc:
        bad.list_buckets()
    assert exc.value.response["Error"]["Code"] == "InvalidAccessKeyId"
    resp = http.request("GET", f"{local_proxy.endpoint}/{weed_bucket}/k")
    assert _error(resp) == (403, "AccessDenied")


def test_tampered_request_fails(local_proxy: RunningProxy, weed_bucket: str) -> None:
    url = f"{local_proxy.endpoint}/{weed_bucket}/k"
    req = AWSRequest(method="PUT", url=url, data=b"payload", headers={"x-amz-meta-a": "1"})
    S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(req)
    headers = dict(req.headers.items())
    headers["x-amz-meta-a"] = "2"
    assert _error(http.request("PUT", url, body=b"payload", headers=headers)) == (
        403,
        "SignatureDoesNotMatch",
    )
    # The body does not match the signed SHA-256: rejected and nothing stored.
    req = AWSRequest(method="PUT", url=url, data=b"payload", headers={})
    S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(req)
    resp = http.request("PUT", url, body=b"paylo4d", headers=dict(req.headers.items()))
    assert _error(resp) == (400, "XAmzContentSHA256Mismatch")
    with pytest.raises(ClientError):
        local_proxy.client().head_object(Bucket=weed_bucket, Key="k")


def test_clock_skew(local_proxy: RunningProxy, weed_bucket: str) -> None:
    url = f"{local_proxy.endpoint}/{weed_bucket}"
    resp = _signed("GET", url, when=datetime.now(UTC) - timedelta(hours=1))
    assert _error(resp) == (403, "RequestTimeTooSkewed")


def test_presigned_urls(local_proxy: RunningProxy, weed_bucket: str) -> None:
    s3 = local_proxy.client(signature_version="s3v4")
    s3.put_object(Bucket=weed_bucket, Key="p", Body=b"presigned body")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": weed_bucket, "Key": "p"}, ExpiresIn=60)
    assert http.request("GET", url).data == b"presigned body"
    req = AWSRequest(method="GET", url=f"{local_proxy.endpoint}/{weed_bucket}/p")
    signer = S3SigV4QueryAuth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1", expires=1)
    past = (datetime.now(UTC) - timedelta(seconds=30)).replace(tzinfo=None)
    with mock.patch("botocore.auth.get_current_datetime", lambda: past):
        signer.add_auth(req)
    assert _error(http.request("GET", req.url)) == (403, "AccessDenied")
    put_url = s3.generate_presigned_url(
        "put_object", Params={"Bucket": weed_bucket, "Key": "pp"}, ExpiresIn=60
    )
    assert http.request("PUT", put_url, body=b"via presigned put").status == 200
    assert s3.get_object(Bucket=weed_bucket, Key="pp")["Body"].read() == b"via presigned put"


def test_malformed_xml(local_proxy: RunningProxy, weed_bucket: str) -> None:
    url = f"{local_proxy.endpoint}/{weed_bucket}?delete"
    body = b"<Delete><Object><Key>a</Key></Object"
    import base64
    import hashlib

    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    assert _error(_signed("POST", url, body, {"Content-MD5": md5})) == (400, "MalformedXML")
    bomb = (
        b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaaaaaa">]>'
        b"<Delete><Object><Key>&a;</Key></Object></Delete>"
    )
    md5 = base64.b64encode(hashlib.md5(bomb).digest()).decode()
    assert _error(_signed("POST", url, bomb, {"Content-MD5": md5}))[1] == "MalformedXML"


def test_bad_aws_chunked_framing(local_proxy: RunningProxy, weed_bucket: str) -> None:
    url = f"{local_proxy.endpoint}/{weed_bucket}/chunked"
    body = b"5\r\nhello\r\nZZ\r\n"  # not hex
    headers = {
        "Content-Encoding": "aws-chunked",
        "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        "x-amz-decoded-content-length": "5",
        "x-amz-trailer": "x-amz-checksum-crc32",
    }
    status, code = _error(_signed("PUT", url, body, headers))
    assert status == 400 and code in ("IncompleteBody", "InvalidRequest", "InvalidArgument")
    good_body = b"5\r\nhello\r\n0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n"  # wrong checksum value
    status, code = _error(_signed("PUT", url, good_body, headers))
    assert (status, code) == (400, "BadDigest")
    with pytest.raises(ClientError):
        local_proxy.client().head_object(Bucket=weed_bucket, Key="chunked")


def test_not_implemented(local_proxy: RunningProxy, weed_bucket: str) -> None:
    resp = _signed("GET", f"{local_proxy.endpoint}/{weed_bucket}?tagging")
    assert _error(resp) == (501, "NotImplemented")
    resp = _signed("PUT", f"{local_proxy.endpoint}/{weed_bucket}?lifecycle", b"<x/>")
    assert _error(resp) == (501, "NotImplemented")


def test_invalid_bucket_name(local_proxy: RunningProxy) -> None:
    resp = _signed("PUT", f"{local_proxy.endpoint}/Bad_Bucket")
    assert _error(resp) == (400, "InvalidBucketName")


@pytest.mark.parametrize(
    "digits", ["\u00b9", "\u0661", "\uff11"]
)  # superscript one, Arabic-Indic one, fullwidth one
def test_numbers_in_other_scripts_are_refused_not_crashed_on(
    local_proxy: RunningProxy, weed_bucket: str, digits: str
) -> None:
    """str.isdigit() is true of these, int() of some fails: each must be a 400, never a 500."""
    s3 = local_proxy.client()
    s3.put_object(Bucket=weed_bucket, Key="k", Body=b"x")
    quoted = urllib.parse.quote(digits)
    url = f"{local_proxy.endpoint}/{weed_bucket}/k"
    assert _error(_signed("GET", f"{url}?partNumber={quoted}")) == (400, "InvalidArgument")
    upload = s3.create_multipart_upload(Bucket=weed_bucket, Key="k")["UploadId"]
    status, _ = _error(_signed("PUT", f"{url}?partNumber={quoted}&uploadId={upload}", b"x"))
    assert status == 400
    status, _ = _error(_signed("GET", f"{url}?uploadId={upload}&part-number-marker={quoted}"))
    assert status == 400
    complete = (
        "<CompleteMultipartUpload><Part><PartNumber>" + digits + '</PartNumber><ETag>"e"</ETag></Part>'
        "</CompleteMultipartUpload>"
    ).encode()
    status, _ = _error(_signed("POST", f"{url}?uploadId={upload}", complete))
    assert status == 400
