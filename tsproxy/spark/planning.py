"""Planning a read on the driver: which segments, which byte ranges, cut where. Pure: no I/O.

Inputs are the listed segment objects of one topic-partition and, for the segments that need them, their
offset and time indexes (small objects, loaded by the caller). The output is a list of `Piece`s, each one
Spark input partition: a byte range of one segment object plus the per-record filters that make the
result exact. A segment outside the requested offsets or timestamps yields no piece, so it is never read.

Index semantics that the cuts rely on (true whether an offset index entry names the first or the last
offset of the batch at its position, as different Kafka versions wrote them):

* reading from `lookup(offsets, x)` misses no record with offset >= x;
* every batch at or after the position of entry k has offsets > the offset of entry k-1.

Timestamps are resolved like Kafka's offsetsForTimes (and so Spark's `startingTimestamp`): the start is
the first record, in offset order, whose timestamp is >= T, and everything after it is read even where a
later record has a smaller timestamp. Time index entries bound where that record can be: after the
position of the last entry with timestamp <= T and no later than the batch of the first entry with
timestamp >= T. That window is kept inside one piece, which finds the exact record while reading.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tsproxy.errors import FormatError
from tsproxy.kafka.indexes import AbortedTxn, aborted_overlapping

from .options import Bound

NEEDS_NONE = 0
NEEDS_OFFSETS = 1
NEEDS_ALL = 2  # offset and time index


class PlanError(FormatError):
    """The objects do not allow the requested read (e.g. a timestamp bound but no time index)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One listed segment object (its key, where it belongs, its listed size)."""

    key: str
    topic: str
    partition: int
    base_offset: int
    size: int


@dataclass(frozen=True, slots=True)
class Indexes:
    """A segment's indexes as absolute values: offsets (offset, position), times (timestamp, offset).

    None means the index object is missing; an empty list means it exists but holds no entry.
    """

    offsets: Sequence[tuple[int, int]] | None = None
    times: Sequence[tuple[int, int]] | None = None

    @property
    def max_timestamp(self) -> int | None:
        """The segment's largest timestamp: Kafka appends it to the time index when it rolls a segment."""
        return self.times[-1][0] if self.times else None


@dataclass(frozen=True, slots=True)
class Piece:
    """A byte range of one segment object to decode, with the filters that make its records exact.

    first/end are original byte positions (end exclusive, None = to the object's end). Records are kept
    when min_offset <= offset <= max_offset (None: no bound). With skip_until_ts, records are dropped
    until the first whose timestamp is >= it; with stop_at_ts, reading stops at the first record whose
    timestamp is >= it (that record excluded).
    """

    key: str
    topic: str
    partition: int
    base_offset: int
    size: int
    first: int = 0
    end: int | None = None
    min_offset: int | None = None
    max_offset: int | None = None
    skip_until_ts: int | None = None
    stop_at_ts: int | None = None
    # (producer id, first offset, marker offset) of the aborted transactions touching this piece's
    # offsets, when the read is read_committed: their records are left out.
    aborted: tuple[tuple[int, int, int], ...] = ()

    @property
    def length_hint(self) -> int:
        """About how many bytes the piece reads (the listed size stands in for an open end)."""
        return max((self.end if self.end is not None else self.size) - self.first, 0)


def order_segments(segments: Sequence[Segment]) -> list[tuple[Segment, int | None]]:
    """Segments of one partition in offset order, each with the last offset it is read up to.

    Tiered storage can hold overlapping copies (a retried upload, a new leader re-uploading): each offset
    is read from exactly one object, the one with the highest base offset not above it; of copies with
    the same base offset the largest (then the last key) wins. The last segment's range is open (None).
    """
    best: dict[int, Segment] = {}
    for seg in segments:
        old = best.get(seg.base_offset)
        if old is None or (seg.size, seg.key) > (old.size, old.key):
            best[seg.base_offset] = seg
    ordered = [best[b] for b in sorted(best)]
    uppers: list[int | None] = [seg.base_offset - 1 for seg in ordered[1:]]
    return list(zip(ordered, [*uppers, None], strict=True))


def index_needs(seg: Segment, upper: int | None, start: Bound, end: Bound, target_bytes: int) -> int:
    """Which indexes planning needs for a segment: NEEDS_NONE, NEEDS_OFFSETS or NEEDS_ALL."""
    if start.is_timestamp or end.is_timestamp:
        return NEEDS_ALL
    if not _offsets_overlap(seg, upper, start, end):
        return NEEDS_NONE
    cut_start = start.is_offset and start.value > seg.base_offset
    cut_end = end.is_offset and (upper is None or end.value <= upper)
    return NEEDS_OFFSETS if cut_start or cut_end or seg.size > target_bytes else NEEDS_NONE


def _offsets_overlap(seg: Segment, upper: int | None, start: Bound, end: Bound) -> bool:
    if start.is_offset and upper is not None and upper < start.value:
        return False
    return not (end.is_offset and seg.base_offset >= end.value)


def lookup(offsets: Sequence[tuple[int, int]], target: int) -> int:
    """Position of the last entry whose offset is <= target (0 if none): reading there misses nothing."""
    i = bisect.bisect_right(offsets, target, key=lambda e: e[0])
    return offsets[i - 1][1] if i else 0


def end_position(offsets: Sequence[tuple[int, int]], last: int) -> int | None:
    """A position from which every batch has offsets > last (None: only the object's end is sure)."""
    i = bisect.bisect_left(offsets, last, key=lambda e: e[0])
    return offsets[i + 1][1] if i + 1 < len(offsets) else None


@dataclass(frozen=True, slots=True)
class _Window:
    """Where the first record with timestamp >= T must be: from `start`, at the latest before `stop`."""

    start: int
    stop: int | None


def _time_window(ix: Indexes, timestamp: int) -> _Window:
    times, offsets = ix.times or (), ix.offsets or ()
    stamps = [t for t, _ in times]
    below = bisect.bisect_right(stamps, timestamp)  # entries with ts <= T
    start = lookup(offsets, times[below - 1][1]) if below else 0
    above = bisect.bisect_left(stamps, timestamp)  # first entry with ts >= T
    stop = end_position(offsets, times[above][1]) if above < len(times) else None
    return _Window(start, stop)


def plan_partition(
    segments: Sequence[Segment],
    start: Bound,
    end: Bound,
    indexes: Mapping[str, Indexes],
    target_bytes: int,
    aborted: Sequence[AbortedTxn] | None = None,
) -> list[Piece]:
    """Pieces for one topic-partition, in offset order.

    `indexes` holds, by segment key, what `index_needs` asked for (a missing entry counts as no index:
    the segment is then read whole and filtered record by record). PlanError when a timestamp bound
    meets a segment without a time index. `aborted` (read_committed) is the partition's aborted
    transactions; each piece gets those that touch its segment's offsets.
    """
    ordered = order_segments(segments)
    if start.is_timestamp and end.is_timestamp and end.value <= start.value:
        return []
    first, last = 0, len(ordered) - 1
    start_cross = end_cross = None
    if start.is_timestamp:
        found = _first_reaching(ordered, indexes, start.value)
        if found is None:
            return []
        first = start_cross = found
    if end.is_timestamp:
        found = _first_reaching(ordered, indexes, end.value)
        if found is not None:
            last = end_cross = found
    pieces: list[Piece] = []
    for i in range(first, last + 1):
        seg, upper = ordered[i]
        if not _offsets_overlap(seg, upper, start, end):
            continue
        ix = indexes.get(seg.key, Indexes())
        planned = _plan_segment(
            seg,
            upper,
            ix,
            start,
            end,
            target_bytes,
            start_ts=start.value if i == start_cross else None,
            end_ts=end.value if i == end_cross else None,
        )
        if aborted:
            touching = aborted_overlapping(aborted, seg.base_offset, upper)
            planned = [replace(p, aborted=touching) for p in planned]
        pieces += planned
    return pieces


def _first_reaching(
    ordered: Sequence[tuple[Segment, int | None]], indexes: Mapping[str, Indexes], timestamp: int
) -> int | None:
    for i, (seg, _) in enumerate(ordered):
        ix = indexes.get(seg.key)
        if ix is None or ix.times is None:
            raise PlanError(f"a timestamp bound needs the time index of segment {seg.key}, which is missing")
        top = ix.max_timestamp
        if top is not None and top >= timestamp:
            return i
    return None


def _plan_segment(
    seg: Segment,
    upper: int | None,
    ix: Indexes,
    start: Bound,
    end: Bound,
    target_bytes: int,
    *,
    start_ts: int | None,
    end_ts: int | None,
) -> list[Piece]:
    offsets = ix.offsets or ()
    min_offset = start.value if start.is_offset and start.value > seg.base_offset else None
    max_offset = upper
    if end.is_offset and (max_offset is None or end.value - 1 < max_offset):
        max_offset = end.value - 1
    lo = lookup(offsets, min_offset) if min_offset is not None else 0
    hi = end_position(offsets, max_offset) if max_offset is not None else None
    no_split: list[tuple[int, int | None]] = []  # (after, before): no cut strictly inside
    if end_ts is not None:
        window = _time_window(ix, end_ts)
        if start_ts is None:
            # The end record may come before an offset start: read from its window to see it.
            lo = min(lo, window.start)
        if window.stop is not None and (hi is None or window.stop < hi):
            hi = window.stop
        no_split.append((window.start, window.stop))
    if start_ts is not None:
        # With both bounds in one segment the end record comes after the start one (end > start).
        window = _time_window(ix, start_ts)
        lo = window.start
        no_split.append((lo, window.stop))  # the first piece holds the whole window
    if hi is not None and hi <= lo:
        return []
    cuts = _cuts(offsets, lo, hi if hi is not None else seg.size, target_bytes, no_split)
    starts: list[int] = [lo, *cuts]
    ends: list[int | None] = [*cuts, hi]
    return [
        Piece(
            key=seg.key,
            topic=seg.topic,
            partition=seg.partition,
            base_offset=seg.base_offset,
            size=seg.size,
            first=first,
            end=stop,
            min_offset=min_offset,
            max_offset=max_offset,
            skip_until_ts=start_ts if n == 0 else None,
            stop_at_ts=end_ts if n == len(starts) - 1 else None,
        )
        for n, (first, stop) in enumerate(zip(starts, ends, strict=True))
    ]


def _cuts(
    offsets: Sequence[tuple[int, int]],
    lo: int,
    hi: int,
    target_bytes: int,
    no_split: Sequence[tuple[int, int | None]],
) -> list[int]:
    """Positions strictly between lo and hi, at index entries about target_bytes apart."""
    if hi - lo <= target_bytes:
        return []
    cuts: list[int] = []
    begin = lo
    for _, pos in offsets:
        if pos <= begin or pos >= hi:
            continue
        if pos - begin < target_bytes or hi - pos < target_bytes // 4:
            continue  # too close to the last cut, or would leave a sliver at the end
        if any(after < pos and (before is None or pos < before) for after, before in no_split):
            continue
        cuts.append(pos)
        begin = pos
    return cuts
