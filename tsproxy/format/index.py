"""The chunk index: compact stored-size lists and the mapping from original byte ranges to stored ones.

Original chunks all have the segment's fixed chunk size except the last of each segment, so only the
stored (transformed) sizes are recorded, one list per segment, each encoded as

    varint count
    count == 0: nothing more
    count == 1: varint size
    count >= 2: varint base, u8 width, the count-1 leading sizes minus base packed in `width` bits each
                (most significant bit first, zero padded to a byte), varint last size

where base is the smallest leading size and width the fewest bits holding the largest difference (0
when every leading size is equal, as without compression). The last size stands apart because a
segment's short last chunk would otherwise widen every value.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain
from typing import Protocol

from tsproxy.errors import InvalidRange

from .wire import Reader, varint

# Stored sizes are below 64 MiB + 16, so a size varint never needs more than four bytes.
MAX_STORED_CHUNK = 1 << 28


def encode_sizes(sizes: Sequence[int]) -> bytes:
    """Encode one segment's stored chunk sizes (see the module docstring for the layout)."""
    count = len(sizes)
    if count == 0:
        return b"\x00"
    if min(sizes) < 0:
        raise ValueError("chunk sizes cannot be negative")
    if count == 1:
        return varint(1) + varint(sizes[0])
    leading = sizes[:-1]
    base = min(leading)
    width = (max(leading) - base).bit_length()
    return b"".join(
        (
            varint(count),
            varint(base),
            bytes((width,)),
            _pack([v - base for v in leading], width),
            varint(sizes[-1]),
        )
    )


def decode_sizes(reader: Reader, max_count: int) -> tuple[int, ...]:
    """Read one size list written by encode_sizes; at most max_count sizes are accepted."""
    count = reader.varint(max_count)
    if count == 0:
        return ()
    if count == 1:
        return (reader.varint(MAX_STORED_CHUNK),)
    base = reader.varint(MAX_STORED_CHUNK)
    width = reader.u8()
    if width > 28:
        raise reader.fail(f"chunk size width {width} too large")
    packed = reader.take(((count - 1) * width + 7) // 8)
    leading = _unpack(packed, count - 1, width)
    last = reader.varint(MAX_STORED_CHUNK)
    if base:
        leading = [v + base for v in leading]
    return (*leading, last)


def _pack(values: Sequence[int], width: int) -> bytes:
    # Eight values of `width` bits make exactly `width` bytes, so pack eight at a time into one int.
    if width == 0:
        return b""
    out = bytearray()
    for start in range(0, len(values), 8):
        group = values[start : start + 8]
        acc = 0
        for value in group:
            acc = (acc << width) | value
        acc <<= width * (8 - len(group))
        out += acc.to_bytes(width, "big")
    del out[(len(values) * width + 7) // 8 :]
    return bytes(out)


def _unpack(packed: memoryview, count: int, width: int) -> list[int]:
    if width == 0:
        return [0] * count
    groups = (count + 7) // 8
    padded = bytes(packed) + bytes(groups * width - len(packed))
    mask = (1 << width) - 1
    shifts = [width * (7 - k) for k in range(8)]
    out: list[int] = []
    for g in range(groups):
        acc = int.from_bytes(padded[g * width : (g + 1) * width], "big")
        out.extend((acc >> s) & mask for s in shifts)
    del out[count:]
    return out


class SegmentSizes(Protocol):
    """What the index needs to know of a segment (SegmentInfo provides it)."""

    @property
    def segment_no(self) -> int: ...
    @property
    def original_size(self) -> int: ...
    @property
    def stored_sizes(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class ChunkRef:
    """One chunk: where it lies in the stored object's data area and in the original object."""

    segment_no: int
    chunk_no: int
    last: bool
    stored_offset: int
    stored_len: int
    original_offset: int
    original_len: int


@dataclass(frozen=True)
class Span:
    """The chunks covering an original byte range and the contiguous stored bytes holding them."""

    chunks: tuple[ChunkRef, ...]
    stored_start: int
    stored_end: int  # exclusive

    @property
    def original_start(self) -> int:
        """Original offset of the first byte the span's chunks decode to."""
        return self.chunks[0].original_offset


class ChunkIndex:
    """Maps original byte positions to chunks and stored byte ranges, over all segments of an object.

    Memory is one 8-byte stored offset per chunk plus a few integers per segment; original offsets are
    computed from the fixed chunk size.
    """

    def __init__(self, chunk_size: int, segments: Sequence[SegmentSizes]) -> None:
        self.chunk_size = chunk_size
        # Per non-empty segment: number, original start, first global chunk, chunk count, original size.
        self._seg_no: list[int] = []
        self._seg_orig: list[int] = []
        self._seg_first: list[int] = []
        self._seg_count: list[int] = []
        self._seg_size: list[int] = []
        orig = 0
        first = 0
        for seg in segments:
            count = len(seg.stored_sizes)
            if count:
                self._seg_no.append(seg.segment_no)
                self._seg_orig.append(orig)
                self._seg_first.append(first)
                self._seg_count.append(count)
                self._seg_size.append(seg.original_size)
            orig += seg.original_size
            first += count
        self.size = orig
        self._stored = array(
            "q", accumulate(chain.from_iterable(s.stored_sizes for s in segments), initial=0)
        )
        self.stored_size: int = self._stored[-1]

    def __len__(self) -> int:
        return len(self._stored) - 1

    def __iter__(self) -> Iterator[ChunkRef]:
        return (self.chunk(i) for i in range(len(self)))

    def chunk(self, i: int) -> ChunkRef:
        """The i-th chunk of the object (0-based, across segments)."""
        if not 0 <= i < len(self):
            raise IndexError(f"chunk {i} out of range (object has {len(self)})")
        s = bisect.bisect_right(self._seg_first, i) - 1
        k = i - self._seg_first[s]
        within = k * self.chunk_size
        return ChunkRef(
            segment_no=self._seg_no[s],
            chunk_no=k,
            last=k == self._seg_count[s] - 1,
            stored_offset=self._stored[i],
            stored_len=self._stored[i + 1] - self._stored[i],
            original_offset=self._seg_orig[s] + within,
            original_len=min(self.chunk_size, self._seg_size[s] - within),
        )

    def chunk_at(self, original_offset: int) -> int:
        """Index of the chunk holding the original byte at original_offset."""
        if not 0 <= original_offset < self.size:
            raise IndexError(f"offset {original_offset} outside the object (size {self.size})")
        s = bisect.bisect_right(self._seg_orig, original_offset) - 1
        return self._seg_first[s] + (original_offset - self._seg_orig[s]) // self.chunk_size

    def span(self, first_byte: int, last_byte: int) -> Span:
        """Chunks and stored range covering original bytes first_byte..last_byte (both inclusive)."""
        if not 0 <= first_byte <= last_byte < self.size:
            raise InvalidRange(
                f"bytes {first_byte}-{last_byte} are not within an object of {self.size} bytes"
            )
        i0 = self.chunk_at(first_byte)
        i1 = self.chunk_at(last_byte)
        return Span(
            chunks=tuple(self.chunk(i) for i in range(i0, i1 + 1)),
            stored_start=self._stored[i0],
            stored_end=self._stored[i1 + 1],
        )
