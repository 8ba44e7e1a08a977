"""SigV4 verification against real signers (botocore, boto3) and AWS's published examples."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from tests.s3.s3_helpers import (
    ACCESS_KEY,
    SECRET_KEY,
    Wire,
    boto3_client,
    boto3_wire,
    presign_with_botocore,
    secret_for,
    sign_with_botocore,
    signing_key,
)
from tsproxy import errors
from tsproxy.s3 import routing, sigv4
from tsproxy.server.routes import ROUTES


def check(wire: Wire, now: datetime | None = None, **kwargs: Any) -> sigv4.AuthResult:
    when = now if now is not None else _signed_time(wire)
    return sigv4.verify(wire.method, wire.path, wire.query, wire.headers, secret_for, when, **kwargs)


def _signed_time(wire: Wire) -> datetime:
    if "x-amz-date" in wire.headers:
        return wire.signed_at
    for piece in wire.query.split("&"):
        if piece.startswith("X-Amz-Date="):
            return datetime.strptime(piece.split("=", 1)[1], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    return datetime.now(UTC)


# -- AWS's published examples (AWS4 test credentials, 2013-05-24) --------------------------------------

AWS_SECRETS = {"AKIAIOSFODNN7EXAMPLE": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}
AWS_NOW = datetime(2013, 5, 24, tzinfo=UTC)


def test_aws_example_get_object_header_auth() -> None:
    headers = {
        "Host": "examplebucket.s3.amazonaws.com",
        "Range": "bytes=0-9",
        "x-amz-content-sha256": sigv4.EMPTY_SHA256,
        "x-amz-date": "20130524T000000Z",
        "Authorization": "AWS4-HMAC-SHA256 "
        "Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41",
    }
    result = sigv4.verify("GET", "/test.txt", "", headers, AWS_SECRETS.get, AWS_NOW)
    assert result.access_key == "AKIAIOSFODNN7EXAMPLE"
    assert (result.payload_mode, result.payload_sha256) == ("SHA256", sigv4.EMPTY_SHA256)
    assert result.scope == "20130524/us-east-1/s3/aws4_request"
    headers["Range"] = "bytes=0-10"
    with pytest.raises(errors.SignatureDoesNotMatch):
        sigv4.verify("GET", "/test.txt", "", headers, AWS_SECRETS.get, AWS_NOW)


def test_aws_example_presigned_url() -> None:
    query = (
        "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2F"
        "aws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
        "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
    )
    host = {"Host": "examplebucket.s3.amazonaws.com"}
    result = sigv4.verify("GET", "/test.txt", query, host, AWS_SECRETS.get, AWS_NOW + timedelta(hours=23))
    assert result.payload_mode == "UNSIGNED-PAYLOAD"
    with pytest.raises(errors.AccessDenied, match="Request has expired"):
        sigv4.verify("GET", "/test.txt", query, host, AWS_SECRETS.get, AWS_NOW + timedelta(days=1, seconds=1))


def test_aws_example_streaming_seed_signature() -> None:
    headers = {
        "Host": "s3.amazonaws.com",
        "x-amz-date": "20130524T000000Z",
        "x-amz-storage-class": "REDUCED_REDUNDANCY",
        "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        "Content-Encoding": "aws-chunked",
        "x-amz-decoded-content-length": "66560",
        "Content-Length": "66824",
        "Authorization": "AWS4-HMAC-SHA256 "
        "Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
        "SignedHeaders=content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;"
        "x-amz-decoded-content-length;x-amz-storage-class,"
        "Signature=4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9",
    }
    result = sigv4.verify("PUT", "/examplebucket/chunkObject.txt", "", headers, AWS_SECRETS.get, AWS_NOW)
    assert result.payload_mode == "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    assert result.seed_signature == "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
    assert result.signing_key == signing_key(AWS_SECRETS["AKIAIOSFODNN7EXAMPLE"], "20130524", "us-east-1")


# -- real boto3 requests --------------------------------------------------------------------------------

KEYS = [
    "plain",
    "dir/sub/file.bin",
    "with space and+plus",
    "ünïcödé/ファイル/🎉",
    "special !$&'()*,;=:@[]{}^`|\\\"<>#%?~",
    "trailing/slash/",
    "double//slash",
    "%2F-literal-percent",
]


@pytest.mark.parametrize("endpoint", ["https://s3.test", "http://localhost:9000"])
@pytest.mark.parametrize("key", KEYS)
def test_boto3_put_object_verifies(endpoint: str, key: str) -> None:
    client = boto3_client(endpoint)
    body = b"some bytes" * 100
    wire = boto3_wire(
        client, lambda c: c.put_object(Bucket="bucket", Key=key, Body=body, Metadata={"m": "  v  1 "})
    )
    result = check(wire)
    assert result.access_key == ACCESS_KEY and not result.anonymous
    if endpoint.startswith("https"):
        assert result.payload_mode == "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
    else:
        assert (result.payload_mode, result.payload_sha256) == ("SHA256", hashlib.sha256(body).hexdigest())
    request = routing.route(wire.method, wire.headers["host"], wire.path, {}, wire.headers, table=ROUTES)
    assert (request.operation, request.bucket, request.key) == ("PutObject", "bucket", key)


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.list_objects_v2(Bucket="bucket", Prefix="a b/ü", Delimiter="/", StartAfter="x+y"),
        lambda c: c.list_objects(Bucket="bucket", Marker="m=1&n", MaxKeys=7),
        lambda c: c.list_object_versions(Bucket="bucket", Prefix="p"),
        lambda c: c.delete_objects(Bucket="bucket", Delete={"Objects": [{"Key": "a"}, {"Key": "b c"}]}),
        lambda c: c.copy_object(Bucket="bucket", Key="dst", CopySource={"Bucket": "src", "Key": "ü k"}),
        lambda c: c.upload_part(Bucket="bucket", Key="k", UploadId="id/+=", PartNumber=3, Body=b"part"),
        lambda c: c.get_object(Bucket="bucket", Key="k", Range="bytes=1-2", ResponseContentType="a/b c"),
        lambda c: c.create_multipart_upload(Bucket="bucket", Key="k", ContentType="text/plain"),
        lambda c: c.list_buckets(),
        lambda c: c.head_bucket(Bucket="bucket"),
    ],
)
def test_boto3_operations_verify(call: Any) -> None:
    wire = boto3_wire(boto3_client(), call)
    assert check(wire).access_key == ACCESS_KEY


def test_boto3_virtual_hosted_style() -> None:
    client = boto3_client("https://s3.test", s3={"addressing_style": "virtual"})
    wire = boto3_wire(client, lambda c: c.get_object(Bucket="my-bucket", Key="a/b c"))
    assert wire.headers["host"] == "my-bucket.s3.test"
    assert check(wire).access_key == ACCESS_KEY
    request = routing.route(
        "GET", wire.headers["host"], wire.path, {}, wire.headers, ["s3.test"], table=ROUTES
    )
    assert (request.bucket, request.key) == ("my-bucket", "a/b c")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.text(st.characters(codec="utf-8"), min_size=1, max_size=60))
def test_any_unicode_key_verifies_and_routes(key: str) -> None:
    wire = boto3_wire(boto3_client("http://s3.test"), lambda c: c.get_object(Bucket="bucket", Key=key))
    assert check(wire).payload_mode == "SHA256"
    request = routing.route("GET", "s3.test", wire.path, {}, wire.headers, table=ROUTES)
    assert request.key == key


def test_boto3_sigv2_presigned_url_is_refused_clearly() -> None:
    # boto3 still presigns S3 URLs with SigV2 unless told otherwise.
    url = boto3_client("https://s3.test").generate_presigned_url(
        "get_object", Params={"Bucket": "b", "Key": "k"}
    )
    path, _, query = url.split("s3.test", 1)[1].partition("?")
    with pytest.raises(errors.InvalidRequest, match="Please use AWS4-HMAC-SHA256"):
        sigv4.verify("GET", path, query, {"Host": "s3.test"}, secret_for, datetime.now(UTC))


def test_boto3_presigned_urls() -> None:
    client = boto3_client("https://s3.test", signature_version="s3v4")
    for method, op in (("GET", "get_object"), ("PUT", "put_object")):
        url = client.generate_presigned_url(op, Params={"Bucket": "b", "Key": "ü/a b+c"}, ExpiresIn=600)
        rest = url.split("://", 1)[1]
        host, _, target = rest.partition("/")
        path, _, query = ("/" + target).partition("?")
        wire = Wire(method, path, query, CIMultiDict({"Host": host}), b"")
        signed = _signed_time(wire)
        result = check(wire, signed + timedelta(seconds=600))
        assert result.payload_mode == "UNSIGNED-PAYLOAD"
        with pytest.raises(errors.AccessDenied, match="expired") as exc:
            check(wire, signed + timedelta(seconds=601))
        assert exc.value.fields["X-Amz-Expires"] == "600"
        with pytest.raises(errors.SignatureDoesNotMatch):
            check(Wire("DELETE", path, query, wire.headers, b""), signed)
        with pytest.raises(errors.SignatureDoesNotMatch):
            check(Wire(method, path + "x", query, wire.headers, b""), signed)
        with pytest.raises(errors.SignatureDoesNotMatch):
            check(
                Wire(
                    method, path, query.replace("X-Amz-Expires=600", "X-Amz-Expires=6000"), wire.headers, b""
                ),
                signed,
            )


def test_presigned_with_operation_parameters_and_extra_signed_header() -> None:
    wire = presign_with_botocore(
        "GET",
        "https://s3.test/b/k?response-content-type=text%2Fplain&versionId=null",
        headers={"x-amz-meta-x": "1"},
    )
    assert check(wire).payload_mode == "UNSIGNED-PAYLOAD"
    tampered = Wire("GET", wire.path, wire.query.replace("text%2Fplain", "text%2Fhtml"), wire.headers, b"")
    with pytest.raises(errors.SignatureDoesNotMatch):
        check(tampered)
    added = Wire("GET", wire.path, wire.query + "&x-id=Other", wire.headers, b"")
    with pytest.raises(errors.SignatureDoesNotMatch):
        check(added)
    headers = CIMultiDict(wire.headers)
    headers["x-amz-meta-x"] = "2"
    with pytest.raises(errors.SignatureDoesNotMatch):
        check(Wire("GET", wire.path, wire.query, headers, b""))


def test_presigned_parameter_errors() -> None:
    wire = presign_with_botocore("GET", "https://s3.test/b/k", expires=60)
    now = _signed_time(wire)

    def with_query(old: str, new: str) -> Wire:
        assert old in wire.query
        return Wire("GET", wire.path, wire.query.replace(old, new), wire.headers, b"")

    bad = errors.AuthorizationQueryParametersError
    with pytest.raises(bad, match="less than a week"):
        check(with_query("X-Amz-Expires=60", "X-Amz-Expires=604801"), now)
    with pytest.raises(bad, match="non-negative"):
        check(with_query("X-Amz-Expires=60", "X-Amz-Expires=-1"), now)
    with pytest.raises(bad, match="number"):
        check(with_query("X-Amz-Expires=60", "X-Amz-Expires=soon"), now)
    with pytest.raises(bad, match="AWS4-HMAC-SHA256"):
        check(with_query("X-Amz-Algorithm=AWS4-HMAC-SHA256", "X-Amz-Algorithm=HMAC"), now)
    with pytest.raises(bad, match="requires"):
        check(with_query("&X-Amz-SignedHeaders=host", ""), now)
    with pytest.raises(errors.AccessDenied, match="not valid yet"):
        check(wire, now - timedelta(minutes=20))
    # Seven days is the longest validity there is, and it is honoured to the second.
    week = presign_with_botocore("GET", "https://s3.test/b/k", expires=604800)
    assert check(week, _signed_time(week) + timedelta(days=7)).access_key == ACCESS_KEY
    with pytest.raises(errors.AccessDenied):
        check(week, _signed_time(week) + timedelta(days=7, seconds=1))


def test_presigned_request_with_unsigned_amz_header_is_refused() -> None:
    wire = presign_with_botocore("PUT", "https://s3.test/b/k")
    wire.headers["x-amz-meta-sneaky"] = "1"
    with pytest.raises(errors.AccessDenied, match="not signed") as exc:
        check(wire)
    assert exc.value.fields["HeadersNotSigned"] == "x-amz-meta-sneaky"


# -- time ----------------------------------------------------------------------------------------------


def test_clock_skew() -> None:
    wire = sign_with_botocore("GET", "https://s3.test/b")
    t = wire.signed_at
    for delta in (timedelta(minutes=14), timedelta(minutes=-14), timedelta(minutes=15)):
        assert check(wire, t + delta).access_key == ACCESS_KEY
    for delta in (timedelta(minutes=15, seconds=1), timedelta(minutes=-16), timedelta(hours=-1)):
        with pytest.raises(errors.RequestTimeTooSkewed) as exc:
            check(wire, t + delta)
        assert exc.value.status == 403 and exc.value.fields["MaxAllowedSkewMilliseconds"] == "900000"
    with pytest.raises(errors.RequestTimeTooSkewed):
        check(wire, t + timedelta(seconds=61), max_skew=timedelta(minutes=1))


def test_date_header_instead_of_x_amz_date() -> None:
    wire = sign_with_botocore("GET", "https://s3.test/b/k", headers={"Date": "placeholder"})
    assert "x-amz-date" not in wire.headers and "date" in wire.headers
    when = parsedate_to_datetime(wire.headers["date"]).replace(tzinfo=UTC)
    assert check(wire, when).access_key == ACCESS_KEY
    wire.headers["Date"] = "not a date"
    with pytest.raises(errors.AccessDenied, match="Date"):
        check(wire, when)


# -- tampering and bad credentials ------------------------------------------------------------------


def _signed_put() -> Wire:
    return sign_with_botocore(
        "PUT",
        "https://s3.test/bucket/some%20key?uploadId=abc&partNumber=2",
        headers={"x-amz-meta-a": "1", "Content-Type": "text/plain"},
        body=b"payload",
    )


def _tamper(what: str) -> Wire:
    wire = _signed_put()
    if what == "header":
        wire.headers["x-amz-meta-a"] = "2"
    elif what == "content-type":
        wire.headers["Content-Type"] = "text/html"
    elif what == "payload-hash":
        wire.headers["x-amz-content-sha256"] = hashlib.sha256(b"other").hexdigest()
    elif what == "path":
        wire.path = "/bucket/some%20kez"
    elif what == "bucket":
        wire.path = "/bucket2/some%20key"
    elif what == "query-value":
        wire.query = wire.query.replace("partNumber=2", "partNumber=3")
    elif what == "query-added":
        wire.query += "&versionId=1"
    elif what == "query-removed":
        wire.query = "uploadId=abc"
    elif what == "method":
        wire.method = "POST"
    elif what == "host":
        wire.headers["Host"] = "evil.test"
    elif what == "signature":
        auth = wire.headers["Authorization"]
        wire.headers["Authorization"] = auth[:-1] + ("0" if auth[-1] != "0" else "1")
    elif what == "date":
        wire.headers["x-amz-date"] = (wire.signed_at + timedelta(seconds=1)).strftime("%Y%m%dT%H%M%SZ")
    return wire


@pytest.mark.parametrize(
    "what",
    [
        "header",
        "content-type",
        "payload-hash",
        "path",
        "bucket",
        "query-value",
        "query-added",
        "query-removed",
        "method",
        "host",
        "signature",
        "date",
    ],
)
def test_any_tampering_fails(what: str) -> None:
    assert check(_signed_put()).payload_mode == "SHA256"
    with pytest.raises(errors.SignatureDoesNotMatch) as exc:
        check(_tamper(what))
    assert exc.value.status == 403
    assert "CanonicalRequest" in exc.value.fields and "StringToSign" in exc.value.fields


def test_unsigned_amz_header_added_after_signing_is_refused() -> None:
    wire = _signed_put()
    wire.headers["x-amz-copy-source"] = "other/key"
    with pytest.raises(errors.AccessDenied, match="not signed"):
        check(wire)


def test_wrong_secret_and_unknown_access_key() -> None:
    wire = sign_with_botocore("GET", "https://s3.test/b", secret="not-the-secret")
    with pytest.raises(errors.SignatureDoesNotMatch):
        check(wire)
    wire = sign_with_botocore("GET", "https://s3.test/b", access_key="NOBODY")
    with pytest.raises(errors.InvalidAccessKeyId) as exc:
        check(wire)
    assert exc.value.fields["AWSAccessKeyId"] == "NOBODY"


def test_region_is_free_unless_pinned() -> None:
    wire = sign_with_botocore("GET", "https://s3.test/b", region="eu-central-1")
    assert check(wire).scope.split("/")[1] == "eu-central-1"
    assert check(wire, region="eu-central-1").access_key == ACCESS_KEY
    with pytest.raises(errors.AuthorizationHeaderMalformed, match="eu-central-1") as exc:
        check(wire, region="us-east-1")
    assert exc.value.fields["Region"] == "us-east-1"
    assert str(exc.value) == (
        "The authorization header is malformed; the region 'eu-central-1' is wrong; expecting 'us-east-1'"
    )


def test_presigned_region_is_pinned_too() -> None:
    wire = presign_with_botocore("GET", "https://s3.test/b/k", region="us-east-1")
    assert check(wire, region="us-east-1").access_key == ACCESS_KEY
    with pytest.raises(errors.AuthorizationQueryParametersError) as exc:
        check(wire, region="eu-west-1")
    assert str(exc.value) == (
        "Error parsing the X-Amz-Credential parameter; the region 'us-east-1' is wrong; expecting 'eu-west-1'"
    )
    assert (exc.value.status, exc.value.fields["Region"]) == (400, "eu-west-1")


def test_header_whitespace_is_folded_and_repeated_headers_joined() -> None:
    wire = sign_with_botocore(
        "GET", "https://s3.test/b/k", headers={"x-amz-meta-list": "1,2", "x-amz-meta-sp": "a  b"}
    )
    assert check(wire).access_key == ACCESS_KEY
    spaced = CIMultiDict(wire.headers)
    spaced["x-amz-meta-sp"] = "   a \t  b   "
    assert check(Wire("GET", wire.path, wire.query, spaced, b"")).access_key == ACCESS_KEY
    repeated: CIMultiDict[str] = CIMultiDict(
        (k, v) for k, v in wire.headers.items() if k.lower() != "x-amz-meta-list"
    )
    repeated.add("x-amz-meta-list", "1")
    repeated.add("x-amz-meta-list", "2")
    assert check(Wire("GET", wire.path, wire.query, repeated, b"")).access_key == ACCESS_KEY


def test_path_signed_as_sent_or_canonically() -> None:
    # botocore signs the path exactly as it sends it; other clients sign the canonical encoding of a path
    # they send less encoded. Both are the same resource and both verify.
    as_sent = sign_with_botocore("GET", "https://s3.test/b/a!b(c)")
    assert check(as_sent).access_key == ACCESS_KEY
    canonical = sign_with_botocore("GET", "https://s3.test/b/" + quote("a!b(c)", safe=""))
    canonical.path = "/b/a!b(c)"
    assert check(canonical).access_key == ACCESS_KEY


def test_streaming_modes_give_what_the_chunk_decoder_needs() -> None:
    wire = sign_with_botocore(
        "PUT",
        "https://s3.test/b/k",
        headers={"x-amz-decoded-content-length": "5", "Content-Encoding": "aws-chunked"},
        payload=sigv4.STREAMING_SIGNED,
    )
    result = check(wire)
    assert result.payload_mode == sigv4.STREAMING_SIGNED
    assert result.seed_signature == wire.headers["Authorization"].rsplit("Signature=", 1)[1]
    assert result.amz_date == wire.headers["x-amz-date"]
    assert result.signing_key == signing_key(SECRET_KEY, result.amz_date[:8], "us-east-1")
    assert "signing_key" not in repr(result)


# -- missing and malformed authentication -------------------------------------------------------------


def _bare(headers: dict[str, str], query: str = "") -> sigv4.AuthResult:
    h = {"Host": "s3.test", **headers}
    return sigv4.verify("GET", "/b/k", query, h, secret_for, datetime.now(UTC))


def test_anonymous_requests() -> None:
    with pytest.raises(errors.AccessDenied):
        _bare({})
    result = sigv4.verify(
        "GET", "/b/k", "", {"Host": "s3.test"}, secret_for, datetime.now(UTC), allow_anonymous=True
    )
    assert result.anonymous and result.payload_mode == "UNSIGNED-PAYLOAD"
    digest = hashlib.sha256(b"x").hexdigest()
    result = sigv4.verify(
        "PUT",
        "/b/k",
        "",
        {"x-amz-content-sha256": digest},
        secret_for,
        datetime.now(UTC),
        allow_anonymous=True,
    )
    assert (result.payload_mode, result.payload_sha256) == ("SHA256", digest)


def _v4(credential: str) -> str:
    return f"AWS4-HMAC-SHA256 Credential={credential}, SignedHeaders=host, Signature=00"


@pytest.mark.parametrize(
    ("headers", "query", "error", "match"),
    [
        ({"Authorization": "AWS AKID:c2lnbmF0dXJl"}, "", errors.InvalidRequest, "AWS4-HMAC-SHA256"),
        ({}, "AWSAccessKeyId=AK&Expires=1&Signature=x", errors.InvalidRequest, "AWS4-HMAC-SHA256"),
        ({"Authorization": "AWS4-ECDSA-P256-SHA256 Credential=a"}, "", errors.InvalidRequest, "AWS4-HMAC"),
        ({"Authorization": "Bearer token"}, "", errors.AuthorizationHeaderMalformed, "not supported"),
        ({"Authorization": "AWS4-HMAC-SHA256 Credential=AK/20240101/us-east-1/s3/aws4_request"}, "",
         errors.AuthorizationHeaderMalformed, "three components"),
        ({"Authorization": _v4("AK/2024/us-east-1/s3/aws4_request")}, "",
         errors.AuthorizationHeaderMalformed, "Credential is mal-formed"),
        ({"Authorization": _v4("AK/20240101/us-east-1/s3/aws5_request")}, "",
         errors.AuthorizationHeaderMalformed, "Credential is mal-formed"),
        ({"Authorization": _v4("AK/20240101/us-east-1/ec2/aws4_request")}, "",
         errors.AuthorizationHeaderMalformed, "service"),
        ({"Authorization": _v4("AK/20240101/us-east-1/s3/aws4_request"), "x-amz-date": "20240102T000000Z"},
         "", errors.AuthorizationHeaderMalformed, "credential date"),
        ({"Authorization": _v4("AK/20240101/us-east-1/s3/aws4_request")}, "", errors.AccessDenied, "Date"),
        ({"Authorization": _v4("AK/20240101/us-east-1/s3/aws4_request"), "x-amz-date": "2024-01-01"}, "",
         errors.AccessDenied, "Date"),
        ({"Authorization": "AWS4-HMAC-SHA256 Credential=a, SignedHeaders=host, Signature=0"},
         "X-Amz-Algorithm=AWS4-HMAC-SHA256", errors.InvalidArgument, "Only one auth mechanism"),
    ],
)  # fmt: skip
def test_malformed_authentication(
    headers: dict[str, str], query: str, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        _bare(headers, query)


def test_content_sha256_rules() -> None:
    wire = sign_with_botocore("GET", "https://s3.test/b/k")
    missing = CIMultiDict((k, v) for k, v in wire.headers.items() if k.lower() != "x-amz-content-sha256")
    with pytest.raises(errors.InvalidRequest, match="x-amz-content-sha256"):
        check(Wire("GET", wire.path, wire.query, missing, b""), wire.signed_at)
    odd = CIMultiDict(wire.headers)
    odd["x-amz-content-sha256"] = "not-a-hash"
    with pytest.raises(errors.InvalidArgument):
        check(Wire("GET", wire.path, wire.query, odd, b""), wire.signed_at)
    odd["x-amz-content-sha256"] = "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD"
    with pytest.raises(errors.NotImplemented_):
        check(Wire("GET", wire.path, wire.query, odd, b""), wire.signed_at)


def test_content_sha256_must_be_signed() -> None:
    # Sign without x-amz-content-sha256 (as a generic SigV4 signer could), then add it unsigned.
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(method="GET", url="https://s3.test/b/k")
    SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(request)
    headers = CIMultiDict((k, v if isinstance(v, str) else v.decode()) for k, v in request.headers.items())
    headers["Host"] = "s3.test"
    headers["x-amz-content-sha256"] = sigv4.UNSIGNED_PAYLOAD
    wire = Wire("GET", "/b/k", "", headers, b"")
    with pytest.raises(errors.AccessDenied, match="not signed") as exc:
        check(wire)
    assert exc.value.fields["HeadersNotSigned"] == "x-amz-content-sha256"
