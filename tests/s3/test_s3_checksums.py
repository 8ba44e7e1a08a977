"""Checksums: known values, agreement with botocore's own implementations, incremental updates, headers."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest
from botocore import httpchecksum
from hypothesis import given
from hypothesis import strategies as st

from tests.s3.s3_helpers import boto3_client, boto3_wire
from tsproxy import errors
from tsproxy.s3.checksums import ALGORITHMS, Checksum, checksum_headers, declared_trailer, header_name

# Published check values of each CRC over b"123456789" (CRC catalogue), big-endian as S3 sends them.
CHECK = {
    "CRC32": 0xCBF43926,
    "CRC32C": 0xE3069283,
    "CRC64NVME": 0xAE8B14860A799888,
}


@pytest.mark.parametrize("algorithm", sorted(CHECK))
def test_crc_check_values(algorithm: str) -> None:
    c = Checksum(algorithm)
    c.update(b"123456789")
    assert c.digest() == CHECK[algorithm].to_bytes(ALGORITHMS[algorithm], "big")


def test_hash_values() -> None:
    for name in ("SHA1", "SHA256", "SHA512", "MD5"):
        c = Checksum(name.lower())
        c.update(memoryview(b"abc"))
        assert c.b64digest() == base64.b64encode(hashlib.new(name, b"abc").digest()).decode()


# botocore has every algorithm but MD5, which test_hash_values checks against hashlib.
BOTOCORE = sorted(a for a in ALGORITHMS if a.lower() in httpchecksum._CHECKSUM_CLS)


@pytest.mark.parametrize("algorithm", BOTOCORE)
@given(pieces=st.lists(st.binary(max_size=300), max_size=8))
def test_incremental_equals_botocore(algorithm: str, pieces: list[bytes]) -> None:
    ours = Checksum.new(algorithm)
    for piece in pieces:
        ours.update(piece)
    theirs = httpchecksum._CHECKSUM_CLS[algorithm.lower()]()
    theirs.update(b"".join(pieces))
    assert ours.b64digest() == theirs.b64digest()
    assert ours.header == f"x-amz-checksum-{algorithm.lower()}" == header_name(algorithm)


def test_unknown_algorithm() -> None:
    with pytest.raises(ValueError):
        Checksum("ADLER32")


def test_digest_twice_and_no_update_after_an_xxhash_digest() -> None:
    c = Checksum("XXHASH64")
    c.update(b"abc")
    assert c.digest() == c.digest()
    with pytest.raises(ValueError):
        c.update(b"more")


def test_checksum_headers() -> None:
    crc = base64.b64encode(b"\x00\x01\x02\x03").decode()
    headers = {
        "X-Amz-Checksum-CRC32": crc,
        "x-amz-checksum-mode": "ENABLED",
        "x-amz-checksum-type": "FULL_OBJECT",
        "x-amz-sdk-checksum-algorithm": "CRC32",
        "content-md5": "x",
    }
    assert checksum_headers(headers) == {"x-amz-checksum-crc32": crc}
    assert checksum_headers({}) == {}
    for bad in ("not base64!", base64.b64encode(b"\x00" * 5).decode(), ""):
        with pytest.raises(errors.InvalidRequest, match="x-amz-checksum-crc32"):
            checksum_headers({"x-amz-checksum-crc32": bad})


def test_header_checksums_as_boto3_sends_them() -> None:
    for algorithm in BOTOCORE:

        def put(client: Any, algorithm: str = algorithm) -> Any:
            return client.put_object(Bucket="b", Key="k", Body=b"data", ChecksumAlgorithm=algorithm)

        wire = boto3_wire(boto3_client("http://s3.test"), put)
        sums = checksum_headers(wire.headers)
        ours = Checksum(algorithm)
        ours.update(b"data")
        assert sums == {header_name(algorithm): ours.b64digest()}


def test_declared_trailer() -> None:
    assert declared_trailer({}) is None
    assert declared_trailer({"X-Amz-Trailer": " X-Amz-Checksum-CRC32C "}) == "x-amz-checksum-crc32c"
    with pytest.raises(errors.InvalidRequest, match="Multiple"):
        declared_trailer({"x-amz-trailer": "x-amz-checksum-crc32,x-amz-checksum-sha1"})
    with pytest.raises(errors.InvalidRequest, match="not supported"):
        declared_trailer({"x-amz-trailer": "x-amz-meta-later"})
    with pytest.raises(errors.InvalidRequest, match="not supported"):
        declared_trailer({"x-amz-trailer": "x-amz-checksum-adler32"})
