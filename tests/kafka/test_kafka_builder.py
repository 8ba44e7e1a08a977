"""The builder against kafka-python: byte-equal where both can write the same batch, and each able to
read the other's output; plus random record sets through every codec."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka_helpers import T0, as_tuples, kafka_python_batch, kafka_python_read, sample_records

from tsproxy.kafka.builder import SegmentBuilder, build_batch, encode_varint
from tsproxy.kafka.codecs import CODEC_GZIP, CODEC_LZ4, CODEC_NONE, CODEC_SNAPPY, CODEC_ZSTD
from tsproxy.kafka.records import Record, _signed_varint, iter_batches, iter_records, iter_rows

CODECS = [CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD]
CODEC_IDS = ["none", "gzip", "snappy", "lz4", "zstd"]


@pytest.mark.parametrize("transactional", [False, True])
def test_uncompressed_batches_are_byte_equal_to_kafka_python(transactional: bool) -> None:
    pid, epoch, sequence = (77, 1, 5) if transactional else (-1, -1, -1)
    for base in (0, 123_456_789):
        records = sample_records(50, base_offset=base)
        ours = build_batch(
            records,
            transactional=transactional,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=sequence,
        )
        theirs = kafka_python_batch(
            records, CODEC_NONE, transactional=transactional, producer_id=pid, producer_epoch=epoch,
            base_sequence=sequence,
        )  # fmt: skip
        assert ours == theirs


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_kafka_python_reads_our_batches(codec: int) -> None:
    records = sample_records(60, base_offset=42)
    segment = build_batch(records[:30], codec=codec) + build_batch(
        records[30:], codec=codec, log_append_time=T0 + 5, producer_id=9, producer_epoch=0, base_sequence=30
    )
    expected = as_tuples(records[:30]) + [
        (r.offset, T0 + 5, 1, r.key, r.value, r.headers) for r in records[30:]
    ]
    assert kafka_python_read(segment) == expected
    assert as_tuples(list(iter_records(segment))) == expected


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_compressed_bodies_match_after_decompression(codec: int) -> None:
    # Compressed bytes differ between libraries and levels; the batch fields and records must not.
    records = sample_records(40, base_offset=3)
    ours, theirs = build_batch(records, codec=codec), kafka_python_batch(records, codec)
    (a,), (b,) = iter_batches(ours), iter_batches(theirs)
    assert (a.codec, a.base_timestamp, a.max_timestamp, a.records_count, a.last_offset_delta) == (
        b.codec, b.base_timestamp, b.max_timestamp, b.records_count, b.last_offset_delta,
    )  # fmt: skip
    assert list(iter_records(ours)) == list(iter_records(theirs)) == records


def test_segment_builder_positions_and_closing() -> None:
    builder = SegmentBuilder(10)
    first = builder.add(sample_records(3, 10))
    second = builder.append(build_batch(sample_records(2, 13)))
    builder.close()
    builder.close()  # closing twice is harmless
    assert (first, second) == (0, builder.positions[1]) and builder.positions == [
        h.position for h in iter_batches(builder.segment)
    ]
    with pytest.raises(ValueError):
        builder.add(sample_records(1, 15))
    with pytest.raises(ValueError):
        build_batch([])


headers_strategy = st.lists(
    st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3
).map(tuple)
record_strategy = st.tuples(
    st.integers(1, 5),  # offset step (gaps as after compaction)
    st.integers(-(10**6), 10**6),  # timestamp jitter
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=300),
    headers_strategy,
)


@settings(max_examples=60, deadline=None)
@given(
    raw=st.lists(record_strategy, min_size=1, max_size=60),
    cuts=st.lists(st.integers(1, 59), max_size=5),
    codecs=st.lists(st.sampled_from(CODECS), min_size=6, max_size=6),
    base=st.integers(0, 2**40),
    log_append=st.booleans(),
)
def test_random_record_sets_round_trip(
    raw: list, cuts: list[int], codecs: list[int], base: int, log_append: bool
) -> None:
    records, offset = [], base
    for step, jitter, key, value, headers in raw:
        offset += step
        records.append(Record(offset, T0 + jitter, 0, key, value, headers))
    bounds = sorted({c for c in cuts if c < len(records)} | {0, len(records)})
    append_time = T0 + 10**7
    batches = [
        build_batch(records[a:b], codec=codecs[n], log_append_time=append_time if log_append else None)
        for n, (a, b) in enumerate(itertools.pairwise(bounds))
    ]
    segment = b"".join(batches)
    expected = [
        Record(r.offset, append_time, 1, r.key, r.value, r.headers) if log_append else r for r in records
    ]
    assert list(iter_records(segment)) == expected
    assert list(iter_rows(segment)) == as_tuples(expected)
    assert kafka_python_read(segment) == as_tuples(expected)
    low, high = records[len(records) // 3].offset, records[2 * len(records) // 3].offset
    assert list(iter_records(segment, min_offset=low, max_offset=high)) == [
        r for r in expected if low <= r.offset <= high
    ]


@settings(max_examples=300, deadline=None)
@given(value=st.integers(-(2**63), 2**63 - 1))
def test_varints_round_trip(value: int) -> None:
    out = bytearray()
    encode_varint(value, out)
    assert _signed_varint(bytes(out), 0, 64) == (value, len(out))
    if -(2**31) <= value < 2**31:
        assert _signed_varint(bytes(out), 0, 32) == (value, len(out))
