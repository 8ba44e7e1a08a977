"""Decoding pieces: batch framing across regions, corruption reported with object and byte, Arrow columns."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import pyarrow as pa
import pytest

from tests.spark.kafkadata import PartitionWriter
from tests.spark.memory import MemoryBucket
from tsproxy.errors import NoSuchKey
from tsproxy.kafka.errors import CorruptRecordError
from tsproxy.kafka.records import DecodeStats
from tsproxy.spark import reading
from tsproxy.spark.arrow import arrow_schema, rows_to_batch
from tsproxy.spark.planning import Piece
from tsproxy.spark.reading import piece_rows, read_piece, whole_batches

KEY = "t-0/00000000000000000000.log"


def segment(batches: int = 20) -> tuple[bytes, list[int], list[tuple]]:
    writer = PartitionWriter("t", 0)
    for i in range(batches):
        writer.batch([(1000 + i, b"k%d" % i, b"v" * 64, (("h", b"x"),)), (1001 + i, None, None, ())])
    seg = writer.roll()
    return seg.data, [pos for pos in _positions(seg.data)], seg.rows


def _positions(data: bytes) -> list[int]:
    out, pos = [], 0
    while pos < len(data):
        out.append(pos)
        pos += 12 + int.from_bytes(data[pos + 8 : pos + 12], "big")
    return out


def piece(**kw: object) -> Piece:
    return Piece(KEY, "t", 0, 0, 0, **kw)  # type: ignore[arg-type]


def test_whole_batches_stops_before_a_cut_off_batch() -> None:
    data, positions, _ = segment(3)
    assert whole_batches(data) == (len(data), None)
    assert whole_batches(data[: positions[2] + 20]) == (positions[2], None)
    assert whole_batches(data[:5]) == (0, None)
    bad = bytearray(data)
    bad[positions[1] + 8 : positions[1] + 12] = (7).to_bytes(4, "big")
    assert whole_batches(bad) == (positions[1], "batch length 7 is impossible")


@pytest.mark.parametrize("region", [64, 500, 1 << 20])
def test_regions_of_any_size_give_every_record_once(region: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reading, "REGION_BYTES", region)
    data, _, rows = segment()
    got = [r for rs in piece_rows(MemoryBucket({KEY: data}, piece=37), piece()) for r in rs]
    assert got == rows


def test_a_flipped_bit_names_the_object_and_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reading, "REGION_BYTES", 300)
    data, positions, rows = segment()
    bad = bytearray(data)
    bad[positions[7] + 70] ^= 0x10
    bucket = MemoryBucket({KEY: bytes(bad)})
    with pytest.raises(CorruptRecordError) as info:
        list(piece_rows(bucket, piece()))
    assert info.value.offset == positions[7] and "s3://memory/" + KEY in str(info.value)
    stats = DecodeStats()
    got = [r for rs in piece_rows(bucket, piece(), skip_corrupt=True, stats=stats) for r in rs]
    assert stats.corrupt_batches == 1
    assert got == [r for r in rows if r[0] not in (14, 15)]  # batch 7 held offsets 14 and 15


def test_an_impossible_length_fails_or_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reading, "REGION_BYTES", 200)
    data, positions, rows = segment()
    bad = bytearray(data)
    bad[positions[5] + 8 : positions[5] + 12] = (0x7FFFFFFF).to_bytes(4, "big")
    bucket = MemoryBucket({KEY: bytes(bad)})
    with pytest.raises(CorruptRecordError, match=r"impossible|length"):
        list(piece_rows(bucket, piece()))
    stats = DecodeStats()
    got = [r for rs in piece_rows(bucket, piece(), skip_corrupt=True, stats=stats) for r in rs]
    assert stats.corrupt_batches >= 1 and got[:10] == rows[:10] and got[-1] == rows[-1]


def test_a_truncated_segment_is_an_error() -> None:
    data, positions, _ = segment()
    with pytest.raises(CorruptRecordError) as info:
        list(piece_rows(MemoryBucket({KEY: data[:-9]}), piece()))
    assert info.value.offset == positions[-1]


def test_a_missing_object_says_which() -> None:
    with pytest.raises(NoSuchKey, match=KEY):
        list(piece_rows(MemoryBucket({}), piece()))


def test_reading_stops_once_past_max_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reading, "REGION_BYTES", 300)
    data, _, rows = segment(200)
    bucket = MemoryBucket({KEY: data}, piece=100)
    fetched = 0

    def counting(*args: Any, **kw: Any) -> Iterator[bytes]:
        nonlocal fetched
        for part in MemoryBucket.stream(bucket, *args, **kw):
            fetched += len(part)
            yield part

    monkeypatch.setattr(bucket, "stream", counting)
    got = [r for rs in piece_rows(bucket, piece(max_offset=9)) for r in rs]
    assert got == rows[:10] and fetched < len(data) // 10


def test_arrow_batches_have_spark_kafka_columns() -> None:
    rows = [(5, 1_700_000_000_123, 0, b"k", b"v", (("a", b"1"), ("b", None))), (6, 7, 1, None, None, ())]
    batch = rows_to_batch(rows, "orders", 3, include_headers=True)
    assert batch.schema == arrow_schema(True)
    assert batch.column("timestamp").type == pa.timestamp("us", tz="UTC")
    assert batch.to_pylist()[0]["headers"] == [{"key": "a", "value": b"1"}, {"key": "b", "value": None}]
    assert batch.to_pylist()[1]["headers"] is None  # no headers: null, as Spark's Kafka source has it
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_123_000, 7000]
    assert batch.to_pydict()["key"] == [b"k", None] and batch.to_pydict()["partition"] == [3, 3]
    assert rows_to_batch([], "orders", 3, include_headers=False).num_rows == 0
    ms = rows_to_batch(rows, "orders", 3, include_headers=False, timestamp_unit="ms")
    assert ms.column("timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_123, 7]


def test_records_without_headers_have_null_headers() -> None:
    with_h = (("h", b"x"),)
    rows = [(i, 1, 0, b"k", b"v", with_h if i in (1, 2, 5) else ()) for i in range(7)]
    got = rows_to_batch(rows, "t", 0, include_headers=True).column("headers").to_pylist()
    assert got == [None, [{"key": "h", "value": b"x"}], [{"key": "h", "value": b"x"}], None, None,
                   [{"key": "h", "value": b"x"}], None]  # fmt: skip
    none = rows_to_batch([(*r[:5], ()) for r in rows], "t", 0, include_headers=True).column("headers")
    assert none.null_count == 7
    assert rows_to_batch(rows[1:3], "t", 0, include_headers=True).column("headers").null_count == 0


def test_read_piece_cuts_arrow_batches_at_the_row_limit() -> None:
    data, _, rows = segment(50)
    batches = list(read_piece(MemoryBucket({KEY: data}), piece(), include_headers=True, rows_per_batch=30))
    assert [b.num_rows for b in batches] == [30, 30, 30, 10]
    assert [r["offset"] for b in batches for r in b.to_pylist()] == [r[0] for r in rows]


def test_read_ahead_keeps_order_passes_errors_and_stops_early() -> None:
    from tsproxy.spark.prefetch import ReadAhead

    closed = []

    def source(n: int, fail_at: int | None = None) -> Generator[bytes, None, None]:
        try:
            for i in range(n):
                if i == fail_at:
                    raise NoSuchKey("gone")
                yield bytes([i])
        finally:
            closed.append(n)

    assert b"".join(ReadAhead(source(50), depth=3)) == bytes(range(50))
    with pytest.raises(NoSuchKey, match="gone"):
        list(ReadAhead(source(10, fail_at=4)))
    early = ReadAhead(source(10_000), depth=2)
    assert next(iter(early)) == b"\x00"
    early.close()
    assert not early._thread.is_alive() and closed == [50, 10, 10_000]


def test_garbage_from_the_first_byte_hints_at_a_transformed_segment() -> None:
    data, _, _ = segment(3)
    scrambled = bytes(b ^ 0x5A for b in data)
    with pytest.raises(CorruptRecordError, match="not a plain Kafka segment") as info:
        list(piece_rows(MemoryBucket({KEY: scrambled}), piece()))
    assert info.value.offset == 0


def test_batches_are_bounded_in_bytes_and_cut_the_same_whatever_the_regions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer = PartitionWriter("t", 0)
    sizes = [10, 300_000, 5, 700_000, 1_500_000, 20, 20, 400_000] * 3
    for i, size in enumerate(sizes):
        writer.batch([(1000 + i, b"k", b"x" * size, ())])
    data, rows = writer.roll().data, writer.segments[0].rows
    layouts = []
    for region in (64, 100_000, 1 << 24):
        monkeypatch.setattr(reading, "REGION_BYTES", region)
        batches = list(read_piece(MemoryBucket({KEY: data}, piece=50_000), piece(), include_headers=False,
                                  max_batch_bytes=1_000_000))  # fmt: skip
        assert [r["offset"] for b in batches for r in b.to_pylist()] == [r[0] for r in rows]
        for b in batches:
            keys, values = b.column("key").to_pylist(), b.column("value").to_pylist()
            payload = sum(len(k or b"") + len(v or b"") for k, v in zip(keys, values, strict=True))
            assert b.num_rows == 1 or payload <= 1_000_000
        layouts.append([b.num_rows for b in batches])
    assert layouts[0] == layouts[1] == layouts[2] and max(layouts[0]) < len(rows)
