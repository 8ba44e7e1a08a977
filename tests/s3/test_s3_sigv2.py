"""SigV2 verification against botocore's own SigV2 signers (header and presigned), with tamper and expiry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from botocore.auth import HmacV1Auth, HmacV1QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from multidict import CIMultiDict

from tests.s3.s3_helpers import ACCESS_KEY, SECRET_KEY, Wire, boto3_client, boto3_wire, secret_for
from tsproxy import errors
from tsproxy.s3 import sigv2, sigv4
from tsproxy.s3.auth import authenticate


def v2_client() -> Any:
    return boto3_client(signature_version="s3")


def sign_v2(
    method: str, url: str, headers: dict[str, str] | None = None, auth_path: str | None = None
) -> Wire:
    request = AWSRequest(method=method, url=url, headers=headers or {})
    if auth_path is not None:
        request.auth_path = auth_path
    HmacV1Auth(Credentials(ACCESS_KEY, SECRET_KEY)).add_auth(request)
    parts = urlsplit(request.url)
    h: CIMultiDict[str] = CIMultiDict((k, str(v)) for k, v in request.headers.items())
    h.setdefault("Host", parts.netloc)
    return Wire(method, parts.path or "/", parts.query, h, b"")


def presign_v2(method: str, url: str, expires: int = 3600) -> Wire:
    request = AWSRequest(method=method, url=url)
    HmacV1QueryAuth(Credentials(ACCESS_KEY, SECRET_KEY), expires=expires).add_auth(request)
    parts = urlsplit(request.url)
    return Wire(method, parts.path or "/", parts.query, CIMultiDict(Host=parts.netloc), b"")


def signed_time(wire: Wire) -> datetime:
    return parsedate_to_datetime(wire.headers["Date"])


def check(wire: Wire, now: datetime | None = None, **kwargs: Any) -> sigv4.AuthResult:
    when = now if now is not None else (signed_time(wire) if "Date" in wire.headers else datetime.now(UTC))
    return authenticate(wire.method, wire.path, wire.query, wire.headers, secret_for, when, **kwargs)


BOTO3_CALLS = {
    "get": lambda c: c.get_object(Bucket="bkt", Key="dir/a b+c.txt"),
    "get-range-override": lambda c: c.get_object(
        Bucket="bkt", Key="k", Range="bytes=0-9", ResponseContentType="text/plain", ResponseCacheControl="no"
    ),
    "put-meta": lambda c: c.put_object(
        Bucket="bkt", Key="k", Body=b"x" * 100, ContentType="text/csv", Metadata={"who": "me", "Two": "2"}
    ),
    "upload-part": lambda c: c.upload_part(Bucket="bkt", Key="k", UploadId="abc", PartNumber=3, Body=b"p"),
    "list-v2": lambda c: c.list_objects_v2(Bucket="bkt", Prefix="a/", Delimiter="/", MaxKeys=10),
    "delete-objects": lambda c: c.delete_objects(Bucket="bkt", Delete={"Objects": [{"Key": "a"}]}),
    "create-mpu": lambda c: c.create_multipart_upload(Bucket="bkt", Key="utf8-ключ"),
    "list-buckets": lambda c: c.list_buckets(),
}


@pytest.mark.parametrize("call", sorted(BOTO3_CALLS))
def test_boto3_sigv2_requests_verify(call: str) -> None:
    wire = boto3_wire(v2_client(), BOTO3_CALLS[call])
    assert wire.headers["Authorization"].startswith("AWS ")
    result = check(wire)
    assert result.access_key == ACCESS_KEY
    assert result.payload_mode in (sigv4.UNSIGNED_PAYLOAD, sigv4.SHA256_PAYLOAD)


def test_virtual_hosted_request_signs_the_bucket() -> None:
    wire = sign_v2("GET", "https://bkt.s3.test/key?acl", auth_path="/bkt/key")
    assert check(wire, host_bucket="bkt").access_key == ACCESS_KEY
    with pytest.raises(errors.SignatureDoesNotMatch):
        check(wire)  # without the bucket the resource differs


def test_x_amz_date_empties_the_date_line() -> None:
    when = datetime.now(UTC).replace(microsecond=0)
    stamp = when.strftime("%a, %d %b %Y %H:%M:%S GMT")
    h = CIMultiDict({"Host": "s3.test", "x-amz-date": stamp, "Content-Type": "a/b"})
    text = sigv2.string_to_sign("PUT", "/b/k", [], sigv4.headers_by_name(h), "", None)
    assert text == f"PUT\n\na/b\n\nx-amz-date:{stamp}\n/b/k"
    h["Authorization"] = f"AWS {ACCESS_KEY}:{sigv2.sign(SECRET_KEY, text)}"
    assert authenticate("PUT", "/b/k", "", h, secret_for, when).access_key == ACCESS_KEY


@pytest.mark.parametrize(
    "tamper",
    [
        lambda w: setattr(w, "method", "DELETE"),
        lambda w: setattr(w, "path", w.path + "x"),
        lambda w: setattr(w, "query", "acl"),
        lambda w: w.headers.__setitem__("Content-Type", "text/evil"),
        lambda w: w.headers.__setitem__("x-amz-meta-who", "mallory"),
        lambda w: w.headers.__setitem__("Authorization", w.headers["Authorization"][:-4] + "AAA="),
    ],
    ids=["method", "path", "subresource", "content-type", "amz-header", "signature"],
)
def test_tampered_header_requests_are_refused(tamper: Any) -> None:
    wire = boto3_wire(v2_client(), BOTO3_CALLS["put-meta"])
    check(wire)
    tamper(wire)
    with pytest.raises(errors.SignatureDoesNotMatch) as exc:
        check(wire)
    assert exc.value.status == 403 and exc.value.fields["AWSAccessKeyId"] == ACCESS_KEY


def test_unsigned_query_parameters_do_not_matter() -> None:
    wire = boto3_wire(v2_client(), BOTO3_CALLS["get"])
    wire.query = "x-id=GetObject"  # not a subresource: outside the signature, as S3 has it
    assert check(wire).access_key == ACCESS_KEY


def test_skewed_header_request_is_refused() -> None:
    wire = boto3_wire(v2_client(), BOTO3_CALLS["get"])
    with pytest.raises(errors.RequestTimeTooSkewed):
        check(wire, signed_time(wire) + timedelta(minutes=16))
    check(wire, signed_time(wire) + timedelta(minutes=14))


def test_unknown_key_and_malformed_header() -> None:
    wire = boto3_wire(v2_client(), BOTO3_CALLS["get"])
    wire.headers["Authorization"] = "AWS NOBODY:" + wire.headers["Authorization"].split(":", 1)[1]
    with pytest.raises(errors.InvalidAccessKeyId):
        check(wire)
    wire.headers["Authorization"] = "AWS no-colon-here"
    with pytest.raises(errors.AccessDenied):
        check(wire)


def test_presigned_url_verifies_until_it_expires() -> None:
    wire = presign_v2("GET", "https://s3.test/bkt/some%20key.txt", expires=60)
    expires = int(parse_qs(wire.query)["Expires"][0])
    at = datetime.fromtimestamp(expires, UTC)
    assert check(wire, at - timedelta(seconds=30)).access_key == ACCESS_KEY
    with pytest.raises(errors.AccessDenied) as exc:
        check(wire, at + timedelta(seconds=1))
    assert exc.value.status == 403 and "expired" in str(exc.value).lower()


def test_boto3_presigns_with_sigv2_and_it_verifies() -> None:
    url = v2_client().generate_presigned_url("get_object", Params={"Bucket": "bkt", "Key": "a/b"})
    parts = urlsplit(url)
    assert "AWSAccessKeyId=" in parts.query
    result = authenticate(
        "GET", parts.path, parts.query, {"Host": parts.netloc}, secret_for, datetime.now(UTC)
    )
    assert result.access_key == ACCESS_KEY


@pytest.mark.parametrize(
    "edit",
    [
        lambda q: q.replace("Expires=", "Expires=9"),
        lambda q: q.replace("Signature=", "Signature=AA"),
        lambda q: q + "&acl",
    ],
    ids=["expires", "signature", "subresource"],
)
def test_tampered_presigned_urls_are_refused(edit: Any) -> None:
    wire = presign_v2("GET", "https://s3.test/bkt/k")
    wire.query = edit(wire.query)
    with pytest.raises(errors.SignatureDoesNotMatch):
        check(wire)


def test_presigned_url_missing_or_bad_parameters() -> None:
    wire = presign_v2("GET", "https://s3.test/bkt/k")
    without_expires = "&".join(p for p in wire.query.split("&") if not p.startswith("Expires="))
    with pytest.raises(errors.AccessDenied):
        authenticate("GET", wire.path, without_expires, wire.headers, secret_for, datetime.now(UTC))
    bad = wire.query.replace("Expires=", "Expires=soon")
    with pytest.raises(errors.AccessDenied):
        authenticate("GET", wire.path, bad, wire.headers, secret_for, datetime.now(UTC))


def test_both_mechanisms_at_once_are_refused() -> None:
    wire = boto3_wire(v2_client(), BOTO3_CALLS["get"])
    wire.query = "AWSAccessKeyId=x&Expires=1&Signature=y"
    with pytest.raises(errors.InvalidArgument):
        check(wire)


def test_sigv4_still_refuses_sigv2_when_called_directly() -> None:
    wire = boto3_wire(v2_client(), BOTO3_CALLS["get"])
    with pytest.raises(errors.InvalidRequest):
        sigv4.verify(wire.method, wire.path, wire.query, wire.headers, secret_for, signed_time(wire))


def test_region_of_sigv4_scope_must_be_the_endpoints() -> None:
    wire = boto3_wire(boto3_client(region="eu-west-1"), BOTO3_CALLS["get"])
    with pytest.raises(errors.AuthorizationHeaderMalformed) as exc:
        authenticate(
            wire.method, wire.path, wire.query, wire.headers, secret_for, wire.signed_at, region="us-east-1"
        )
    assert exc.value.fields["Region"] == "us-east-1"
