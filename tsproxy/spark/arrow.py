"""Decoded records as Arrow record batches, in the columns of Spark's own Kafka source.

    key binary, value binary, topic string, partition int, offset long, timestamp timestamp,
    timestampType int [, headers array<struct<key: string, value: binary>>]

Columns are built from the decoder's plain row tuples with one transposition (`zip(*rows)`) and a few
Arrow constructors, so the Python work per record stays with the decoder.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import pyarrow as pa
import pyarrow.compute as pc

from tsproxy.kafka.records import RecordRow

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))

SPARK_DDL = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int"
)
SPARK_DDL_HEADERS = SPARK_DDL + ", headers array<struct<key: string, value: binary>>"


def spark_ddl(include_headers: bool) -> str:
    """The source's schema as a Spark DDL string."""
    return SPARK_DDL_HEADERS if include_headers else SPARK_DDL


def arrow_schema(include_headers: bool, timestamp_unit: str = "us") -> pa.Schema:
    """The Arrow schema of the batches (Spark takes microseconds; Parquet files keep milliseconds)."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp(timestamp_unit, tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", HEADER_TYPE))
    return pa.schema(fields)


def rows_to_batch(
    rows: Sequence[RecordRow],
    topic: str,
    partition: int,
    *,
    include_headers: bool,
    timestamp_unit: str = "us",
) -> pa.RecordBatch:
    """One record batch from decoder rows (offset, timestamp, timestampType, key, value, headers)."""
    schema = arrow_schema(include_headers, timestamp_unit)
    if not rows:
        return pa.RecordBatch.from_pylist([], schema=schema)
    offsets, stamps, types, keys, values, headers = zip(*rows, strict=True)
    n = len(rows)
    millis = pa.array(stamps, pa.int64())
    if timestamp_unit == "us":
        millis = pc.multiply(millis, 1000)
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(offsets, pa.int64()),
        millis.cast(pa.timestamp(timestamp_unit, tz="UTC")),
        pa.array(types, pa.int32()),
    ]
    if include_headers:
        columns.append(_headers_column(headers))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _headers_column(headers: Sequence[tuple[tuple[str, bytes | None], ...]]) -> pa.Array:
    counts = [len(h) for h in headers]
    list_offsets = pa.array([0, *accumulate(counts)], pa.int32())
    names = [name for h in headers for name, _ in h]
    values = [value for h in headers for _, value in h]
    items = pa.StructArray.from_arrays(
        [pa.array(names, pa.string()), pa.array(values, pa.binary())],
        fields=list(HEADER_TYPE.value_type),
    )
    return pa.ListArray.from_arrays(list_offsets, items, type=HEADER_TYPE)
