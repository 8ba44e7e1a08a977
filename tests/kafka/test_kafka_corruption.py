"""Corrupt segments: every kind of damage names the object and the batch's byte position, and
``skip_corrupt`` counts the damage and goes on at the next intact batch."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka_helpers import T0, sample_records

from tsproxy.errors import FormatError
from tsproxy.kafka import codecs
from tsproxy.kafka.builder import assemble_batch, build_batch, encode_varint
from tsproxy.kafka.codecs import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_NONE,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    CodecDataError,
    compress,
    decompress,
)
from tsproxy.kafka.errors import CorruptRecordError
from tsproxy.kafka.records import DecodeStats, Record, decode_batch, iter_records

NAME = "orders-0/00000000000000000000.log"


def five_batches() -> tuple[list[bytes], list[int]]:
    batches = [
        build_batch(sample_records(4, 4 * n, seed=n), codec=CODEC_ZSTD if n == 3 else CODEC_NONE)
        for n in range(5)
    ]
    positions = [sum(len(b) for b in batches[:n]) for n in range(5)]
    return batches, positions


def corrupt_error(segment: bytes, **options: object) -> CorruptRecordError:
    with pytest.raises(CorruptRecordError) as caught:
        list(iter_records(segment, object_name=NAME, **options))  # type: ignore[arg-type]
    error = caught.value
    assert isinstance(error, FormatError)
    assert NAME in str(error) and f"byte {error.offset}" in str(error)
    return error


def raw_batch(body: bytes, count: int, codec: int = CODEC_NONE) -> bytes:
    """A batch with a correct CRC around records that may be malformed."""
    return assemble_batch(
        body, base_offset=0, records_count=count, last_offset_delta=max(count - 1, 0), base_timestamp=T0,
        max_timestamp=T0, attributes=codec,
    )  # fmt: skip


def record_bytes(*fields: bytes | int, length: int | None = None) -> bytes:
    """A record from raw parts: ints become varints, bytes go in as they are."""
    body = bytearray()
    for part in fields:
        if isinstance(part, int):
            encode_varint(part, body)
        else:
            body += part
    out = bytearray()
    encode_varint(len(body) if length is None else length, out)
    return bytes(out + body)


GOOD = record_bytes(b"\x00", 0, 0, 1, b"k", 1, b"v", 0)


def test_a_good_handmade_record_reads() -> None:
    (record,) = iter_records(raw_batch(GOOD, 1))
    assert (record.key, record.value) == (b"k", b"v")


def test_every_flipped_bit_under_the_crc_is_caught() -> None:
    batches, positions = five_batches()
    segment = b"".join(batches)
    target = 2
    start, size = positions[target], len(batches[target])
    for index in range(start + 17, start + size):  # from the CRC field to the batch's end
        for bit in (0x01, 0x80):
            damaged = bytearray(segment)
            damaged[index] ^= bit
            error = corrupt_error(bytes(damaged))
            assert error.offset == start, index


def test_bits_outside_the_crc_are_not_covered() -> None:
    # Kafka leaves base offset and partition leader epoch out of the CRC so brokers can assign them.
    batch = bytearray(build_batch(sample_records(3)))
    batch[7] ^= 0x10  # base offset 0 -> 16
    batch[14] ^= 0x01  # partition leader epoch
    assert [r.offset for r in iter_records(bytes(batch))] == [16, 17, 18]


def test_truncated_segment() -> None:
    batches, positions = five_batches()
    segment = b"".join(batches)
    assert corrupt_error(segment[:-1]).offset == positions[4]
    assert corrupt_error(segment[: positions[4] + 30]).offset == positions[4]
    assert corrupt_error(segment[: positions[4] + 5]).offset == positions[4]


@pytest.mark.parametrize("delta", [-1, 1, 5, 10_000, -(1 << 31)])
def test_length_field_lies(delta: int) -> None:
    batches, positions = five_batches()
    damaged = bytearray(b"".join(batches))
    (length,) = struct.unpack_from(">i", damaged, positions[1] + 8)
    struct.pack_into(">i", damaged, positions[1] + 8, max(-(1 << 31), length + delta))
    assert corrupt_error(bytes(damaged)).offset == positions[1]
    # Even a reader told to expect a cut-off tail is not fooled: intact batches follow.
    assert corrupt_error(bytes(damaged), allow_partial_tail=True).offset == positions[1]


@pytest.mark.parametrize(
    ("body", "count", "reason"),
    [
        (record_bytes(b"\x00", 0, 0, 1, b"k", 1, b"v", 0, length=-3), 1, "length -3"),
        (record_bytes(b"\x00", 0, 0, 1, b"k", 1, b"v", 0, length=9) + b"\x00", 1, "length says"),
        (record_bytes(b"\x00", 0, 0, 30, b"k", 1, b"v", 0), 1, "key of 30 bytes"),
        (record_bytes(b"\x00", 0, 0, -2, 1, b"v", 0), 1, "key length -2"),
        (record_bytes(b"\x00", 0, 0, 1, b"k", -7, 0), 1, "value length -7"),
        (record_bytes(b"\x00", 0, 0, 1, b"k", 1, b"v", -1), 1, "header count -1"),
        (record_bytes(b"\x00", 0, 0, 1, b"k", 1, b"v", 1, 2, b"\xff\xfe", -1), 1, "not UTF-8"),
        (record_bytes(b"\x00", 0, 0, 1, b"k", 1, b"v", 1, -4, -1), 1, "header key length -4"),
        (record_bytes(b"\x00", b"\xff" * 10 + b"\x01", 0, -1, -1, 0), 1, "varint longer than 10 bytes"),
        (record_bytes(b"\x00", b"\xff" * 9 + b"\x7f", 0, -1, -1, 0), 1, "overflows 64 bits"),
        (b"\xff\xff\xff\xff\xff\x01" + GOOD[1:], 1, "varint longer than 5 bytes"),
        (b"\xff\xff\xff\xff\x7f" + GOOD[1:], 1, "overflows 32 bits"),
        (GOOD + b"\x00\x00", 1, "2 stray bytes"),
        (GOOD + GOOD, 3, "cannot fit"),
        (record_bytes(b"\x00", b"\xff" * 5, length=6), 1, "runs past"),
    ],
)
def test_malformed_records_with_a_valid_crc(body: bytes, count: int, reason: str) -> None:
    segment = build_batch(sample_records(2)) + raw_batch(body, count)
    error = corrupt_error(segment)
    assert error.offset == len(build_batch(sample_records(2)))
    assert reason in error.reason


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda b: struct.pack_into(">i", b, 8, -5), "below the minimum"),
        (lambda b: struct.pack_into(">i", b, 8, 20), "below the minimum"),
        (lambda b: struct.pack_into(">b", b, 16, 7), "magic byte is 7"),
    ],
)
def test_broken_headers(mutate: Callable[[bytearray], None], reason: str) -> None:
    batch = bytearray(build_batch(sample_records(3)))
    mutate(batch)
    assert reason in corrupt_error(bytes(batch) + build_batch(sample_records(2, 3))).reason


def test_bad_codec_and_bad_compressed_data() -> None:
    assert "unknown compression codec 6" in corrupt_error(raw_batch(GOOD, 1, codec=6)).reason
    assert "gzip body does not decompress" in corrupt_error(raw_batch(b"garbage", 1, codec=CODEC_GZIP)).reason
    truncated_zstd = build_batch(sample_records(20), codec=CODEC_ZSTD)
    body = truncated_zstd[61:-4]
    assert "zstd" in corrupt_error(raw_batch(body, 20, codec=CODEC_ZSTD)).reason


def test_negative_counts_in_the_header() -> None:
    batch = raw_batch(GOOD, -1)
    assert "records count (-1)" in corrupt_error(batch).reason


def test_decode_batch_names_the_position() -> None:
    batches, positions = five_batches()
    damaged = bytearray(b"".join(batches))
    damaged[positions[3] + 40] ^= 1
    with pytest.raises(CorruptRecordError) as caught:
        decode_batch(bytes(damaged), positions[3], object_name=NAME, base_position=1000)
    assert caught.value.offset == 1000 + positions[3]


def test_skip_corrupt_counts_and_goes_on() -> None:
    batches, positions = five_batches()
    damaged = bytearray(b"".join(batches))
    damaged[positions[1] + 70] ^= 0x04  # CRC mismatch in batch 1
    damaged[positions[3] + 30] ^= 0x01  # CRC mismatch in the zstd batch 3
    stats = DecodeStats()
    offsets = [r.offset for r in iter_records(bytes(damaged), skip_corrupt=True, stats=stats)]
    assert offsets == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19]
    assert (stats.corrupt_batches, stats.batches) == (2, 3)


def test_skip_corrupt_over_a_record_level_error() -> None:
    segment = (
        build_batch(sample_records(2)) + raw_batch(GOOD + b"\x00", 1) + build_batch(sample_records(2, 5))
    )
    stats = DecodeStats()
    assert [r.offset for r in iter_records(segment, skip_corrupt=True, stats=stats)] == [0, 1, 5, 6]
    assert stats.corrupt_batches == 1


@pytest.mark.parametrize("length", [-1, 0, 48, 1 << 30, 200])
def test_skip_corrupt_resynchronises_after_a_bad_length(length: int) -> None:
    batches, positions = five_batches()
    damaged = bytearray(b"".join(batches))
    struct.pack_into(">i", damaged, positions[2] + 8, length)
    stats = DecodeStats()
    for kind in (bytes, memoryview):
        stats = DecodeStats()
        offsets = [r.offset for r in iter_records(kind(bytes(damaged)), skip_corrupt=True, stats=stats)]
        assert offsets == [*range(8), *range(12, 20)]
        assert stats.corrupt_batches == 1


def test_skip_corrupt_over_garbage_between_batches() -> None:
    batches, _ = five_batches()
    segment = batches[0] + b"\x02garbage\x02" * 50 + batches[1]
    stats = DecodeStats()
    assert [r.offset for r in iter_records(segment, skip_corrupt=True, stats=stats)] == list(range(8))
    assert stats.corrupt_batches == 1
    assert corrupt_error(segment).offset == len(batches[0])


def test_skip_corrupt_at_a_cut_off_end() -> None:
    batches, _ = five_batches()
    segment = b"".join(batches)[:-3]
    stats = DecodeStats()
    assert len(list(iter_records(segment, skip_corrupt=True, stats=stats))) == 16
    assert stats.corrupt_batches == 1


def test_a_preallocated_zero_tail_ends_the_segment() -> None:
    batches, _ = five_batches()
    segment = b"".join(batches) + bytes(4096)
    assert len(list(iter_records(segment))) == 20
    # Zeros followed by data are damage, not preallocation.
    assert corrupt_error(b"".join(batches[:2]) + bytes(64) + batches[2]).offset == len(
        batches[0] + batches[1]
    )


def test_unchecked_crc_still_checks_structure() -> None:
    batches, positions = five_batches()
    damaged = bytearray(b"".join(batches))
    damaged[positions[0] + 17] ^= 0xFF  # the stored CRC itself
    assert len(list(iter_records(bytes(damaged), verify_crc=False))) == 20
    struct.pack_into(">i", damaged, positions[0] + 8, 30)
    assert corrupt_error(bytes(damaged), verify_crc=False).offset == 0


def test_corrupt_record_error_survives_pickling() -> None:
    import pickle

    error = CorruptRecordError("a/b.log", 123, "CRC-32C mismatch")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.object_name, copy.offset, copy.reason, str(copy)) == (
        "a/b.log",
        123,
        "CRC-32C mismatch",
        str(error),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_damage_never_yields_foreign_records(data: st.DataObject) -> None:
    """Whatever bytes change, the reader raises CorruptRecordError or yields only records that were
    written (the CRC vouches for contents; offsets may move with the unprotected base offset)."""
    batches, _ = five_batches()
    original = b"".join(batches)
    written = {(r.key, r.value, r.headers) for r in iter_records(original)}
    damaged = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4))):
        index = data.draw(st.integers(0, len(damaged) - 1))
        damaged[index] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(len(damaged) - 80, len(damaged)))
    segment = bytes(damaged[:cut])
    stats = DecodeStats()
    got = list(iter_records(segment, skip_corrupt=True, stats=stats))
    assert {(r.key, r.value, r.headers) for r in got} <= written
    try:
        strict = list(iter_records(segment))
    except CorruptRecordError:
        assert stats.corrupt_batches >= 1
    else:
        assert strict == got and stats.corrupt_batches == 0


@settings(max_examples=200, deadline=None)
@given(blob=st.binary(max_size=300))
def test_arbitrary_bytes_give_records_or_a_corrupt_record_error(blob: bytes) -> None:
    try:
        list(iter_records(blob))
    except CorruptRecordError:
        pass
    list(iter_records(blob, skip_corrupt=True, allow_partial_tail=True))


@pytest.mark.parametrize(
    ("codec", "xerial"),
    [(CODEC_GZIP, True), (CODEC_SNAPPY, True), (CODEC_SNAPPY, False), (CODEC_LZ4, True), (CODEC_ZSTD, True)],
    ids=["gzip", "snappy-xerial", "snappy-raw", "lz4", "zstd"],
)
def test_a_body_that_expands_past_the_limit_is_refused(codec: int, xerial: bool) -> None:
    # Zeros compress by a factor of hundreds to thousands: the shape of a decompression bomb.
    raw = b"\0" * (3 << 20) + b"end"
    body = compress(codec, raw, snappy_xerial=xerial)
    assert len(body) < len(raw) // 20
    assert decompress(codec, body, limit=len(raw)) == raw
    with pytest.raises(CodecDataError, match=f"more than {len(raw) - 1} bytes"):
        decompress(codec, body, limit=len(raw) - 1)
    # Concatenated frames (or xerial blocks) count together, and truncation is still truncation.
    if codec != CODEC_SNAPPY:
        assert decompress(codec, body + body, limit=2 * len(raw)) == raw + raw
        with pytest.raises(CodecDataError, match="more than"):
            decompress(codec, body + body, limit=2 * len(raw) - 1)
        with pytest.raises(CodecDataError):
            decompress(codec, body[:-4])


def test_a_batch_past_the_decompressed_limit_is_corrupt_and_skippable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    small = build_batch(sample_records(3, 0), codec=CODEC_ZSTD)
    bomb = build_batch(
        [Record(3, T0, 0, b"k", b"\0" * 200_000, ()), Record(4, T0, 0, None, b"\0" * 200_000, ())],
        codec=CODEC_ZSTD,
    )
    tail = build_batch(sample_records(2, 5, seed=1), codec=CODEC_GZIP)
    segment = small + bomb + tail
    assert len(list(iter_records(segment))) == 7  # within the default limit: fine
    monkeypatch.setattr(codecs, "MAX_DECOMPRESSED", 100_000)
    err = corrupt_error(segment)
    assert err.offset == len(small) and "decompresses to more than 100000 bytes" in err.reason
    stats = DecodeStats()
    assert [r.offset for r in iter_records(segment, skip_corrupt=True, stats=stats)] == [0, 1, 2, 5, 6]
    assert stats.corrupt_batches == 1
