"""Offset and time indexes: round trips through the builder, seeking, and splitting a segment."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka_helpers import T0

from tsproxy.kafka.builder import SegmentBuilder, encode_offset_index, encode_time_index, encode_txn_index
from tsproxy.kafka.codecs import CODEC_LZ4, CODEC_NONE
from tsproxy.kafka.errors import CorruptRecordError
from tsproxy.kafka.indexes import (
    AbortedRanges,
    AbortedTxn,
    aborted_overlapping,
    lookup_position,
    lookup_timestamp,
    parse_offset_index,
    parse_time_index,
    parse_txn_index,
    split_points,
    split_ranges,
)
from tsproxy.kafka.records import Record, decode_batch, iter_batches, iter_records

BASE = 1_000_000


@pytest.fixture(scope="module")
def segment() -> SegmentBuilder:
    """About 200 KiB in 300 batches of 1-20 records, timestamps mostly rising, some offset gaps."""
    rng = random.Random(7)
    builder = SegmentBuilder(BASE, index_interval_bytes=4096)
    offset, clock = BASE, T0
    for n in range(300):
        records = []
        for _ in range(rng.randint(1, 20)):
            clock += rng.randint(-50, 200)
            records.append(Record(offset, clock, 0, b"k%d" % offset, rng.randbytes(rng.randint(0, 80)), ()))
            offset += rng.choice((1, 1, 1, 3))
        builder.add(records, codec=CODEC_LZ4 if n % 4 == 0 else CODEC_NONE)
    builder.close()
    return builder


def test_indexes_round_trip(segment: SegmentBuilder) -> None:
    offsets = parse_offset_index(segment.offset_index, BASE)
    times = parse_time_index(segment.time_index, BASE)
    assert offsets == segment.offset_entries and times == segment.time_entries
    assert len(offsets) > 30 and len(times) > 30
    assert encode_offset_index(offsets, BASE) == segment.offset_index
    assert encode_time_index(times, BASE) == segment.time_index


def test_offset_index_entries_point_at_batches_by_their_last_offset(segment: SegmentBuilder) -> None:
    data = segment.segment
    for offset, position in parse_offset_index(segment.offset_index, BASE):
        header, _ = decode_batch(data, position)
        assert header.last_offset == offset
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(segment.offset_entries)]
    assert min(gaps) > 4096  # sparse, on the broker's rule


def test_time_index_is_the_running_maximum(segment: SegmentBuilder) -> None:
    headers = list(iter_batches(segment.segment))
    for timestamp, offset in parse_time_index(segment.time_index, BASE):
        upto = [h for h in headers if h.last_offset <= offset]
        assert max(h.max_timestamp for h in upto) == timestamp
    # A rolled segment's last entry carries its max timestamp.
    assert segment.time_entries[-1][0] == max(h.max_timestamp for h in headers)


def test_lookup_position_for_every_offset(segment: SegmentBuilder) -> None:
    data = segment.segment
    entries = parse_offset_index(segment.offset_index, BASE)
    records = list(iter_records(data))
    for record in records[::7]:
        position = lookup_position(entries, record.offset)
        found = [r.offset for r in iter_records(data, start_position=position, max_offset=record.offset)]
        assert found[-1] == record.offset  # reachable from the position ...
        before = list(iter_records(data[:position]))
        assert all(r.offset < record.offset for r in before)  # ... and nothing at or above it comes earlier
    assert lookup_position(entries, BASE - 5) == 0
    assert lookup_position([], 123) == 0


def test_lookup_timestamp_finds_the_first_record_at_or_after(segment: SegmentBuilder) -> None:
    data = segment.segment
    offsets = parse_offset_index(segment.offset_index, BASE)
    times = parse_time_index(segment.time_index, BASE)
    records = list(iter_records(data))
    for target in range(T0 - 100, records[-1].timestamp + 100, 997):
        expected = next((r.offset for r in records if r.timestamp >= target), None)
        start_offset = lookup_timestamp(times, target)
        position = 0 if start_offset is None else lookup_position(offsets, start_offset)
        found = next(
            (r.offset for r in iter_records(data, start_position=position) if r.timestamp >= target), None
        )
        assert found == expected, target


def test_split_points_cut_into_independent_pieces(segment: SegmentBuilder) -> None:
    data = segment.segment
    entries = parse_offset_index(segment.offset_index, BASE)
    whole = list(iter_records(data))
    for target in (1, 5000, 30_000, 64 * 1024, len(data), 10 * len(data)):
        cuts = split_points(entries, len(data), target)
        assert all(c in [(p, o) for o, p in entries] for c in cuts)
        ranges = split_ranges(entries, len(data), target)
        assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        assert all(end - start >= target for start, end in ranges[:-1])
        pieces = [list(iter_records(data[start:end], base_position=start)) for start, end in ranges]
        assert [r for piece in pieces for r in piece] == whole
        for (position, offset), piece in zip(cuts, pieces[1:], strict=True):
            first_batch = next(iter_batches(data, start_position=position))
            assert first_batch.last_offset == offset and piece[0].offset <= offset
    assert split_points([], 100, 10) == []
    with pytest.raises(ValueError):
        split_points(entries, len(data), 0)


def test_preallocated_zero_tails_are_ignored() -> None:
    offset_index = encode_offset_index([(BASE + 10, 4100), (BASE + 20, 8300)], BASE) + bytes(8 * 100)
    assert parse_offset_index(offset_index, BASE) == [(BASE + 10, 4100), (BASE + 20, 8300)]
    time_index = encode_time_index([(T0, BASE + 10)], BASE) + bytes(12 * 50)
    assert parse_time_index(time_index, BASE) == [(T0, BASE + 10)]
    assert parse_offset_index(bytes(80), BASE) == [(BASE, 0)]  # only the first entry may be zero
    assert parse_offset_index(b"", BASE) == [] and parse_time_index(b"", BASE) == []


@pytest.mark.parametrize(
    ("data", "offset", "reason"),
    [
        (bytes(12), 8, "not a whole number"),
        (encode_offset_index([(BASE + 10, 500), (BASE + 9, 600)], BASE), 8, "does not follow"),
        (encode_offset_index([(BASE + 10, 500), (BASE + 11, 400)], BASE), 8, "does not follow"),
        (encode_offset_index([(BASE + 10, 500), (BASE + 11, 500)], BASE), 8, "does not follow"),
        (encode_offset_index([(BASE - 1, 500)], BASE), 0, "does not follow"),
    ],
)
def test_corrupt_offset_indexes(data: bytes, offset: int, reason: str) -> None:
    with pytest.raises(CorruptRecordError) as caught:
        parse_offset_index(data, BASE, object_name="t-0/00000000000001000000.index")
    assert (caught.value.offset, caught.value.object_name) == (offset, "t-0/00000000000001000000.index")
    assert reason in caught.value.reason


@pytest.mark.parametrize(
    ("data", "offset"),
    [
        (bytes(20), 12),
        (encode_time_index([(T0, BASE + 10), (T0 - 1, BASE + 11)], BASE), 12),
        (encode_time_index([(T0, BASE + 10), (T0 + 1, BASE + 9)], BASE), 12),
        (encode_time_index([(T0, BASE - 3)], BASE), 0),
    ],
)
def test_corrupt_time_indexes(data: bytes, offset: int) -> None:
    with pytest.raises(CorruptRecordError) as caught:
        parse_time_index(data, BASE, object_name="x.timeindex")
    assert caught.value.offset == offset


@settings(max_examples=200, deadline=None)
@given(
    positions=st.lists(st.integers(1, 10_000_000), unique=True, max_size=40).map(sorted),
    target=st.integers(-5, 10_000_100),
)
def test_lookup_position_matches_a_linear_scan(positions: list[int], target: int) -> None:
    entries = [(BASE + 3 * n, position) for n, position in enumerate(positions)]
    expected = max((p for o, p in entries if o <= BASE + target), default=0)
    assert lookup_position(entries, BASE + target) == expected


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.integers(1, 50_000), max_size=60),
    size_extra=st.integers(0, 50_000),
    target=st.integers(1, 200_000),
)
def test_split_ranges_always_tile_the_segment(gaps: list[int], size_extra: int, target: int) -> None:
    positions = [sum(gaps[: n + 1]) for n in range(len(gaps))]
    size = (positions[-1] if positions else 0) + size_extra + 1
    entries = [(n, position) for n, position in enumerate(positions)]
    ranges = split_ranges(entries, size, target)
    assert ranges[0][0] == 0 and ranges[-1][1] == size
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(ranges))
    assert all(end - start >= target for start, end in ranges[:-1])


def test_transaction_index_round_trips_and_rejects_damage() -> None:
    entries = [(7, 100, 140), (9, 90, 141), (7, 150, 150)]
    data = encode_txn_index(entries)
    assert len(data) == 3 * 34
    parsed = parse_txn_index(data, object_name="s3://b/x.txnindex")
    assert [(t.producer_id, t.first_offset, t.last_offset) for t in parsed] == entries
    assert parsed[0].last_stable_offset == 141
    assert parse_txn_index(b"") == []
    with pytest.raises(CorruptRecordError, match="whole number of 34-byte entries") as cut:
        parse_txn_index(data[:-1], object_name="s3://b/x.txnindex")
    assert cut.value.object_name == "s3://b/x.txnindex" and cut.value.offset == 68
    bad_version = b"\x00\x01" + data[2:34]
    with pytest.raises(CorruptRecordError, match="version 1"):
        parse_txn_index(bad_version)
    backwards = encode_txn_index([(7, 150, 140)])
    with pytest.raises(CorruptRecordError, match=r"spans 150\.\.140"):
        parse_txn_index(backwards)


def test_aborted_ranges_answer_per_producer_and_offset() -> None:
    ranges = AbortedRanges([AbortedTxn(7, 100, 140), AbortedTxn(7, 200, 210), (9, 120, 125)])
    assert ranges and not AbortedRanges([])
    for producer, offset, expected in [
        (7, 99, False), (7, 100, True), (7, 140, True), (7, 141, False), (7, 205, True), (7, 211, False),
        (9, 119, False), (9, 120, True), (8, 120, False),
    ]:  # fmt: skip
        assert ranges.covers(producer, offset) is expected, (producer, offset)
    txns = [AbortedTxn(7, 100, 140), AbortedTxn(9, 120, 125), AbortedTxn(7, 200, 210)]
    assert aborted_overlapping(txns, 126, 199) == ((7, 100, 140),)
    assert aborted_overlapping(txns, 141, None) == ((7, 200, 210),)
    assert aborted_overlapping(txns, 0, 99) == ()
