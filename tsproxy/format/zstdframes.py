"""Where the zstd frames of a payload lie, read from their headers without inflating them. Pure, no I/O.

From format version 2 a compressed chunk is a run of standard zstd frames, each of the same number of
original bytes (the last shorter; FRAME_SIZE by default, the writer's choice), each declaring its
content size. Any zstd tool inflates such a run,
and a reader that needs part of a chunk inflates only the frames that hold it: a frame's compressed
length is found by walking its block headers (RFC 8878, section 3.1.1), a 3-byte little-endian word per
block giving its type and size, so nothing but the needed frames is inflated.

Every field is checked against the payload's bounds before it is trusted: a hostile payload is a
FrameError (an IntegrityError), never an over-read or a huge allocation.
"""

from __future__ import annotations

from dataclasses import dataclass

from tsproxy.errors import IntegrityError

# Original bytes per frame that format version 2 is written with by default (TransformSettings.frame_size).
# Readers never need it: they find the frames by their headers. 1 MiB in objects of releases before.
# 256 KiB: a 1 MiB read inside a 4 MiB chunk inflates about 1.25 MiB instead of 2, and on Kafka-like data
# it decoded in less CPU than 1 MiB frames while whole chunks decoded and stored as fast, in as many
# stored bytes (benchmarks/frames.py; README, "Figures behind the code's constants").
FRAME_SIZE = 256 << 10

_MAGIC = b"\x28\xb5\x2f\xfd"  # 0xFD2FB528, little-endian
_BLOCK_RAW, _BLOCK_RLE, _BLOCK_COMPRESSED = 0, 1, 2
_MAX_BLOCK = 128 * 1024  # Block_Maximum_Size's ceiling
_FCS_SIZES = (0, 2, 4, 8)  # by Frame_Content_Size_flag; flag 0 with Single_Segment means 1 byte
_DID_SIZES = (0, 1, 2, 4)  # by Dictionary_ID_flag


class FrameError(IntegrityError):
    """The payload is not a run of zstd frames that each declare their content size."""


@dataclass(frozen=True)
class Frame:
    """One zstd frame of a payload: where it lies and how many original bytes it holds."""

    offset: int  # into the payload
    length: int  # compressed bytes, header to last block (and checksum, if any)
    content_size: int  # original bytes


def frames(payload: bytes | memoryview, expected_total: int) -> list[Frame]:
    """The frames of a payload, in order; their content sizes must add up to `expected_total`."""
    view = memoryview(payload).cast("B")
    out: list[Frame] = []
    pos = 0
    total = 0
    while pos < len(view):
        frame = _frame_at(view, pos)
        total += frame.content_size
        if total > expected_total:
            raise FrameError(f"zstd frames: the run declares more than {expected_total} original bytes")
        out.append(frame)
        pos += frame.length
    if not out:
        raise FrameError("not a zstd frame (empty payload)")
    if total != expected_total:
        raise FrameError(f"zstd frames: the run declares {total} original bytes, expected {expected_total}")
    return out


def _frame_at(view: memoryview, pos: int) -> Frame:
    end = len(view)
    if end - pos < 6 or view[pos : pos + 4] != _MAGIC:
        raise FrameError(f"not a zstd frame (at payload offset {pos})")
    descriptor = view[pos + 4]
    fcs_flag = descriptor >> 6
    single_segment = (descriptor >> 5) & 1
    if descriptor & 0x08:
        raise FrameError("zstd frame header has its reserved bit set")
    has_checksum = (descriptor >> 2) & 1
    did_size = _DID_SIZES[descriptor & 0x03]
    fcs_size = 1 if fcs_flag == 0 and single_segment else _FCS_SIZES[fcs_flag]
    if fcs_size == 0:
        raise FrameError("zstd frame does not declare its content size")
    header = 5 + (0 if single_segment else 1) + did_size + fcs_size
    if end - pos < header:
        raise FrameError("zstd frame header is cut short")
    fcs = int.from_bytes(view[pos + header - fcs_size : pos + header], "little")
    if fcs_size == 2:
        fcs += 256  # the 2-byte field is stored minus 256
    cursor = pos + header
    while True:
        if end - cursor < 3:
            raise FrameError("zstd block header is cut short")
        word = int.from_bytes(view[cursor : cursor + 3], "little")
        last, kind, size = word & 1, (word >> 1) & 3, word >> 3
        if kind == 3:
            raise FrameError("zstd block of the reserved type")
        if size > _MAX_BLOCK:
            raise FrameError("zstd block larger than the format allows")
        cursor += 3 + (1 if kind == _BLOCK_RLE else size)
        if cursor > end:
            raise FrameError("zstd block runs past the payload")
        if last:
            break
    cursor += 4 if has_checksum else 0
    if cursor > end:
        raise FrameError("zstd frame checksum is cut short")
    return Frame(pos, cursor - pos, fcs)


def covering(run: list[Frame], start: int, stop: int) -> tuple[int, int, int]:
    """(first frame index, frame index past the last, original offset of the first) of the frames that
    hold original bytes [start, stop) of the run."""
    first = last = -1
    offset = first_offset = 0
    for i, frame in enumerate(run):
        if first < 0 and offset + frame.content_size > start:
            first, first_offset = i, offset
        if offset < stop:
            last = i
        offset += frame.content_size
    if first < 0 or stop <= start:
        return 0, 0, start
    return first, last + 1, first_offset
