"""Kafka record batches v2 built by a real client library's builder (kafka-python), for tests."""

from __future__ import annotations

from collections.abc import Iterable

from kafka.record.default_records import DefaultRecordBatchBuilder


def producer_batch(
    codec: int, values: Iterable[bytes], *, base_offset: int = 0, transactional: bool = False
) -> bytes:
    """One batch of records with the given values (keys k0, k1, ...), as a producer would send it.

    kafka-python sends a batch uncompressed when the codec does not make it smaller, as the Java
    producer does; give values that compress if the codec must show.
    """
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=transactional,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i, value=value, headers=[])
    out = bytearray(builder.build())
    out[0:8] = base_offset.to_bytes(8, "big")  # baseOffset is outside the CRC
    return bytes(out)
