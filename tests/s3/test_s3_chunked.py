"""aws-chunked decoding: AWS's published body, real boto3 bodies, independently signed bodies, and every
way of breaking them. Bodies are fed in arbitrary splits: framing must not depend on where reads end."""

from __future__ import annotations

import base64
import re
import zlib
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.s3.s3_helpers import (
    SECRET_KEY,
    ChunkSigner,
    boto3_client,
    boto3_wire,
    secret_for,
    sign_with_botocore,
    signed_chunked_body,
    signing_key,
    unsigned_chunked_body,
)
from tsproxy import errors
from tsproxy.s3 import sigv4
from tsproxy.s3.checksums import Checksum, declared_trailer
from tsproxy.s3.chunked import MAX_LINE, AwsChunkedDecoder


def decode(
    auth: sigv4.AuthResult,
    body: bytes,
    cuts: Sequence[int] = (),
    *,
    decoded_length: int | None = None,
    trailer: str | None = None,
    checksum: str | None = None,
    min_chunk_size: int = 1,  # the framing tests use chunks of a few bytes for legibility
) -> tuple[bytes, dict[str, str]]:
    decoder = AwsChunkedDecoder(
        auth,
        decoded_length=decoded_length,
        trailer=trailer,
        checksum_algorithm=checksum,
        min_chunk_size=min_chunk_size,
    )
    out = bytearray()
    start = 0
    for cut in [*sorted(set(cuts)), len(body)]:
        for piece in decoder.feed(body[start:cut]):
            out += piece
        start = cut
    return bytes(out), decoder.finish()


def splits(body_size: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, body_size), max_size=12)


# -- AWS's published signed body -------------------------------------------------------------------

AWS_AUTH = sigv4.AuthResult(
    access_key="AKIAIOSFODNN7EXAMPLE",
    payload_mode=sigv4.STREAMING_SIGNED,
    signing_key=signing_key("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "20130524", "us-east-1"),
    seed_signature="4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9",
    amz_date="20130524T000000Z",
    scope="20130524/us-east-1/s3/aws4_request",
)
AWS_SIGS = (
    "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
    "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
    "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
)


def aws_body(sigs: Sequence[str] = AWS_SIGS, second: bytes = b"a" * 1024) -> bytes:
    return (
        b"10000;chunk-signature=" + sigs[0].encode() + b"\r\n" + b"a" * 65536 + b"\r\n"
        b"400;chunk-signature=" + sigs[1].encode() + b"\r\n" + second + b"\r\n"
        b"0;chunk-signature=" + sigs[2].encode() + b"\r\n\r\n"
    )


@settings(max_examples=40, deadline=None)
@given(cuts=splits(66824))
def test_aws_example_body_in_any_split(cuts: list[int]) -> None:
    body = aws_body()
    assert len(body) == 66824  # the Content-Length of the AWS example
    payload, trailers = decode(AWS_AUTH, body, cuts, decoded_length=66560)
    assert payload == b"a" * 66560 and trailers == {}


def test_aws_example_body_tampered() -> None:
    with pytest.raises(errors.SignatureDoesNotMatch):
        decode(AWS_AUTH, aws_body(second=b"a" * 1023 + b"b"))
    with pytest.raises(errors.SignatureDoesNotMatch):
        decode(AWS_AUTH, aws_body(sigs=(AWS_SIGS[1], AWS_SIGS[0], AWS_SIGS[2])))
    other_seed = sigv4.AuthResult(**{**AWS_AUTH.__dict__, "seed_signature": "0" * 64})
    with pytest.raises(errors.SignatureDoesNotMatch):
        decode(other_seed, aws_body())


def test_trailer_signature_matches_aws_crt_vector() -> None:
    # aws-crt's test vector: the AWS example's final chunk signature, then three trailing headers.
    sts = sigv4.trailer_string_to_sign(
        AWS_AUTH.amz_date,
        AWS_AUTH.scope,
        AWS_SIGS[2],
        [("first", "1st"), ("second", "2nd"), ("third", "3rd")],
    )
    assert (
        sigv4.sign(AWS_AUTH.signing_key, sts)
        == "df5735bd9f3295cd9386572292562fefc93ba94e80a0a1ddcbd652c4e0a75e6c"
    )


# -- real boto3 bodies (STREAMING-UNSIGNED-PAYLOAD-TRAILER) -------------------------------------------

ALGORITHMS = ["CRC32", "CRC32C", "SHA1", "SHA256", "CRC64NVME", "SHA512", "XXHASH64", "XXHASH3", "XXHASH128"]


def boto3_put(data: bytes, algorithm: str = "CRC32") -> tuple[sigv4.AuthResult, bytes, str, int]:
    wire = boto3_wire(
        boto3_client("https://s3.test"),
        lambda c: c.put_object(Bucket="b", Key="k", Body=data, ChecksumAlgorithm=algorithm),
    )
    auth = sigv4.verify(wire.method, wire.path, wire.query, wire.headers, secret_for, wire.signed_at)
    assert auth.payload_mode == sigv4.STREAMING_UNSIGNED_TRAILER
    trailer = declared_trailer(wire.headers)
    assert trailer == f"x-amz-checksum-{algorithm.lower()}"
    return auth, wire.body, trailer, int(wire.headers["x-amz-decoded-content-length"])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("size", [0, 1, 1 << 20, (1 << 20) + 1, 2_500_000])
def test_boto3_bodies_decode_and_checksum(algorithm: str, size: int) -> None:
    data = bytes(i * 7 % 251 for i in range(size))
    auth, body, trailer, length = boto3_put(data, algorithm)
    payload, trailers = decode(auth, body, decoded_length=length, trailer=trailer, checksum=algorithm)
    assert payload == data
    expected = Checksum(algorithm)
    expected.update(data)
    assert trailers == {trailer: expected.b64digest()}


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=3000), cuts=splits(3200))
def test_boto3_body_in_any_split(data: bytes, cuts: list[int]) -> None:
    auth, body, trailer, length = boto3_put(data, "CRC32C")
    inside = [c for c in cuts if c <= len(body)]
    payload, _ = decode(auth, body, inside, decoded_length=length, trailer=trailer, checksum="CRC32C")
    assert payload == data


def test_boto3_body_with_wrong_checksum_is_bad_digest() -> None:
    auth, body, trailer, length = boto3_put(b"hello world", "CRC32")
    sent = re.search(rb"x-amz-checksum-crc32:(\S+)\r\n", body)
    assert sent is not None and sent.group(1) == crc32_b64(b"hello world").encode()
    forged = body.replace(sent.group(1), b"AAAAAA==")
    with pytest.raises(
        errors.BadDigest, match=r"The CRC32 you specified did not match the calculated checksum\."
    ) as exc:
        decode(auth, forged, decoded_length=length, trailer=trailer, checksum="CRC32")
    assert (exc.value.code, exc.value.status) == ("BadDigest", 400)
    # Without checksum_algorithm the decoder only hands the trailer back; its caller checks it.
    _, trailers = decode(auth, forged, decoded_length=length, trailer=trailer)
    assert trailers == {trailer: "AAAAAA=="}


# -- independently signed bodies -----------------------------------------------------------------------


def signed_request(mode: str, trailer: str | None = None) -> tuple[sigv4.AuthResult, ChunkSigner]:
    headers = {"Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": "0"}
    if trailer:
        headers["x-amz-trailer"] = trailer
    wire = sign_with_botocore("PUT", "https://s3.test/b/k", headers=headers, payload=mode, region="eu-west-1")
    auth = sigv4.verify(wire.method, wire.path, wire.query, wire.headers, secret_for, wire.signed_at)
    assert auth.payload_mode == mode
    seed = wire.headers["Authorization"].rsplit("Signature=", 1)[1]
    date = wire.headers["x-amz-date"]
    signer = ChunkSigner(
        signing_key(SECRET_KEY, date[:8], "eu-west-1"), date, f"{date[:8]}/eu-west-1/s3/aws4_request", seed
    )
    return auth, signer


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


@settings(max_examples=30, deadline=None)
@given(chunks=st.lists(st.binary(min_size=1, max_size=700), max_size=6), cuts=splits(5000))
def test_signed_chunks_with_signed_trailer_in_any_split(chunks: list[bytes], cuts: list[int]) -> None:
    auth, signer = signed_request(sigv4.STREAMING_SIGNED_TRAILER, "x-amz-checksum-crc32")
    data = b"".join(chunks)
    body = signed_chunked_body(signer, chunks, [("x-amz-checksum-crc32", crc32_b64(data))])
    payload, trailers = decode(auth, body, [c for c in cuts if c <= len(body)], decoded_length=len(data),
                               trailer="x-amz-checksum-crc32", checksum="CRC32")  # fmt: skip
    assert payload == data and trailers == {"x-amz-checksum-crc32": crc32_b64(data)}


@settings(max_examples=30, deadline=None)
@given(chunks=st.lists(st.binary(min_size=1, max_size=700), max_size=6), cuts=splits(5000))
def test_signed_chunks_without_trailer_in_any_split(chunks: list[bytes], cuts: list[int]) -> None:
    auth, signer = signed_request(sigv4.STREAMING_SIGNED)
    data = b"".join(chunks)
    body = signed_chunked_body(signer, chunks)
    payload, trailers = decode(auth, body, [c for c in cuts if c <= len(body)], decoded_length=len(data))
    assert payload == data and trailers == {}


def _signed_trailer_body(data: bytes = b"0123456789" * 50) -> tuple[sigv4.AuthResult, bytes, str]:
    auth, signer = signed_request(sigv4.STREAMING_SIGNED_TRAILER, "x-amz-checksum-crc32")
    body = signed_chunked_body(signer, [data[:200], data[200:]], [("x-amz-checksum-crc32", crc32_b64(data))])
    return auth, body, crc32_b64(data)


def test_signed_trailer_tampering() -> None:
    auth, body, digest = _signed_trailer_body()
    kwargs = {"decoded_length": 500, "trailer": "x-amz-checksum-crc32"}
    assert decode(auth, body, **kwargs)[1] == {"x-amz-checksum-crc32": digest}  # type: ignore[arg-type]
    forged = body.replace(digest.encode(), crc32_b64(b"other").encode())
    with pytest.raises(errors.SignatureDoesNotMatch, match="trailer signature"):
        decode(auth, forged, **kwargs)  # type: ignore[arg-type]
    head, _, _ = body.rpartition(b"x-amz-trailer-signature:")
    with pytest.raises(errors.SignatureDoesNotMatch, match="not signed"):
        decode(auth, head + b"\r\n", **kwargs)  # type: ignore[arg-type]
    wrong = head + b"x-amz-trailer-signature:" + b"0" * 64 + b"\r\n\r\n"
    with pytest.raises(errors.SignatureDoesNotMatch):
        decode(auth, wrong, **kwargs)  # type: ignore[arg-type]


def test_signed_chunk_without_signature_is_refused() -> None:
    auth, _ = signed_request(sigv4.STREAMING_SIGNED)
    with pytest.raises(errors.SignatureDoesNotMatch, match="no chunk-signature"):
        decode(auth, b"3\r\nabc\r\n0\r\n\r\n")


def test_signed_mode_needs_a_signing_key() -> None:
    with pytest.raises(errors.InvalidRequest):
        AwsChunkedDecoder(sigv4.AuthResult("", sigv4.STREAMING_SIGNED, anonymous=True), decoded_length=None,
                          trailer=None, checksum_algorithm=None)  # fmt: skip


# -- broken framing --------------------------------------------------------------------------------

UNSIGNED = sigv4.AuthResult("AK", sigv4.STREAMING_UNSIGNED_TRAILER)
GOOD = unsigned_chunked_body([b"hello ", b"world"], [("x-amz-checksum-crc32", crc32_b64(b"hello world"))])
TRAILER = "x-amz-checksum-crc32"


def test_good_unsigned_body() -> None:
    assert GOOD == b"6\r\nhello \r\n5\r\nworld\r\n0\r\nx-amz-checksum-crc32:DUoRhQ==\r\n\r\n"
    assert decode(UNSIGNED, GOOD, decoded_length=11, trailer=TRAILER, checksum="CRC32") == (
        b"hello world",
        {TRAILER: "DUoRhQ=="},
    )


@pytest.mark.parametrize(
    ("body", "length", "error", "match"),
    [
        (GOOD.replace(b"6\r\n", b"zz\r\n", 1), 11, errors.InvalidRequest, "chunk size"),
        (GOOD.replace(b"6\r\n", b"-6\r\n", 1), 11, errors.InvalidRequest, "chunk size"),
        (GOOD.replace(b"6\r\n", b"\r\n", 1), 11, errors.InvalidRequest, "chunk size"),
        (GOOD.replace(b"6\r\n", b"00000000000000006\r\n", 1), 11, errors.InvalidRequest, "chunk size"),
        (GOOD.replace(b"6\r\n", b"6\n", 1), 11, errors.InvalidRequest, "CRLF"),
        (GOOD.replace(b"6\r\nhello ", b"5\r\nhello ", 1), 10, errors.InvalidRequest, "not followed by CRLF"),
        (GOOD.replace(b"hello \r\n", b"hello \n", 1), 11, errors.InvalidRequest, "not followed by CRLF"),
        (GOOD, 12, errors.IncompleteBody, "decoded-content-length"),
        (GOOD, 10, errors.InvalidRequest, "more than x-amz-decoded-content-length"),
        (GOOD + b"0\r\n\r\n", 11, errors.InvalidRequest, "after its final chunk"),
        (GOOD[:-1], 11, errors.IncompleteBody, "ended"),
        (GOOD[:20], 11, errors.IncompleteBody, "ended"),
        (b"", 11, errors.IncompleteBody, "ended"),
        (GOOD.replace(b"DUoRhQ==", b"AAAAAA=="), 11, errors.BadDigest, "CRC32 you specified"),
        (
            GOOD.replace(b"x-amz-checksum-crc32:", b"x-amz-checksum-crc32c:"),
            11,
            errors.InvalidRequest,
            "not declared",
        ),
        (
            GOOD.replace(b"x-amz-checksum-crc32:DUoRhQ==\r\n", b""),
            11,
            errors.InvalidRequest,
            "declared but not sent",
        ),
        (
            GOOD.replace(b"x-amz-checksum-crc32:", b"x-amz-checksum-crc32;"),
            11,
            errors.InvalidRequest,
            "malformed",
        ),
        (
            GOOD.replace(b"\r\n\r\n", b"\r\nx-amz-checksum-crc32:DUoRhQ==\r\n\r\n"),
            11,
            errors.InvalidRequest,
            "twice",
        ),
        (
            GOOD.replace(b"\r\n\r\n", b"\r\nx-amz-trailer-signature:00\r\n\r\n"),
            11,
            errors.InvalidRequest,
            "unsigned",
        ),
    ],
)
def test_broken_bodies(body: bytes, length: int, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        decode(UNSIGNED, body, decoded_length=length, trailer=TRAILER, checksum="CRC32")
    # The same failure whatever the read boundaries.
    with pytest.raises(error, match=match):
        decode(UNSIGNED, body, range(len(body)), decoded_length=length, trailer=TRAILER, checksum="CRC32")


def test_oversize_line_fails_before_buffering_it() -> None:
    decoder = AwsChunkedDecoder(UNSIGNED, decoded_length=None, trailer=None, checksum_algorithm=None)
    decoder.feed(b"1" * (MAX_LINE - 10))
    with pytest.raises(errors.InvalidRequest, match="too long"):
        decoder.feed(b"1" * (1 << 20))
    decoder = AwsChunkedDecoder(UNSIGNED, decoded_length=None, trailer=None, checksum_algorithm=None)
    with pytest.raises(errors.InvalidRequest, match="too long"):
        decoder.feed(b"3\r\nabc\r\n0\r\nx-amz-checksum-crc32:" + b"A" * MAX_LINE)


def test_no_trailer_and_plain_final_chunk() -> None:
    assert decode(UNSIGNED, b"3\r\nabc\r\n0\r\n\r\n", decoded_length=3) == (b"abc", {})
    # A chunk-signature extension on an unsigned body is tolerated and ignored.
    assert decode(UNSIGNED, b"3;chunk-signature=" + b"0" * 64 + b"\r\nabc\r\n0\r\n\r\n") == (b"abc", {})
    # Some clients stop right after the last trailer line.
    assert decode(UNSIGNED, GOOD[:-2], decoded_length=11, trailer=TRAILER)[1] == {TRAILER: "DUoRhQ=="}


def test_payload_is_handed_back_without_copies() -> None:
    data = bytes(range(256)) * 16384  # 4 MiB in one chunk
    body = b"%x\r\n" % len(data) + data + b"\r\n0\r\n\r\n"
    decoder = AwsChunkedDecoder(UNSIGNED, decoded_length=len(data), trailer=None, checksum_algorithm=None)
    pieces = decoder.feed(body)
    assert len(pieces) == 1 and isinstance(pieces[0], memoryview) and pieces[0].obj is body
    assert pieces[0] == data and decoder.received == len(data)
    assert decoder.finish() == {}


def test_unknown_checksum_algorithm() -> None:
    with pytest.raises(ValueError):
        AwsChunkedDecoder(UNSIGNED, decoded_length=None, trailer=None, checksum_algorithm="ADLER32")


def test_only_the_last_chunk_may_be_shorter_than_8_kib() -> None:
    """As S3: a chunk under 8192 bytes followed by another is refused (1-byte chunks cost a framing line,
    and for signed bodies a signature, per byte); the last one may be any size."""
    big, small = b"a" * 8192, b"b" * 100
    body = b"2000\r\n" + big + b"\r\n64\r\n" + small + b"\r\n0\r\n\r\n"
    assert decode(UNSIGNED, body, min_chunk_size=8192)[0] == big + small
    body = b"64\r\n" + small + b"\r\n2000\r\n" + big + b"\r\n0\r\n\r\n"
    with pytest.raises(errors.InvalidChunkSizeError) as exc:
        decode(UNSIGNED, body, min_chunk_size=8192)
    assert exc.value.status == 403 and exc.value.fields["BadChunkSize"] == "100"
    one_byte = b"".join(b"1\r\nx\r\n" for _ in range(3)) + b"0\r\n\r\n"
    with pytest.raises(errors.InvalidChunkSizeError):
        AwsChunkedDecoder(UNSIGNED, decoded_length=None, trailer=None, checksum_algorithm=None).feed(one_byte)
