"""A client's request body as a stream of payload bytes, checked as S3 checks it.

Handles plain bodies (Content-Length, optional signed SHA-256) and `aws-chunked` bodies (signed chunks or
unsigned with trailing checksums). Content-MD5 and `x-amz-checksum-*` values, sent as headers or as
trailers, are verified once the body has ended. A failed check raises the S3 error *before* the
iterator finishes, so whatever consumes it (a backend upload) aborts and nothing is stored.

A consumer that hashes the payload with MD5 anyway (the transform, for the ETag) takes the Content-MD5
check over: it asks for `content_md5(headers)` and passes `verify_md5=False`, and the payload is hashed
once. The check is then the consumer's to make before it stores anything.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from tsproxy import errors
from tsproxy.s3.checksums import Checksum, checksum_headers, declared_trailer
from tsproxy.s3.chunked import AwsChunkedDecoder
from tsproxy.s3.limits import MAX_PART_SIZE
from tsproxy.s3.sigv4 import AuthResult

# Payload bytes whose checks (SHA-256, chunk signatures, checksums) go to a worker thread at once: one
# hand-over per MiB or so, not one per piece aiohttp received.
READ_SIZE = 1 << 20


@dataclass
class BodyResult:
    """What the body turned out to be, filled in as the stream ends."""

    size: int = 0
    checksums: dict[str, str] = field(default_factory=dict)  # header name -> base64 value, to echo


class ContentReader(Protocol):
    """The part of aiohttp's StreamReader that we use."""

    async def readany(self) -> bytes: ...


def _declared_length(headers: Mapping[str, str], chunked: bool) -> int | None:
    name = "x-amz-decoded-content-length" if chunked else "content-length"
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise errors.InvalidArgument(f"{name} is not a number", ArgumentName=name) from None
    if value < 0:
        raise errors.InvalidArgument(f"{name} is negative", ArgumentName=name)
    return value


def declared_length(headers: Mapping[str, str]) -> int | None:
    """The payload's length as the request declares it (x-amz-decoded-content-length for aws-chunked),
    or None; the payload itself is checked against it as it is read (IncompleteBody)."""
    raw = headers.get("x-amz-decoded-content-length") or headers.get("content-length")
    return int(raw) if raw and raw.isascii() and raw.isdigit() else None


def content_md5(headers: Mapping[str, str]) -> bytes | None:
    """The digest the Content-MD5 header gives, None without one; InvalidDigest when it is malformed."""
    raw = headers.get("content-md5")
    if raw is None:
        return None
    try:
        digest = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise errors.InvalidDigest() from None
    if len(digest) != 16:
        raise errors.InvalidDigest()
    return digest


async def _read(content: ContentReader, idle_timeout: float | None) -> bytes:
    """The next bytes the client sent; RequestTimeout when it sent none for `idle_timeout` seconds.

    What aiohttp has received, as it received it: read(n) would join its pieces into a new buffer,
    a copy of every payload byte (and fresh memory to fault in) for nothing.
    """
    if idle_timeout is None:
        return await content.readany()
    try:
        async with asyncio.timeout(idle_timeout):
            return await content.readany()
    except TimeoutError:
        raise errors.RequestTimeout() from None


async def payload(
    content: ContentReader,
    headers: Mapping[str, str],
    auth: AuthResult,
    result: BodyResult,
    *,
    idle_timeout: float | None = None,
    verify_md5: bool = True,
) -> AsyncIterator[bytes | memoryview]:
    """Yield the client's payload bytes; raise the S3 error of the first failed check.

    `headers` is case-insensitive. `result` receives the size and checksums once the body ends.
    verify_md5 False: the consumer checks Content-MD5 itself (see the module's docstring); a malformed
    header is still InvalidDigest here.
    A client that stops sending for `idle_timeout` seconds gets RequestTimeout, as S3 answers one
    whose body stalls (S3 waits about 20 s); whatever consumed the stream so far is then abandoned.
    """
    mode = auth.payload_mode
    chunked = mode.startswith("STREAMING-")
    length = _declared_length(headers, chunked)
    if chunked and length is None and "content-length" not in headers:
        raise errors.MissingContentLength()
    if not chunked and length is None:  # a body sent with Transfer-Encoding: chunked too, as S3 answers
        raise errors.MissingContentLength()
    if length is not None and length > MAX_PART_SIZE:
        raise errors.EntityTooLarge()

    expected_md5 = content_md5(headers)
    header_sums = checksum_headers(headers)
    trailer = declared_trailer(headers) if chunked else None
    if len(header_sums) + (1 if trailer else 0) > 1:
        raise errors.InvalidRequest(
            "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed."
        )
    algorithm: str | None = None
    if header_sums:
        algorithm = next(iter(header_sums)).rsplit("-", 1)[-1].upper()
    elif trailer:
        algorithm = trailer.rsplit("-", 1)[-1].upper()
    try:
        checksum = Checksum(algorithm) if algorithm else None
    except ValueError:
        raise errors.InvalidRequest(f"Unsupported checksum algorithm {algorithm}") from None

    # Here MD5 is only for a Content-MD5 check that no consumer took over.
    md5 = hashlib.md5() if expected_md5 is not None and verify_md5 else None
    sha256 = hashlib.sha256() if mode == "SHA256" else None
    decoder = (
        AwsChunkedDecoder(auth, decoded_length=length, trailer=trailer, checksum_algorithm=None)
        if chunked
        else None
    )
    received = 0

    def account(piece: bytes | memoryview) -> None:
        nonlocal received
        received += len(piece)
        if length is not None and received > length:
            raise errors.InvalidRequest("The body is longer than its declared length.")
        if md5 is not None:
            md5.update(piece)
        if checksum is not None:
            checksum.update(piece)

    def process(reads: list[bytes]) -> list[bytes | memoryview]:
        # Hashing and chunk-signature checks are CPU work: done on a worker thread, READ_SIZE at a time.
        pieces: list[bytes | memoryview] = []
        for raw in reads:
            if sha256 is not None:
                sha256.update(raw)
            # The decoder's pieces are views of `raw`, which is immutable: passed on as they are.
            pieces += [raw] if decoder is None else decoder.feed(raw)
        for piece in pieces:
            account(piece)
        return pieces

    hashing = md5 is not None or sha256 is not None or checksum is not None or decoder is not None
    ended = False
    while not ended:
        raw = await _read(content, idle_timeout)
        if not raw:
            break
        if not hashing:
            account(raw)
            yield raw
            continue
        reads, gathered = [raw], len(raw)
        while gathered < READ_SIZE:
            raw = await _read(content, idle_timeout)
            if not raw:
                ended = True
                break
            reads.append(raw)
            gathered += len(raw)
        for piece in await asyncio.to_thread(process, reads):
            yield piece

    trailers: dict[str, str] = decoder.finish() if decoder is not None else {}
    if length is not None and received != length:
        raise errors.IncompleteBody()
    if sha256 is not None and sha256.hexdigest() != (auth.payload_sha256 or "").lower():
        raise errors.XAmzContentSHA256Mismatch()
    if md5 is not None and md5.digest() != expected_md5:
        raise errors.BadDigest()
    if checksum is not None and algorithm is not None:
        name = f"x-amz-checksum-{algorithm.lower()}"
        claimed = header_sums.get(name) or trailers.get(name)
        if claimed is None:
            raise errors.InvalidRequest(f"The {name} trailer was declared but not sent.")
        if claimed != checksum.b64digest():
            raise errors.BadDigest(f"The {algorithm} you specified did not match the calculated checksum.")
        result.checksums[name] = claimed
    result.size = received
