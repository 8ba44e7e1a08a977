"""The compression codecs of Kafka record batches (attributes bits 0-2), both directions.

Decompression is what the reader needs; compression exists for the test/benchmark builder. Every
decompressor consumes its whole input and rejects truncated or trailing data, because a batch body is
exactly one compressed stream. zstd frames written by Kafka's streaming encoder carry no content size,
so zstd is always decoded as a stream. The optional libraries (snappy, lz4) load on first use and a
missing one is a :class:`CodecUnavailableError`, not a corrupt batch.

Output is bounded: a body that would decompress to more than ``limit`` bytes (MAX_DECOMPRESSED by
default) is refused as bad data before much more than the limit is ever held, so a hostile or
mangled batch with a valid CRC cannot exhaust a reader's memory. gzip stops at the limit;
snappy is checked from the sizes its blocks declare; zstd and lz4 are fed in slices small enough that
one slice cannot expand far past it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import Any

import zstandard

from .errors import CodecUnavailableError

CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
CODEC_ZSTD = 4
CODEC_NAMES = {
    CODEC_NONE: "none",
    CODEC_GZIP: "gzip",
    CODEC_SNAPPY: "snappy",
    CODEC_LZ4: "lz4",
    CODEC_ZSTD: "zstd",
}

# Java clients frame snappy the way xerial's SnappyOutputStream does: this 16-byte header (marker,
# "SNAPPY", NUL, version 1, compatible version 1), then blocks of [int32 BE length][raw snappy block].
XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
XERIAL_BLOCK_SIZE = 32 * 1024
_INT32 = struct.Struct(">i")

# gzip only (wbits 16 + 15): a Kafka gzip body is a gzip member stream, never a raw zlib stream.
_GZIP_WBITS = 31

# No batch a Kafka producer writes comes near this once decompressed (a broker refuses batches over
# message.max.bytes, 1 MiB by default, before they are ever compressed this well).
MAX_DECOMPRESSED = 256 << 20
# Input per call of a streaming decoder, so that one call cannot expand far past the limit: a zstd
# block of 4 bytes can expand to 128 KiB (32768 times, so 128 MiB for 4 KiB), an lz4 sequence at most
# about 255 times (16 MiB for 64 KiB).
_ZSTD_SLICE = 4096
_LZ4_SLICE = 64 << 10


class CodecDataError(ValueError):
    """Compressed data is malformed, truncated or followed by stray bytes."""


def decompress(codec: int, data: bytes | bytearray | memoryview, limit: int | None = None) -> bytes:
    """Decompress a batch body written with ``codec``; CodecDataError on bad data or more than ``limit``
    (default MAX_DECOMPRESSED) bytes of output."""
    limit = MAX_DECOMPRESSED if limit is None else limit
    try:
        if codec == CODEC_GZIP:
            return _gunzip(data, limit)
        if codec == CODEC_SNAPPY:
            return _unsnappy(data, limit)
        if codec == CODEC_LZ4:
            return _unlz4(data, limit)
        if codec == CODEC_ZSTD:
            return _unzstd(data, limit)
    except (CodecDataError, CodecUnavailableError):
        raise
    except Exception as exc:  # each library has its own error types; all mean "bad data" here
        raise CodecDataError(f"{type(exc).__name__}: {exc}") from exc
    raise CodecDataError(f"unknown compression codec {codec}")


def compress(codec: int, data: bytes, *, snappy_xerial: bool = True) -> bytes:
    """Compress a batch body the way Kafka's Java producer does (xerial-framed snappy by default)."""
    if codec == CODEC_GZIP:
        packer = zlib.compressobj(6, zlib.DEFLATED, _GZIP_WBITS)
        return packer.compress(data) + packer.flush()
    if codec == CODEC_SNAPPY:
        raw = _snappy_module().compress_raw
        if not snappy_xerial:
            return bytes(raw(data))
        parts = [XERIAL_HEADER]
        for start in range(0, len(data), XERIAL_BLOCK_SIZE):
            block = bytes(raw(data[start : start + XERIAL_BLOCK_SIZE]))
            parts += (_INT32.pack(len(block)), block)
        return b"".join(parts)
    if codec == CODEC_LZ4:
        lz4_frame = _lz4_frame()
        if lz4_frame is not None:
            # Kafka reads independent blocks only.
            return bytes(lz4_frame.compress(data, block_linked=False))
        return bytes(_cramjam().lz4.compress(data))
    if codec == CODEC_ZSTD:
        # The streaming API leaves the content size out of the frame header, as Kafka's zstd-jni does.
        zstd_packer = zstandard.ZstdCompressor().compressobj()
        return zstd_packer.compress(data) + zstd_packer.flush()
    raise ValueError(f"cannot compress with codec {codec}")


def _too_big(limit: int) -> CodecDataError:
    return CodecDataError(f"decompresses to more than {limit} bytes (the limit for one batch)")


def _gunzip(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    out: list[bytes] = []
    total = 0
    rest: Any = data
    while True:
        unpacker = zlib.decompressobj(_GZIP_WBITS)
        while True:
            piece = unpacker.decompress(rest, limit - total + 1)
            total += len(piece)
            if total > limit:
                raise _too_big(limit)
            out.append(piece)
            rest = unpacker.unconsumed_tail
            if unpacker.eof or not rest:
                break
        if not unpacker.eof:
            raise CodecDataError("gzip stream is truncated")
        rest = unpacker.unused_data
        if not rest:  # concatenated members are legal gzip; anything else after the end is not
            return b"".join(out)


def _unsnappy(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    snappy = _snappy_module()
    view = memoryview(data)
    if view[: len(XERIAL_MAGIC)] != XERIAL_MAGIC:
        if snappy.decompress_raw_len(view) > limit:
            raise _too_big(limit)
        return bytes(snappy.decompress_raw(view))
    # The version fields are not checked: some producers write them little-endian.
    pos, end, out, total = len(XERIAL_HEADER), len(view), [], 0
    while pos < end:
        if end - pos < 4:
            raise CodecDataError(f"xerial snappy block header truncated at {pos}")
        (size,) = _INT32.unpack_from(view, pos)
        pos += 4
        if size < 0 or pos + size > end:
            raise CodecDataError(f"xerial snappy block of {size} bytes at {pos - 4} overruns the data")
        block = view[pos : pos + size]
        total += snappy.decompress_raw_len(block)
        if total > limit:
            raise _too_big(limit)
        out.append(bytes(snappy.decompress_raw(block)))
        pos += size
    return b"".join(out)


def _unlz4(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    lz4_frame = _lz4_frame()
    if lz4_frame is None:
        whole = bytes(_cramjam().lz4.decompress(data))  # no streaming API: checked afterwards
        if len(whole) > limit:
            raise _too_big(limit)
        return whole
    return _sliced(data, limit, lz4_frame.LZ4FrameDecompressor, _LZ4_SLICE, "lz4 frame")


def _unzstd(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    decompressor = zstandard.ZstdDecompressor()  # not thread-safe, so one per call
    return _sliced(data, limit, decompressor.decompressobj, _ZSTD_SLICE, "zstd frame")


def _sliced(
    data: bytes | bytearray | memoryview, limit: int, new: Callable[[], Any], step: int, what: str
) -> bytes:
    """Decode concatenated frames with a streaming decoder fed ``step`` bytes at a time."""
    out: list[bytes] = []
    total = 0
    view = memoryview(data).cast("B")
    while True:
        unpacker = new()
        pos = 0
        while pos < len(view) and not unpacker.eof:
            piece = unpacker.decompress(view[pos : pos + step])
            pos += step
            total += len(piece)
            if total > limit:
                raise _too_big(limit)
            out.append(piece)
        if not unpacker.eof:
            raise CodecDataError(f"{what} is truncated")
        rest = (unpacker.unused_data or b"") + view[pos:].tobytes()  # another frame, or stray bytes
        if not rest:
            return b"".join(out)
        view = memoryview(rest)


def _cramjam() -> Any:
    try:
        import cramjam
    except ImportError as exc:
        raise CodecUnavailableError("snappy/lz4 batches need cramjam: install tsproxy[spark]") from exc
    return cramjam


def _snappy_module() -> Any:
    return _cramjam().snappy


def _lz4_frame() -> Any:
    try:
        import lz4.frame
    except ImportError:
        return None
    return lz4.frame
