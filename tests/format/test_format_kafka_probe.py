"""The `auto` heuristic on real record batches (kafka-python's builder) and on look-alikes."""

from __future__ import annotations

import functools

import pytest
from awscrt.checksums import crc32c
from fmt_helpers import make_data, record_batch_header
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from tests.support.kafka_batches import producer_batch
from tsproxy.format import (
    MIN_CHUNK_SIZE,
    ObjectContext,
    SegmentEncoder,
    TransformSettings,
    looks_like_compressed_kafka,
)
from tsproxy.format.kafka_probe import SCAN_BYTES, contains_compressed_kafka

CODECS = {
    "none": DefaultRecordBatchBuilder.CODEC_NONE,
    "gzip": DefaultRecordBatchBuilder.CODEC_GZIP,
    "snappy": DefaultRecordBatchBuilder.CODEC_SNAPPY,
    "lz4": DefaultRecordBatchBuilder.CODEC_LZ4,
    "zstd": DefaultRecordBatchBuilder.CODEC_ZSTD,
}


def batch(codec: int, base_offset: int = 0, records: int = 50, transactional: bool = False) -> bytes:
    values = (b'{"order": %d, "item": "widget-%d", "qty": %d}' % (i, i % 13, i % 5) for i in range(records))
    return producer_batch(codec, values, base_offset=base_offset, transactional=transactional)


# The properties build real batches (compressed by kafka-python): on a loaded machine one example can take
# longer than Hypothesis's default deadline, which measures the machine, not the code.
SLOW_MACHINE_OK = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@functools.cache
def segment(codec: int, batches: int = 20) -> bytes:
    out = bytearray()
    for n in range(batches):
        out += batch(codec, base_offset=n * 50)
    return bytes(out)


def control_batch() -> bytes:
    """A transaction marker: a control batch, never compressed by Kafka."""
    raw = bytearray(batch(DefaultRecordBatchBuilder.CODEC_NONE, records=1, transactional=True))
    attributes = int.from_bytes(raw[21:23], "big") | 0x20
    raw[21:23] = attributes.to_bytes(2, "big")
    raw[17:21] = crc32c(bytes(raw[21:])).to_bytes(4, "big")
    return bytes(raw)


@pytest.mark.parametrize("name", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_are_recognised(name: str) -> None:
    assert looks_like_compressed_kafka(segment(CODECS[name]))
    assert looks_like_compressed_kafka(batch(CODECS[name]))  # exactly one batch


def test_uncompressed_batches_are_not() -> None:
    assert not looks_like_compressed_kafka(segment(CODECS["none"]))


def test_control_batch_first_then_the_data_batch_decides() -> None:
    assert looks_like_compressed_kafka(control_batch() + batch(CODECS["zstd"]))
    assert not looks_like_compressed_kafka(control_batch() + batch(CODECS["none"]))
    assert not looks_like_compressed_kafka(control_batch())


def test_look_alikes_are_not_kafka() -> None:
    good = batch(CODECS["lz4"])
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 0x01
    assert not looks_like_compressed_kafka(bytes(bad_crc))
    assert not looks_like_compressed_kafka(good[:-1])  # first batch not wholly in the prefix
    assert not looks_like_compressed_kafka(good[:60])
    wrong_magic = bytearray(good)
    wrong_magic[16] = 1
    assert not looks_like_compressed_kafka(bytes(wrong_magic))
    negative_offset = b"\xff" * 8 + good[8:]
    assert not looks_like_compressed_kafka(negative_offset)
    # Starts with byte 2, and a header whose length and magic look right but whose CRC is made up.
    assert not looks_like_compressed_kafka(b"\x02" + make_data("random", 4096, 3))
    fake = record_batch_header(0, 200, 2, 0xDEADBEEF, 0x0004) + make_data("random", 200, 4)
    assert not looks_like_compressed_kafka(fake)
    assert not looks_like_compressed_kafka(b"")


@SLOW_MACHINE_OK
@given(st.binary(max_size=512))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    assert looks_like_compressed_kafka(data) in (True, False)


def _encoded_compressed_flag(data: bytes, mode: str) -> bool:
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE, compression=mode, encryption=False)  # type: ignore[arg-type]
    enc = SegmentEncoder(ObjectContext.new(cfg, None), cfg)
    enc.feed(data)
    enc.finish()
    return enc.info.compressed


@pytest.mark.parametrize("name", list(CODECS))
def test_auto_mode_skips_only_already_compressed_segments(name: str) -> None:
    data = segment(CODECS[name], batches=40)
    assert _encoded_compressed_flag(data, "auto") == (name == "none")
    assert _encoded_compressed_flag(data, "on") is True
    assert _encoded_compressed_flag(data, "off") is False


def test_auto_mode_compresses_what_is_not_kafka() -> None:
    assert _encoded_compressed_flag(make_data("text", 100_000, 1), "auto")
    fake = record_batch_header(0, 200, 2, 0xDEADBEEF, 0x0004) + make_data("text", 200_000, 4)
    assert _encoded_compressed_flag(fake, "auto")


def test_auto_mode_shrinks_uncompressed_kafka() -> None:
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE, compression="auto", encryption=False)
    data = segment(CODECS["none"], batches=40)
    enc = SegmentEncoder(ObjectContext.new(cfg, None), cfg)
    stored = sum(len(c) for c in enc.feed(data) + enc.finish())
    assert stored < len(data) // 2


# -- parts of a multipart upload start anywhere inside a segment -------------------------------------------


@pytest.mark.parametrize("name", list(CODECS))
@SLOW_MACHINE_OK
@given(cut=st.integers(min_value=0, max_value=20_000))
def test_a_part_cut_anywhere_is_recognised(name: str, cut: int) -> None:
    data = segment(CODECS[name], batches=40)
    assert contains_compressed_kafka(data[cut:]) == (name != "none")


def test_no_batch_in_a_part_means_compress() -> None:
    assert not contains_compressed_kafka(make_data("random", 1 << 20, 5))
    assert not contains_compressed_kafka(make_data("text", 1 << 20, 6))
    assert not contains_compressed_kafka(bytes(1 << 20))  # zeros: every position a candidate, none real
    assert not contains_compressed_kafka(b"")
    good = batch(CODECS["zstd"])
    tampered = bytearray(good * 3)
    for start in range(0, len(tampered), len(good)):
        tampered[start + 30] ^= 0x01  # every CRC wrong
    assert not contains_compressed_kafka(bytes(tampered[7:]))
    # A real batch too far in is not looked for.
    assert not contains_compressed_kafka(make_data("random", SCAN_BYTES + 100, 7) + segment(CODECS["zstd"]))


@SLOW_MACHINE_OK
@given(st.binary(max_size=2048))
def test_scanning_arbitrary_bytes_never_crashes(data: bytes) -> None:
    assert contains_compressed_kafka(data) in (True, False)


@pytest.mark.parametrize("name", list(CODECS))
def test_auto_mode_in_a_later_part_skips_compressed_segments(name: str) -> None:
    data = segment(CODECS[name], batches=40)[1234:]
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE, compression="auto", encryption=False)
    start = SegmentEncoder(ObjectContext.new(cfg, None), cfg, 2)
    start.feed(data)
    start.finish()
    assert start.info.compressed is True  # as the start of an object it does not look like Kafka
    later = SegmentEncoder(ObjectContext.new(cfg, None), cfg, 2, object_start=False)
    later.feed(data)
    later.finish()
    assert later.info.compressed == (name == "none")
