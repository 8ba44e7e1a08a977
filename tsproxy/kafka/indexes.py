"""Kafka's sparse segment indexes, and how to use them to seek and to split a segment.

``.index`` (offset index): 8-byte entries ``relative offset int32, position int32``. A broker adds
one for a batch once more than ``index.interval.bytes`` were appended since the last entry, keyed by
the batch's *last* offset, so the batch at ``position`` holds that offset and every batch before it
holds smaller ones.

``.timeindex`` (time index): 12-byte entries ``timestamp int64, relative offset int32``: the largest
timestamp seen so far and the last offset of the batch that carried it; both only grow.

``.txnindex`` (transaction index): 34-byte entries ``version int16 (0), producer id int64, first
offset int64, last offset int64, last stable offset int64``, one per transaction aborted in the
segment: the first offset of the transaction and the offset of its abort marker, both absolute. A
segment with no aborted transaction has no transaction index at all.

Offsets are relative to the segment's base offset (its file name). A file copied from a live broker
may still be preallocated: its unused tail is zeros, and reading stops at the first all-zero entry
after the first one.
"""

from __future__ import annotations

import bisect
import struct
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import CorruptRecordError

OFFSET_INDEX_ENTRY = struct.Struct(">ii")
TIME_INDEX_ENTRY = struct.Struct(">qi")
TXN_INDEX_ENTRY = struct.Struct(">hqqqq")
TXN_INDEX_VERSION = 0


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """One aborted transaction of a partition: its producer and its offsets, marker included."""

    producer_id: int
    first_offset: int
    last_offset: int  # the abort marker's offset
    last_stable_offset: int = -1


def parse_offset_index(
    data: bytes | bytearray | memoryview, base_offset: int, *, object_name: str = ""
) -> list[tuple[int, int]]:
    """(absolute offset, position) entries of an offset index; offsets and positions strictly grow."""
    view = _whole_entries(data, OFFSET_INDEX_ENTRY.size, object_name)
    entries: list[tuple[int, int]] = []
    last_relative = last_position = -1
    for number, (relative, position) in enumerate(OFFSET_INDEX_ENTRY.iter_unpack(view)):
        if number and relative == 0 and position == 0:
            break  # preallocated, never written
        if relative <= last_relative or position <= last_position:
            raise CorruptRecordError(
                object_name,
                number * OFFSET_INDEX_ENTRY.size,
                f"entry ({relative}, {position}) does not follow ({last_relative}, {last_position})",
            )
        entries.append((base_offset + relative, position))
        last_relative, last_position = relative, position
    return entries


def parse_time_index(
    data: bytes | bytearray | memoryview, base_offset: int, *, object_name: str = ""
) -> list[tuple[int, int]]:
    """(timestamp, absolute offset) entries of a time index; neither ever goes down."""
    view = _whole_entries(data, TIME_INDEX_ENTRY.size, object_name)
    entries: list[tuple[int, int]] = []
    last_timestamp = last_relative = -(1 << 63)
    for number, (timestamp, relative) in enumerate(TIME_INDEX_ENTRY.iter_unpack(view)):
        if number and timestamp == 0 and relative == 0:
            break
        if relative < 0 or timestamp < last_timestamp or relative < last_relative:
            raise CorruptRecordError(
                object_name,
                number * TIME_INDEX_ENTRY.size,
                f"entry ({timestamp}, {relative}) does not follow ({last_timestamp}, {last_relative})",
            )
        entries.append((timestamp, base_offset + relative))
        last_timestamp, last_relative = timestamp, relative
    return entries


def parse_txn_index(data: bytes | bytearray | memoryview, *, object_name: str = "") -> list[AbortedTxn]:
    """The aborted transactions a transaction index lists, in the order their markers were written."""
    view = _whole_entries(data, TXN_INDEX_ENTRY.size, object_name)
    entries: list[AbortedTxn] = []
    for number, (version, producer_id, first, last, stable) in enumerate(TXN_INDEX_ENTRY.iter_unpack(view)):
        where = number * TXN_INDEX_ENTRY.size
        if version != TXN_INDEX_VERSION:
            raise CorruptRecordError(
                object_name, where, f"transaction index entry version {version}, expected 0"
            )
        if not 0 <= first <= last:
            raise CorruptRecordError(
                object_name, where, f"aborted transaction of producer {producer_id} spans {first}..{last}"
            )
        entries.append(AbortedTxn(producer_id, first, last, stable))
    return entries


class AbortedRanges:
    """The aborted transactions of a partition, asked per batch: is this transactional batch aborted?

    A producer has at most one transaction open at a time, so its aborted transactions never overlap:
    a transactional batch of producer P at offset o is aborted exactly when one of P's aborted
    transactions spans o. That is how a read_committed consumer filters, given the same list.
    """

    def __init__(self, txns: Iterable[AbortedTxn | tuple[int, int, int]]) -> None:
        spans: defaultdict[int, set[tuple[int, int]]] = defaultdict(set)
        for txn in txns:
            producer, first, last = (
                (txn.producer_id, txn.first_offset, txn.last_offset) if isinstance(txn, AbortedTxn) else txn
            )
            spans[producer].add((first, last))
        self._spans = {p: sorted(s) for p, s in spans.items()}

    def __bool__(self) -> bool:
        return bool(self._spans)

    def covers(self, producer_id: int, offset: int) -> bool:
        """Whether ``offset`` of ``producer_id`` lies in one of its aborted transactions."""
        spans = self._spans.get(producer_id)
        if not spans:
            return False
        found = bisect.bisect_right(spans, offset, key=_first) - 1
        return found >= 0 and spans[found][1] >= offset


def aborted_overlapping(
    txns: Iterable[AbortedTxn], first_offset: int, last_offset: int | None
) -> tuple[tuple[int, int, int], ...]:
    """(producer, first, last) of the transactions that touch offsets first_offset..last_offset."""
    return tuple(
        sorted(
            {
                (t.producer_id, t.first_offset, t.last_offset)
                for t in txns
                if t.last_offset >= first_offset and (last_offset is None or t.first_offset <= last_offset)
            }
        )
    )


def lookup_position(entries: Sequence[tuple[int, int]], target_offset: int) -> int:
    """Where to start reading for ``target_offset``: the position of the last entry at or below it.

    0 (the segment start) when every entry is above the target. No record before the returned
    position has an offset at or above the target.
    """
    found = bisect.bisect_right(entries, target_offset, key=_first)
    return entries[found - 1][1] if found else 0


def lookup_timestamp(entries: Sequence[tuple[int, int]], target_timestamp: int) -> int | None:
    """An offset to start from to find the first record at or after ``target_timestamp``.

    Kafka's rule: the offset of the last entry whose timestamp is at or below the target (every batch
    before the one holding that offset is older than the target), or None when the search must start
    at the segment's beginning. Give the offset to :func:`lookup_position` and read forward.
    """
    found = bisect.bisect_right(entries, target_timestamp, key=_first)
    return entries[found - 1][1] if found else None


def split_points(
    offset_entries: Sequence[tuple[int, int]], segment_size: int, target_bytes: int
) -> list[tuple[int, int]]:
    """Cut a segment into pieces of about ``target_bytes`` at batch boundaries the offset index knows.

    Returns the (position, offset) index entries where cuts go, in order; the pieces are
    ``[0, p1), [p1, p2), ..., [pn, segment_size)`` and each is decodable on its own. The piece that
    starts at ``(p, o)`` begins with the batch whose last offset is ``o``. A piece is at least
    ``target_bytes`` long, except that a short remainder is left on the last piece rather than cut off.
    """
    if target_bytes <= 0:
        raise ValueError("target_bytes must be positive")
    cuts: list[tuple[int, int]] = []
    piece_start = 0
    for offset, position in offset_entries:
        if position >= segment_size or segment_size - position < target_bytes // 2:
            break
        if position - piece_start >= target_bytes:
            cuts.append((position, offset))
            piece_start = position
    return cuts


def split_ranges(
    offset_entries: Sequence[tuple[int, int]], segment_size: int, target_bytes: int
) -> list[tuple[int, int]]:
    """The pieces of :func:`split_points` as (start, end) byte ranges covering the whole segment."""
    starts = [0] + [position for position, _ in split_points(offset_entries, segment_size, target_bytes)]
    return list(zip(starts, [*starts[1:], segment_size], strict=True))


def _first(entry: tuple[int, int]) -> int:
    return entry[0]


def _whole_entries(data: bytes | bytearray | memoryview, entry_size: int, object_name: str) -> memoryview:
    view = memoryview(data).cast("B")
    if len(view) % entry_size:
        whole = len(view) - len(view) % entry_size
        raise CorruptRecordError(
            object_name,
            whole,
            f"index of {len(view)} bytes is not a whole number of {entry_size}-byte entries",
        )
    return view
