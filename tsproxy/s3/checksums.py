"""The additional checksums S3 accepts on uploads (`x-amz-checksum-*`), computed incrementally.

A checksum travels base64-encoded, either as a request header or as a trailer of an `aws-chunked` body
(declared up front in `x-amz-trailer`). CRC values are sent big-endian, as S3 and the SDKs do. Besides
the five long-standing algorithms, the newer ones of S3's model (MD5, SHA512, XXHASH64, XXHASH3,
XXHASH128) are accepted too, so a client that picks one is not turned away.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import zlib
from collections.abc import Mapping

from awscrt import checksums as crt

from tsproxy import errors

# Algorithm name -> digest length in bytes.
ALGORITHMS: dict[str, int] = {
    "CRC32": 4,
    "CRC32C": 4,
    "CRC64NVME": 8,
    "SHA1": 20,
    "SHA256": 32,
    "SHA512": 64,
    "MD5": 16,
    "XXHASH64": 8,
    "XXHASH3": 8,
    "XXHASH128": 16,
}
_HASHLIB = {"SHA1": "sha1", "SHA256": "sha256", "SHA512": "sha512", "MD5": "md5"}
_XXHASH = {
    "XXHASH64": crt.XXHash.new_xxhash64,
    "XXHASH3": crt.XXHash.new_xxhash3_64,
    "XXHASH128": crt.XXHash.new_xxhash3_128,
}
HEADER_PREFIX = "x-amz-checksum-"


def header_name(algorithm: str) -> str:
    """The header (and trailer) name that carries a checksum, e.g. ``x-amz-checksum-crc32c``."""
    return HEADER_PREFIX + algorithm.lower()


class Checksum:
    """One running checksum over a byte stream.

    ``Checksum("crc32c")``; the name is case-insensitive. Unknown names raise ValueError, so the caller
    decides which S3 error that is.
    """

    def __init__(self, algorithm: str) -> None:
        name = algorithm.upper()
        if name not in ALGORITHMS:
            raise ValueError(f"unsupported checksum algorithm {algorithm!r}")
        self.algorithm = name
        self._crc = 0
        self._hash = hashlib.new(_HASHLIB[name]) if name in _HASHLIB else None
        self._xxhash = _XXHASH[name]() if name in _XXHASH else None
        self._final: bytes | None = None  # an xxhash can be finalised only once

    @classmethod
    def new(cls, algorithm: str) -> Checksum:
        """Same as the constructor; reads well at call sites that pick the algorithm at run time."""
        return cls(algorithm)

    @property
    def header(self) -> str:
        """The header name this checksum is sent under."""
        return header_name(self.algorithm)

    def update(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes to the checksum."""
        if self._hash is not None:
            self._hash.update(data)
        elif self._xxhash is not None:
            if self._final is not None:
                raise ValueError("checksum already finalised")
            # The CRT binding takes nothing but bytes here: one copy of the piece, bounded by its size.
            self._xxhash.update(data if isinstance(data, bytes) else bytes(data))
        elif self.algorithm == "CRC32":
            self._crc = zlib.crc32(data, self._crc)
        elif self.algorithm == "CRC32C":
            self._crc = crt.crc32c(data, self._crc)
        else:
            self._crc = crt.crc64nvme(data, self._crc)

    def digest(self) -> bytes:
        """The raw checksum: big-endian for CRCs, the digest for hashes."""
        if self._hash is not None:
            return self._hash.digest()
        if self._xxhash is not None:
            if self._final is None:
                self._final = bytes(self._xxhash.finalize())
            return self._final
        return self._crc.to_bytes(ALGORITHMS[self.algorithm], "big")

    def b64digest(self) -> str:
        """The checksum as S3 sends it: base64 of `digest()`."""
        return base64.b64encode(self.digest()).decode("ascii")


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def checksum_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The `x-amz-checksum-<algorithm>` values the client sent as headers, keyed by lower-case name.

    Only algorithms S3 knows count (``x-amz-checksum-mode`` and ``-type`` are not checksums). A
    value that is not base64 of the right length is S3's InvalidRequest.
    """
    out: dict[str, str] = {}
    for name, value in _lower(headers).items():
        if not name.startswith(HEADER_PREFIX):
            continue
        algorithm = name[len(HEADER_PREFIX) :].upper()
        if algorithm not in ALGORITHMS:
            continue
        value = value.strip()
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != ALGORITHMS[algorithm]:
            raise errors.InvalidRequest(f"Value for {name} header is invalid.")
        out[name] = value
    return out


def declared_trailer(headers: Mapping[str, str]) -> str | None:
    """The trailer the client announced in `x-amz-trailer` (lower case), or None.

    tsproxy accepts one trailer, a checksum of a known algorithm: that is what every SDK sends.
    """
    raw = _lower(headers).get("x-amz-trailer", "").strip().lower()
    if not raw:
        return None
    if "," in raw:
        raise errors.InvalidRequest(
            "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed."
        )
    if not raw.startswith(HEADER_PREFIX) or raw[len(HEADER_PREFIX) :].upper() not in ALGORITHMS:
        raise errors.InvalidRequest(
            f"The value specified in the x-amz-trailer header is not supported: {raw}"
        )
    return raw
