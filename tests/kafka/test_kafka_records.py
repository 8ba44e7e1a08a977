"""Record batch v2 decoding: every codec, LogAppendTime, transactions, offsets, positions, partial tails."""

from __future__ import annotations

import gzip
import struct

import pytest
import zstandard
from kafka.record.memory_records import MemoryRecords
from kafka_helpers import T0, as_tuples, kafka_python_batch, kafka_python_read, sample_records

from tsproxy.kafka.builder import (
    SegmentBuilder,
    assemble_batch,
    build_batch,
    build_control_batch,
    encode_record,
    parse_control_record,
)
from tsproxy.kafka.codecs import CODEC_GZIP, CODEC_LZ4, CODEC_NONE, CODEC_SNAPPY, CODEC_ZSTD, XERIAL_MAGIC
from tsproxy.kafka.errors import CorruptRecordError
from tsproxy.kafka.indexes import AbortedRanges, AbortedTxn
from tsproxy.kafka.records import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    RECORDS_OFFSET,
    DecodeStats,
    Record,
    decode_batch,
    iter_batches,
    iter_records,
    iter_rows,
)

CODECS = [CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD]
CODEC_IDS = ["none", "gzip", "snappy", "lz4", "zstd"]


def segment_of(*batches: bytes) -> bytes:
    return b"".join(batches)


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_reads_what_kafka_python_writes(codec: int) -> None:
    first = sample_records(40, base_offset=1000)
    # A value well past 32 KiB makes xerial snappy write several blocks.
    second = [
        Record(1040, T0, 0, b"big", bytes(range(256)) * 300, (("k", b"v"),)),
        *sample_records(5, 1041, seed=3),
    ]
    segment = segment_of(kafka_python_batch(first, codec), kafka_python_batch(second, codec))

    headers = list(iter_batches(segment))
    assert [h.codec for h in headers] == [codec, codec]  # kafka-python really compressed them
    if codec == CODEC_SNAPPY:
        assert segment[headers[1].position + RECORDS_OFFSET :].startswith(XERIAL_MAGIC)
    ours = list(iter_records(segment))
    assert ours == first + second
    assert as_tuples(ours) == kafka_python_read(segment)


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_rows_equal_records(codec: int) -> None:
    records = sample_records(30, base_offset=7)
    segment = build_batch(records, codec=codec)
    assert list(iter_rows(segment)) == as_tuples(list(iter_records(segment)))


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_batch_header_fields(codec: int) -> None:
    records = sample_records(12, base_offset=500)
    batch = build_batch(
        records, codec=codec, transactional=True, producer_id=42, producer_epoch=3, base_sequence=77,
        partition_leader_epoch=9,
    )  # fmt: skip
    (header,) = iter_batches(batch)
    assert (header.base_offset, header.last_offset, header.records_count) == (500, 511, 12)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 77)
    assert header.partition_leader_epoch == 9 and header.magic == 2
    assert header.is_transactional and not header.is_control
    assert header.codec == codec and header.timestamp_type == CREATE_TIME
    assert header.base_timestamp == records[0].timestamp
    assert header.max_timestamp == max(r.timestamp for r in records)
    assert header.size == len(batch) == header.length + 12 and header.position == 0


def test_snappy_raw_blocks_are_read_too() -> None:
    records = sample_records(25)
    raw = build_batch(records, codec=CODEC_SNAPPY, snappy_xerial=False)
    framed = build_batch(records, codec=CODEC_SNAPPY)
    assert not raw[RECORDS_OFFSET:].startswith(XERIAL_MAGIC) and framed[RECORDS_OFFSET:].startswith(
        XERIAL_MAGIC
    )
    assert list(iter_records(raw)) == list(iter_records(framed)) == records


def test_zstd_without_content_size_and_in_several_frames() -> None:
    records = sample_records(25)
    batch = build_batch(records, codec=CODEC_ZSTD)
    params = zstandard.get_frame_parameters(batch[RECORDS_OFFSET:])
    assert params.content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert list(iter_records(batch)) == records

    # The same records body split across two frames is still one stream of records.
    body = bytearray()
    for record in records:
        encode_record(record.offset, record.timestamp - T0, record.key, record.value, record.headers, body)
    half = len(body) // 2
    frames = zstandard.ZstdCompressor().compress(bytes(body[:half])) + zstandard.ZstdCompressor().compress(
        bytes(body[half:])
    )
    batch = assemble_batch(
        frames, base_offset=0, records_count=len(records), last_offset_delta=len(records) - 1,
        base_timestamp=T0, max_timestamp=T0, attributes=CODEC_ZSTD,
    )  # fmt: skip
    assert [r.key for r in iter_records(batch)] == [r.key for r in records]


def test_gzip_of_several_members() -> None:
    records = sample_records(10)
    plain = build_batch(records)
    body = plain[RECORDS_OFFSET:]
    members = gzip.compress(body[:50]) + gzip.compress(body[50:])
    batch = assemble_batch(
        members, base_offset=0, records_count=10, last_offset_delta=9, base_timestamp=records[0].timestamp,
        max_timestamp=T0, attributes=CODEC_GZIP,
    )  # fmt: skip
    assert [r.value for r in iter_records(batch)] == [r.value for r in records]


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_log_append_time_stamps_every_record_with_the_batch_time(codec: int) -> None:
    records = sample_records(10, base_offset=20)
    batch = build_batch(records, codec=codec, log_append_time=T0 + 99_999)
    decoded = list(iter_records(batch))
    assert {(r.timestamp, r.timestamp_type) for r in decoded} == {(T0 + 99_999, LOG_APPEND_TIME)}
    assert [(r.key, r.value) for r in decoded] == [(r.key, r.value) for r in records]
    assert as_tuples(decoded) == kafka_python_read(batch)


def test_transactions_and_control_batches() -> None:
    pid, epoch = 4000, 2
    committed = sample_records(4, base_offset=0)
    aborted = sample_records(3, base_offset=5, seed=9)
    segment = segment_of(
        build_batch(committed, transactional=True, producer_id=pid, producer_epoch=epoch, base_sequence=0),
        build_control_batch(4, commit=True, producer_id=pid, producer_epoch=epoch, timestamp=T0,
                            coordinator_epoch=7),
        build_batch(aborted, codec=CODEC_ZSTD, transactional=True, producer_id=pid, producer_epoch=epoch,
                    base_sequence=4),
        build_control_batch(8, commit=False, producer_id=pid, producer_epoch=epoch, timestamp=T0 + 5),
        build_batch(sample_records(2, base_offset=9, seed=4)),
    )  # fmt: skip
    stats = DecodeStats()
    records = list(iter_records(segment, stats=stats))
    # Control records are skipped; aborted data stays (filtering aborted transactions is the reader's choice).
    assert [r.offset for r in records] == [0, 1, 2, 3, 5, 6, 7, 9, 10]
    assert (stats.batches, stats.control_batches, stats.records, stats.bytes) == (5, 2, 9, len(segment))

    headers = list(iter_batches(segment))
    assert [h.is_control for h in headers] == [False, True, False, True, False]
    assert [h.is_transactional for h in headers] == [True, True, True, True, False]

    markers = [r for r in iter_records(segment, include_control=True) if r.offset in (4, 8)]
    assert [parse_control_record(m) for m in markers] == [(1, 7), (0, 0)]
    # kafka-python sees the same markers.
    kinds = [record.type for batch in MemoryRecords(segment) if batch.is_control_batch for record in batch]
    assert kinds == [1, 0]


def test_offset_bounds_are_inclusive_and_skip_whole_batches_undecoded() -> None:
    # The middle batch claims gzip but holds garbage: it may only be skipped, never decompressed.
    garbage = assemble_batch(
        b"not gzip at all", base_offset=10, records_count=5, last_offset_delta=4, base_timestamp=T0,
        max_timestamp=T0, attributes=CODEC_GZIP,
    )  # fmt: skip
    segment = segment_of(
        build_batch(sample_records(10, 0)), garbage, build_batch(sample_records(10, 15), codec=CODEC_LZ4)
    )
    assert [r.offset for r in iter_records(segment, min_offset=15, max_offset=17)] == [15, 16, 17]
    assert [r.offset for r in iter_records(segment, max_offset=9)] == list(range(10))
    assert [r.offset for r in iter_records(segment, min_offset=3, max_offset=5)] == [3, 4, 5]
    with pytest.raises(CorruptRecordError) as caught:
        list(iter_records(segment, min_offset=12))
    assert caught.value.offset == len(build_batch(sample_records(10, 0)))


def test_start_and_base_positions() -> None:
    builder = SegmentBuilder()
    for n in range(4):
        builder.add(sample_records(5, base_offset=n * 5, seed=n))
    segment, positions = builder.segment, builder.positions
    # Start at the third batch of the whole segment.
    assert [r.offset for r in iter_records(segment, start_position=positions[2])] == list(range(10, 20))
    # A byte range read from the third batch on: positions stay those of the object.
    piece = segment[positions[2] :]
    assert [h.position for h in iter_batches(piece, base_position=positions[2])] == positions[2:]
    header, records = decode_batch(piece, positions[3] - positions[2], base_position=positions[2])
    assert header.position == positions[3] and [r.offset for r in records] == list(range(15, 20))
    with pytest.raises(ValueError):
        list(iter_batches(segment, start_position=len(segment) + 1))


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_any_buffer_decodes_the_same(kind: type) -> None:
    segment = segment_of(
        build_batch(sample_records(9)), build_batch(sample_records(9, 9), codec=CODEC_SNAPPY)
    )
    padded = b"xx" + segment + b"yy"
    buffer = memoryview(padded)[2:-2] if kind is memoryview else kind(segment)
    assert list(iter_records(buffer)) == list(iter_records(segment))


def test_partial_tail_of_every_length() -> None:
    batches = [build_batch(sample_records(3, 3 * n, seed=n), codec=n % 2) for n in range(3)]
    segment = segment_of(*batches)
    ends = [sum(len(b) for b in batches[: n + 1]) for n in range(3)]
    for cut in range(len(segment) + 1):
        whole = sum(1 for end in ends if end <= cut)
        got = list(iter_batches(segment[:cut], allow_partial_tail=True))
        assert len(got) == whole
        if cut in (0, *ends):
            assert len(list(iter_batches(segment[:cut]))) == whole
        else:
            with pytest.raises(CorruptRecordError) as caught:
                list(iter_records(segment[:cut], object_name="t-0/x.log"))
            assert caught.value.offset == ([0, *ends][whole])
            assert "t-0/x.log" in str(caught.value)


def test_empty_batches_left_by_compaction() -> None:
    empty = build_batch([], base_offset=30, last_offset_delta=9)
    segment = segment_of(build_batch(sample_records(3, 27)), empty, build_batch(sample_records(2, 40)))
    (header,) = [h for h in iter_batches(segment) if h.records_count == 0]
    assert (header.base_offset, header.last_offset) == (30, 39)
    assert [r.offset for r in iter_records(segment)] == [27, 28, 29, 40, 41]


def test_message_format_v1_is_refused_by_name() -> None:
    batch = bytearray(build_batch(sample_records(2)))
    batch[16] = 1
    with pytest.raises(CorruptRecordError, match="v0/v1"):
        list(iter_batches(bytes(batch)))


def test_extreme_field_values_round_trip() -> None:
    records = [
        Record(0, -(1 << 61), 0, b"k" * 70_000, None, ()),
        Record(2**31 - 1, (1 << 61), 0, None, b"\xff" * 200, (("x" * 300, b"y" * 20_000),)),
    ]
    batch = build_batch(records, base_offset=0)
    assert list(iter_records(batch)) == records
    assert as_tuples(list(iter_records(batch))) == kafka_python_read(batch)


def test_stats_count_bytes_of_all_intact_batches() -> None:
    batches = [build_batch(sample_records(4, 4 * n)) for n in range(3)]
    stats = DecodeStats()
    assert len(list(iter_records(segment_of(*batches), min_offset=8, stats=stats))) == 4
    assert (stats.batches, stats.records, stats.bytes) == (3, 4, sum(map(len, batches)))
    assert struct.unpack_from(">q", batches[2])[0] == 8


def test_uncompressed_throughput_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    """Decodes ~5 MB of 100-byte records and prints the rate (run with -s to see it); asserts only counts."""
    import time

    builder = SegmentBuilder()
    value = bytes(range(100))
    for n in range(500):
        builder.add([Record(n * 100 + i, T0 + i, 0, b"key-%d" % i, value, ()) for i in range(100)])
    segment = builder.segment
    started = time.perf_counter()
    count = sum(1 for _ in iter_rows(segment))
    elapsed = time.perf_counter() - started
    assert count == 50_000
    with capsys.disabled():
        print(
            f"\n  iter_rows: {count / elapsed / 1e6:.2f} M records/s, {len(segment) / elapsed / 1e6:.0f} MB/s"
        )


def test_aborted_transactions_are_left_out_batch_by_batch() -> None:
    # Producer 5 aborts offsets 10-13 (marker at 16); producer 6 commits 14-15 (marker at 17); the
    # plain batch at 18 and producer 5's next, committed transaction at 20 stay.
    plain = build_batch(sample_records(2, 18, seed=1))
    aborted_a = build_batch(
        sample_records(2, 10, seed=2), transactional=True, producer_id=5, codec=CODEC_ZSTD
    )
    aborted_b = build_batch(sample_records(2, 12, seed=3), transactional=True, producer_id=5)
    other = build_batch(sample_records(2, 14, seed=4), transactional=True, producer_id=6)
    abort = build_control_batch(16, commit=False, producer_id=5, producer_epoch=0, timestamp=T0)
    commit = build_control_batch(17, commit=True, producer_id=6, producer_epoch=0, timestamp=T0)
    later = build_batch(sample_records(1, 20, seed=5), transactional=True, producer_id=5)
    segment = segment_of(aborted_a, aborted_b, other, abort, commit, plain, later)
    ranges = AbortedRanges([AbortedTxn(5, 10, 16)])

    everything = [r.offset for r in iter_records(segment)]
    assert everything == [10, 11, 12, 13, 14, 15, 18, 19, 20]
    stats = DecodeStats()
    kept = [r[0] for r in iter_rows(segment, aborted=ranges, stats=stats)]
    assert kept == [14, 15, 18, 19, 20]
    assert stats.aborted_records == 4 and stats.records == 5
    # Offset bounds count only the aborted records inside them.
    stats = DecodeStats()
    assert [r.offset for r in iter_records(segment, min_offset=11, aborted=ranges, stats=stats)] == kept
    assert stats.aborted_records == 3
    # A non-transactional batch is never dropped, whatever its producer id says.
    same_producer = build_batch(sample_records(2, 11, seed=6), producer_id=5)
    assert [r.offset for r in iter_records(same_producer, aborted=ranges)] == [11, 12]
    # Markers stay visible to include_control, the abort marker included.
    with_markers = [r.offset for r in iter_records(segment, aborted=ranges, include_control=True)]
    assert with_markers == [14, 15, 16, 17, 18, 19, 20]
