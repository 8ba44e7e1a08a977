"""The `auto` compression heuristic: does a segment start with already compressed Kafka record batches?

A Kafka log segment is a run of record batches (magic 2). Their header, big-endian:

    offset  size  field
    0       8     baseOffset
    8       4     batchLength       bytes after this field
    12      4     partitionLeaderEpoch
    16      1     magic             2
    17      4     crc               CRC32C of bytes 21 .. 12 + batchLength
    21      2     attributes        bits 0-2 codec (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), bit 5 control
    ...           (61 bytes of header in all)

Only a batch whose CRC32C checks out counts, so data that merely starts with plausible bytes is compressed as
usual. Control batches (transaction markers) are never compressed by Kafka, so the first data batch decides.

A multipart upload of a segment cuts it at arbitrary offsets: every part after the first starts inside a
batch. For those, `contains_compressed_kafka` looks for the first whole batch within the first SCAN_BYTES
of the part. Candidates are found by a regular expression on three header bytes (the high bytes of
baseOffset and batchLength are zero for any real segment, magic is 2), then checked like the start of a
segment, CRC included, at most MAX_CANDIDATES of them.
"""

from __future__ import annotations

import re
import struct

from awscrt.checksums import crc32c

_HEADER = struct.Struct(">qiibIh")
HEADER_SIZE = 61
_MIN_BATCH_LENGTH = HEADER_SIZE - 12
_CODEC_MASK = 0x07
_CONTROL = 0x20
# A segment opening with more control batches than this is not worth scanning further.
_MAX_BATCHES = 16
# How far into a part to look for the first batch header (Kafka's default max.message.bytes is 1 MiB),
# and how many candidate positions to check there before giving up.
SCAN_BYTES = 2 << 20
MAX_CANDIDATES = 64
# baseOffset < 2^56, batchLength < 2^24, magic 2: a zero byte, 7 bytes, a zero byte, 7 bytes, then 0x02.
_CANDIDATE = re.compile(rb"(?=\x00.{7}\x00.{7}\x02)", re.DOTALL)


def looks_like_compressed_kafka(prefix: bytes | bytearray | memoryview) -> bool:
    """True when prefix begins with valid record batches v2 and the first data batch has a compression codec.

    The first data batch must lie wholly inside prefix (its CRC is checked), otherwise the answer is False.
    """
    view = memoryview(prefix).cast("B")
    pos = 0
    for _ in range(_MAX_BATCHES):
        if len(view) - pos < HEADER_SIZE:
            return False
        base_offset, length, _epoch, magic, crc, attributes = _HEADER.unpack_from(view, pos)
        end = pos + 12 + length
        if magic != 2 or base_offset < 0 or length < _MIN_BATCH_LENGTH or end > len(view):
            return False
        if crc32c(view[pos + 21 : end]) != crc:
            return False
        if not attributes & _CONTROL:
            return attributes & _CODEC_MASK != 0
        pos = end
    return False


def contains_compressed_kafka(part: bytes | bytearray | memoryview) -> bool:
    """True when record batches start within the first SCAN_BYTES of part and the first data batch among
    them has a compression codec: part is a piece of a segment whose batches producers compressed.

    The first candidate whose batch checks out (CRC included) decides; data with no such batch is False.
    """
    view = memoryview(part).cast("B")
    candidates = _CANDIDATE.finditer(view[: SCAN_BYTES + HEADER_SIZE])
    for n, m in enumerate(candidates):
        if n >= MAX_CANDIDATES:
            break
        start = m.start()
        if len(view) - start < HEADER_SIZE:
            break
        _base, length, _epoch, _magic, crc, _attributes = _HEADER.unpack_from(view, start)
        end = start + 12 + length
        if length < _MIN_BATCH_LENGTH or end > len(view):
            continue
        if crc32c(view[start + 21 : end]) == crc:
            return looks_like_compressed_kafka(view[start:])
    return False
