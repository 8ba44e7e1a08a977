"""The compression codecs of Kafka record batches (attributes bits 0-2), both directions.

Decompression is what the reader needs; compression exists for the test/benchmark builder. Every
decompressor consumes its whole input and rejects truncated or trailing data, because a batch body is
exactly one compressed stream. zstd frames written by Kafka's streaming encoder carry no content size,
so zstd is always decoded as a stream. The optional libraries (snappy, lz4) load on first use and a
missing one is a :class:`CodecUnavailableError`, not a corrupt batch.
"""

from __future__ import annotations

import struct
import zlib
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


class CodecDataError(ValueError):
    """Compressed data is malformed, truncated or followed by stray bytes."""


def decompress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    """Decompress a batch body written with ``codec``; raises CodecDataError on bad data."""
    try:
        if codec == CODEC_GZIP:
            return _gunzip(data)
        if codec == CODEC_SNAPPY:
            return _unsnappy(data)
        if codec == CODEC_LZ4:
            return _unlz4(data)
        if codec == CODEC_ZSTD:
            return _unzstd(data)
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


def _gunzip(data: bytes | bytearray | memoryview) -> bytes:
    out = []
    rest: Any = data
    while True:
        unpacker = zlib.decompressobj(_GZIP_WBITS)
        out.append(unpacker.decompress(rest))
        if not unpacker.eof:
            raise CodecDataError("gzip stream is truncated")
        rest = unpacker.unused_data
        if not rest:  # concatenated members are legal gzip; anything else after the end is not
            return b"".join(out)


def _unsnappy(data: bytes | bytearray | memoryview) -> bytes:
    raw = _snappy_module().decompress_raw
    view = memoryview(data)
    if view[: len(XERIAL_MAGIC)] != XERIAL_MAGIC:
        return bytes(raw(view))
    # The version fields are not checked: some producers write them little-endian.
    pos, end, out = len(XERIAL_HEADER), len(view), []
    while pos < end:
        if end - pos < 4:
            raise CodecDataError(f"xerial snappy block header truncated at {pos}")
        (size,) = _INT32.unpack_from(view, pos)
        pos += 4
        if size < 0 or pos + size > end:
            raise CodecDataError(f"xerial snappy block of {size} bytes at {pos - 4} overruns the data")
        out.append(bytes(raw(view[pos : pos + size])))
        pos += size
    return b"".join(out)


def _unlz4(data: bytes | bytearray | memoryview) -> bytes:
    lz4_frame = _lz4_frame()
    if lz4_frame is None:
        return bytes(_cramjam().lz4.decompress(data))
    out = []
    rest: Any = data
    while True:
        unpacker = lz4_frame.LZ4FrameDecompressor()
        out.append(unpacker.decompress(rest))
        if not unpacker.eof:
            raise CodecDataError("lz4 frame is truncated")
        rest = unpacker.unused_data
        if not rest:
            return b"".join(out)


def _unzstd(data: bytes | bytearray | memoryview) -> bytes:
    out = []
    rest: Any = data
    decompressor = zstandard.ZstdDecompressor()  # not thread-safe, so one per call
    while True:
        unpacker = decompressor.decompressobj()
        out.append(unpacker.decompress(rest))
        if not unpacker.eof:
            raise CodecDataError("zstd frame is truncated")
        rest = unpacker.unused_data
        if not rest:
            return b"".join(out)


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
