"""Shared pieces of the Kafka tests: sample records, and kafka-python as the independent reference."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from tsproxy.kafka.records import Record

T0 = 1_700_000_000_000  # a plausible epoch-millisecond timestamp


def sample_records(count: int, base_offset: int = 0, *, seed: int = 0) -> list[Record]:
    """Records with every shape a topic has: null and empty keys and values, headers (also with null
    values and non-ASCII names), timestamps out of order, and values compressible enough that every
    codec shrinks them."""
    records = []
    for i in range(count):
        n = i + seed
        key = None if n % 5 == 0 else (b"" if n % 7 == 0 else b"key-%d" % n)
        value = None if n % 6 == 0 else b"value %d " % n * (n % 9)
        headers: tuple[tuple[str, bytes | None], ...] = ()
        if n % 3 == 0:
            headers = (("trace-id", b"%08x" % n), ("h\u00e9", None))
        elif n % 4 == 0:
            headers = (("empty", b""),)
        records.append(Record(base_offset + i, T0 + n * 7 - (n % 4) * 11, 0, key, value, headers))
    return records


def kafka_python_batch(
    records: Sequence[Record],
    codec: int,
    *,
    transactional: bool = False,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """A batch built by kafka-python's own builder, placed at the first record's offset as a broker would.

    kafka-python writes base offset 0 and offsets as deltas (a producer does not know offsets); the base
    offset lies outside the CRC, so setting it afterwards is what a broker does too.
    """
    base = records[0].offset
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 30,
    )
    for record in records:
        meta = builder.append(
            record.offset - base, record.timestamp, record.key, record.value, list(record.headers)
        )
        assert meta is not None
    batch = builder.build()
    struct.pack_into(">q", batch, 0, base)
    return bytes(batch)


def kafka_python_read(segment: bytes) -> list[tuple]:
    """Every record kafka-python finds in ``segment`` (control records too), checking each batch's CRC."""
    out = []
    for batch in MemoryRecords(segment):
        assert batch.validate_crc()
        for record in batch:
            headers = tuple((name, value) for name, value in record.headers)
            out.append(
                (record.offset, record.timestamp, record.timestamp_type, record.key, record.value, headers)
            )
    return out


def as_tuples(records: Sequence[Record]) -> list[tuple]:
    return [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers) for r in records]
