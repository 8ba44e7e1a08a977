"""Bad input gets an S3 error, never another exception: every entry point of the protocol layer, fed junk."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.s3.s3_helpers import secret_for, sign_with_botocore
from tsproxy import errors
from tsproxy.s3 import chunked, ranges, routing, sigv4, xml
from tsproxy.server.routes import BY_OPERATION, ROUTES

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Any code point, and lone surrogates: what undecodable bytes of a request become in Python.
text = st.text(st.characters() | st.sampled_from(["\udcff", "\ud800", "%", "F", "/", "?", "="]), max_size=80)
header_names = st.sampled_from(
    [
        "Authorization",
        "x-amz-date",
        "Date",
        "x-amz-content-sha256",
        "Host",
        "x-amz-meta-a",
        "Range",
        "If-Match",
        "If-None-Match",
        "If-Modified-Since",
        "If-Unmodified-Since",
        "x-amz-copy-source",
        "x-amz-trailer",
    ]
)
headers = st.dictionaries(header_names, text, max_size=6)
NOW = datetime(2024, 1, 1, tzinfo=UTC)


@FUZZ
@given(
    method=st.sampled_from(["GET", "PUT", "POST", "HEAD", "DELETE", "PATCH"]),
    path=text.map(lambda t: "/" + t),
    query=text,
    h=headers,
)
def test_verify_raises_only_s3_errors(method: str, path: str, query: str, h: dict[str, str]) -> None:
    try:
        sigv4.verify(method, path, query, h, secret_for, NOW, allow_anonymous=True)
    except errors.S3Error:
        pass


@FUZZ
@given(auth=text, amz_date=text, payload=text)
def test_verify_with_junk_in_a_well_formed_frame(auth: str, amz_date: str, payload: str) -> None:
    h = {"Host": "s3.test", "x-amz-date": amz_date, "x-amz-content-sha256": payload}
    h["Authorization"] = "AWS4-HMAC-SHA256 " + auth
    try:
        sigv4.verify("GET", "/b/k", "", h, secret_for, NOW)
    except errors.S3Error:
        pass


@FUZZ
@given(name=st.sampled_from((*sigv4.PRESIGN_PARAMS, "X-Amz-Signature")), value=text)
def test_presigned_with_one_junk_parameter(name: str, value: str) -> None:
    wire = sign_with_botocore("GET", "https://s3.test/b/k")  # only for a realistic date and host
    params = {
        "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
        "X-Amz-Credential": "AKTSPROXYTEST/20240101/us-east-1/s3/aws4_request",
        "X-Amz-Date": "20240101T000000Z",
        "X-Amz-Expires": "60",
        "X-Amz-SignedHeaders": "host",
        "X-Amz-Signature": "0" * 64,
        name: value,
    }
    encoded = {k: quote(v.encode("utf-8", "surrogatepass"), safe="") for k, v in params.items()}
    query = "&".join(f"{k}={v}" for k, v in encoded.items() if k != name or value)
    try:
        sigv4.verify("GET", "/b/k", query, {"Host": wire.headers["host"]}, secret_for, NOW)
    except errors.S3Error:
        pass


@FUZZ
@given(
    method=st.sampled_from(["GET", "PUT", "POST", "HEAD", "DELETE", "OPTIONS"]),
    host=text,
    path=text.map(lambda t: "/" + t),
    query=st.dictionaries(
        st.sampled_from(
            ["acl", "uploads", "uploadId", "delete", "list-type", "versions", "location", "partNumber", "x"]
        ),
        text,
        max_size=3,
    ),
    h=headers,
)
def test_route_raises_only_s3_errors(
    method: str, host: str, path: str, query: dict[str, str], h: dict[str, str]
) -> None:
    try:
        request = routing.route(method, host, path, query, h, ["s3.test"], table=ROUTES)
    except errors.S3Error:
        return
    # What was routed is what its row says it is: the resource its shape addresses is the one named.
    row = BY_OPERATION[request.operation]
    named = "service" if request.bucket is None else "bucket" if request.key is None else "object"
    assert row.shape.resource == named
    assert method.upper() in row.shape.methods


@FUZZ
@given(value=text)
def test_copy_source_raises_only_s3_errors(value: str) -> None:
    try:
        routing.parse_copy_source(value)
    except errors.S3Error:
        pass


@FUZZ
@given(h=headers, method=st.sampled_from(["GET", "PUT"]))
def test_preconditions_raise_only_412(h: dict[str, str], method: str) -> None:
    try:
        ranges.check_preconditions(h, "etag", NOW, method=method)
    except errors.PreconditionFailed:
        pass


@FUZZ
@given(body=st.binary(max_size=400) | text.map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_xml_parsers_raise_only_s3_errors(body: bytes) -> None:
    for parse in (xml.parse_delete, xml.parse_complete_multipart, xml.parse_create_bucket):
        try:
            parse(body)
        except errors.S3Error:
            pass


@FUZZ
@given(
    pieces=st.lists(
        st.binary(max_size=40)
        | st.sampled_from(
            [b"\r\n", b"0\r\n", b"5\r\n", b";chunk-signature=", b"x-amz-checksum-crc32:", b"\r\n\r\n"]
        ),
        max_size=12,
    ),
    mode=st.sampled_from(
        [sigv4.STREAMING_UNSIGNED_TRAILER, sigv4.STREAMING_SIGNED, sigv4.STREAMING_SIGNED_TRAILER]
    ),
)
def test_chunked_decoder_raises_only_s3_errors(pieces: list[bytes], mode: str) -> None:
    auth = sigv4.AuthResult(
        "AK",
        mode,
        signing_key=b"k" * 32,
        seed_signature="0" * 64,
        amz_date="20240101T000000Z",
        scope="20240101/us-east-1/s3/aws4_request",
    )
    decoder = chunked.AwsChunkedDecoder(
        auth, decoded_length=None, trailer="x-amz-checksum-crc32", checksum_algorithm="CRC32"
    )
    try:
        for piece in pieces:
            decoder.feed(piece)
        decoder.finish()
    except errors.S3Error:
        pass


SIGNED = sign_with_botocore("GET", "https://s3.test/b/k?list-type=2", headers={"x-amz-meta-a": "1"})


@FUZZ
@given(path=text, query=text, meta=text)
def test_signed_request_with_junk_path_query_or_header(path: str, query: str, meta: str) -> None:
    # The signature check itself must cope with whatever ends up in a signed request.
    h = dict(SIGNED.headers.items())
    h["x-amz-meta-a"] = meta
    try:
        sigv4.verify("GET", "/" + path, query, h, secret_for, SIGNED.signed_at)
    except errors.SignatureDoesNotMatch:
        pass
    except errors.InvalidArgument as e:
        # A junk query that names a presigning parameter makes two auth mechanisms, as S3 says.
        assert "Only one auth mechanism allowed" in e.message
