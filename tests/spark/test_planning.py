"""Planning and reading pieces: exactly the records Kafka's offset and timestamp semantics select.

The property test builds partitions with kafka-python's record builder (random codecs, timestamps that
go back and forth, LogAppendTime batches, transaction markers, dense offset indexes), plans a read for
random bounds, decodes every planned piece from memory in small regions, and compares with a brute
force over all records: start at the first offset >= the start offset or the first record whose
timestamp >= the start timestamp, end before the first offset >= the end offset or the first record
whose timestamp >= the end timestamp.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.spark.kafkadata import BuiltSegment, PartitionWriter, Row
from tests.spark.memory import MemoryBucket
from tsproxy.kafka.indexes import parse_offset_index, parse_time_index
from tsproxy.spark import reading
from tsproxy.spark.options import EARLIEST, LATEST, Bound
from tsproxy.spark.planning import (
    NEEDS_ALL,
    NEEDS_NONE,
    Indexes,
    Piece,
    PlanError,
    Segment,
    index_needs,
    order_segments,
    plan_partition,
)
from tsproxy.spark.reading import piece_rows


def key_of(seg: BuiltSegment) -> str:
    return f"t-0/{seg.base_offset:020d}.log"


def as_segments(built: Sequence[BuiltSegment]) -> list[Segment]:
    return [Segment(key_of(s), s.topic, s.partition, s.base_offset, len(s.data)) for s in built]


def indexes_as_needed(
    built: Sequence[BuiltSegment], start: Bound, end: Bound, target: int
) -> dict[str, Indexes]:
    """Only the indexes index_needs asks for, as the driver would load them."""
    by_key = {key_of(s): s for s in built}
    out = {}
    for seg, upper in order_segments(as_segments(built)):
        need = index_needs(seg, upper, start, end, target)
        if need == NEEDS_NONE:
            continue
        b = by_key[seg.key]
        offsets = parse_offset_index(b.offset_index, b.base_offset)
        times = parse_time_index(b.time_index, b.base_offset) if need == NEEDS_ALL else None
        out[seg.key] = Indexes(offsets, times)
    return out


def read_all(built: Sequence[BuiltSegment], pieces: Sequence[Piece], piece_size: int = 97) -> list[Row]:
    bucket = MemoryBucket({key_of(s): s.data for s in built}, piece=piece_size)
    return [row for p in pieces for rows in piece_rows(bucket, p) for row in rows]


def brute_force(writer: PartitionWriter, start: Bound, end: Bound) -> list[Row]:
    timeline = writer.timeline
    visible = {r[0]: r for s in writer.segments for r in s.rows}

    def first(pred: object) -> int | None:
        return next((i for i, rec in enumerate(timeline) if pred(rec)), None)  # type: ignore[operator]

    lo, hi = 0, len(timeline)
    if start.is_offset:
        found = first(lambda r: r[0] >= start.value)
        lo = len(timeline) if found is None else found
    elif start.is_timestamp:
        found = first(lambda r: r[1] >= start.value)
        if found is None:
            return []
        lo = found
    if end.is_offset:
        found = first(lambda r: r[0] >= end.value)
        hi = len(timeline) if found is None else found
    elif end.is_timestamp:
        found = first(lambda r: r[1] >= end.value)
        hi = len(timeline) if found is None else found
    return [visible[off] for off, _, marker in timeline[lo:hi] if not marker]


@st.composite
def partitions(draw: st.DrawFn) -> PartitionWriter:
    writer = PartitionWriter("t", 0, start_offset=draw(st.integers(0, 500)),
                             index_interval=draw(st.sampled_from([0, 60, 400])))  # fmt: skip
    stamps = st.integers(0, 60)
    for _ in range(draw(st.integers(1, 4))):
        for _ in range(draw(st.integers(1, 5))):
            kind = draw(st.sampled_from(["create", "create", "create", "append", "marker"]))
            if kind == "marker":
                writer.marker(commit=draw(st.booleans()), producer_id=7, timestamp=draw(stamps))
                continue
            n = draw(st.integers(1, 4))
            rows = [
                (draw(stamps), draw(st.none() | st.binary(max_size=6)), draw(st.binary(max_size=40)), ())
                for _ in range(n)
            ]
            writer.batch(
                rows,
                codec=draw(st.sampled_from(["none", "none", "gzip", "zstd"])),
                log_append_time=draw(stamps) if kind == "append" else None,
            )
        writer.roll()
    return writer


def bounds(start: bool) -> st.SearchStrategy[Bound]:
    whole = EARLIEST if start else LATEST
    return st.one_of(
        st.just(whole),
        st.integers(0, 560).map(lambda v: Bound("offset", v)),
        st.integers(-1, 62).map(lambda v: Bound("timestamp", max(v, 0))),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(writer=partitions(), start=bounds(True), end=bounds(False), target=st.sampled_from([64, 300, 1 << 20]),
       region=st.sampled_from([64, 1000]))  # fmt: skip
def test_planned_pieces_read_exactly_what_kafka_would_return(
    writer: PartitionWriter, start: Bound, end: Bound, target: int, region: int
) -> None:
    pieces = plan_partition(
        as_segments(writer.segments),
        start,
        end,
        indexes_as_needed(writer.segments, start, end, target),
        target,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reading, "REGION_BYTES", region)
        got = read_all(writer.segments, pieces)
    assert got == brute_force(writer, start, end)


def _writer(segments: int, batches: int = 30, *, step: int = 10) -> PartitionWriter:
    """Monotonic timestamps: segment n covers [n * batches * step, (n + 1) * batches * step)."""
    writer = PartitionWriter("t", 0, index_interval=200)
    ts = 0
    for _ in range(segments):
        for _ in range(batches):
            writer.batch([(ts, b"k", b"v" * 50, ()), (ts + step // 2, None, b"w" * 50, ())])
            ts += step
        writer.roll()
    return writer


def test_segments_outside_the_offsets_get_no_piece() -> None:
    writer = _writer(5)
    seg = writer.segments[2]
    start, end = Bound("offset", seg.base_offset + 20), Bound("offset", seg.next_offset - 20)
    pieces = plan_partition(as_segments(writer.segments), start, end,
                            indexes_as_needed(writer.segments, start, end, 1 << 20), 1 << 20)  # fmt: skip
    assert {p.key for p in pieces} == {key_of(seg)}
    # The index narrows the byte range to about what the offsets need.
    assert pieces[0].first > 0 and pieces[0].end is not None and pieces[0].end < len(seg.data)
    assert read_all(writer.segments, pieces) == brute_force(writer, start, end)


def test_segments_outside_the_timestamps_get_no_piece() -> None:
    writer = _writer(5)  # each segment spans 300 ms of timestamps
    start, end = Bound("timestamp", 910), Bound("timestamp", 1150)
    pieces = plan_partition(as_segments(writer.segments), start, end,
                            indexes_as_needed(writer.segments, start, end, 1 << 20), 1 << 20)  # fmt: skip
    assert {p.key for p in pieces} == {key_of(writer.segments[3])}
    rows = read_all(writer.segments, pieces)
    assert rows == brute_force(writer, start, end)
    assert rows and min(r[1] for r in rows) >= 910 and max(r[1] for r in rows) < 1150


def test_big_segments_split_at_index_entries_and_pieces_decode_alone() -> None:
    writer = _writer(2, batches=200)
    target = 4000
    pieces = plan_partition(as_segments(writer.segments), EARLIEST, LATEST,
                            indexes_as_needed(writer.segments, EARLIEST, LATEST, target), target)  # fmt: skip
    assert len(pieces) > 4
    positions = {pos for s in writer.segments for _, pos in parse_offset_index(s.offset_index, s.base_offset)}
    for p in pieces:
        assert p.first == 0 or p.first in positions
        assert p.end is None or p.end in positions
        assert p.end is None or p.end - p.first >= target
    assert read_all(writer.segments, pieces) == [r for s in writer.segments for r in s.rows]


def test_min_size_split_respects_the_timestamp_window() -> None:
    # Timestamps jump back: the first record >= 500 is far from where the time index can place it, so
    # the window spans many index entries, and no cut may fall inside it.
    writer = PartitionWriter("t", 0, index_interval=0)
    for i in range(60):
        writer.batch([(400 + (i % 7), b"k", b"x" * 40, ())])
    writer.batch([(900, b"k", b"late", ())])
    for i in range(60):
        writer.batch([(450 + (i % 5), b"k", b"y" * 40, ())])
    writer.roll()
    start, end = Bound("timestamp", 500), LATEST
    pieces = plan_partition(as_segments(writer.segments), start, end,
                            indexes_as_needed(writer.segments, start, end, 200), 200)  # fmt: skip
    assert len(pieces) > 1
    rows = read_all(writer.segments, pieces)
    assert rows == brute_force(writer, start, end)
    assert rows[0][3:5] == (b"k", b"late") and len(rows) == 61  # later, smaller timestamps still come


def test_overlapping_copies_are_read_once() -> None:
    writer = _writer(3)
    a, b, c = writer.segments
    # A re-upload of b's second half as its own segment (as a new leader might), and a retried upload
    # of c under another key with the same base offset.
    cut = parse_offset_index(b.offset_index, b.base_offset)[3]
    tail = BuiltSegment(b.topic, b.partition, cut[0] + 1, b"", b"", b"", b.next_offset, [])
    segments = [
        *as_segments([a, b, c]),
        Segment("t-0/dup-of-c.log", "t", 0, c.base_offset, len(c.data) - 1),
        Segment(key_of(tail), "t", 0, tail.base_offset, 10),
    ]
    ordered = order_segments(segments)
    assert [s.key for s, _ in ordered] == [key_of(a), key_of(b), key_of(tail), key_of(c)]
    assert ordered[1][1] == tail.base_offset - 1 and ordered[-1][1] is None


def test_a_timestamp_bound_without_time_index_is_refused() -> None:
    writer = _writer(2)
    with pytest.raises(PlanError, match="time index"):
        plan_partition(as_segments(writer.segments), Bound("timestamp", 5), LATEST, {}, 1 << 20)


def test_start_after_end_reads_nothing() -> None:
    writer = _writer(2)
    segs = as_segments(writer.segments)
    assert plan_partition(segs, Bound("timestamp", 500), Bound("timestamp", 400), {}, 1 << 20) == []
    assert (
        read_all(writer.segments, plan_partition(segs, Bound("offset", 50), Bound("offset", 40), {}, 1 << 20))
        == []
    )


def test_an_end_timestamp_reached_before_the_start_offset_reads_nothing() -> None:
    # Kafka resolves endingTimestamp to the first offset whose record reaches it, here offset 1: before
    # the start offset 5, so the range is empty although later records have smaller timestamps. Sparse
    # indexes put that offset inside the time window but before the offset index's entry for offset 5.
    writer = PartitionWriter("t", 0, index_interval=250)
    for ts in (10, 100, 10, 10, 10, 10, 10, 10):
        writer.batch([(ts, b"k", b"v" * 30, ())])
    writer.roll()
    start, end = Bound("offset", 5), Bound("timestamp", 50)
    pieces = plan_partition(as_segments(writer.segments), start, end,
                            indexes_as_needed(writer.segments, start, end, 1 << 20), 1 << 20)  # fmt: skip
    assert brute_force(writer, start, end) == []
    assert read_all(writer.segments, pieces) == []


def test_overlapping_uploads_read_every_offset_once() -> None:
    # The same partition uploaded twice, cut into segments at different offsets (a new leader
    # re-uploading after a failover), plus a truncated retry of one object.
    first, second = PartitionWriter("t", 0, index_interval=100), PartitionWriter("t", 0, index_interval=100)
    for writer, cuts in ((first, {40, 90}), (second, {25, 70})):
        for i in range(120):
            writer.batch([(i, b"k%d" % i, b"v%d" % i, ())])
            if i + 1 in cuts:
                writer.roll()
        writer.roll()
    built = [*first.segments[:2], *second.segments[1:]]  # [0,40) [40,90) and [25,70) [70,120)
    segments = [Segment(f"t-0/{n}.log", "t", 0, s.base_offset, len(s.data)) for n, s in enumerate(built)]
    retry = second.segments[2]
    segments.append(Segment("t-0/retry.log", "t", 0, retry.base_offset, len(retry.data) - 7))
    objects = {f"t-0/{n}.log": s.data for n, s in enumerate(built)}
    objects["t-0/retry.log"] = retry.data[: len(retry.data) - 7]  # never chosen: the smaller copy
    bucket = MemoryBucket(objects)
    for start, end in ((EARLIEST, LATEST), (Bound("offset", 30), Bound("offset", 100))):
        pieces = plan_partition(segments, start, end, {}, 1 << 20)
        rows = [r for p in pieces for rs in piece_rows(bucket, p) for r in rs]
        lo = start.value if start.is_offset else 0
        hi = end.value if end.is_offset else 120
        assert [r[0] for r in rows] == list(range(lo, hi))
        assert all(r[4] == b"v%d" % r[0] for r in rows)
