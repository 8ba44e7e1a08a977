"""Decoded records as Arrow record batches, in the columns of Spark's own Kafka source.

    key binary, value binary, topic string, partition int, offset long, timestamp timestamp,
    timestampType int [, headers array<struct<key: string, value: binary>>]

A record without headers has null there, not an empty array, as in Spark's Kafka source.

Columns are built from the decoder's plain row tuples by one Arrow conversion, so the Python work per
record stays with the decoder.
"""

from __future__ import annotations

from collections.abc import Sequence

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


# The decoder's row tuple as one Arrow struct: pyarrow converts a list of tuples in a single C++ pass,
# several times faster than transposing the rows in Python and converting column by column.
ROW_TYPE = pa.struct(
    [
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.int64()),
        pa.field("timestampType", pa.int32()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADER_TYPE),
    ]
)


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
    n = len(rows)
    offsets, millis, types, keys, values, headers = pa.array(rows, type=ROW_TYPE).flatten()
    if timestamp_unit == "us":
        millis = pc.multiply(millis, 1000)
    columns = [
        keys,
        values,
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        offsets,
        millis.cast(pa.timestamp(timestamp_unit, tz="UTC")),
        types,
    ]
    if include_headers:
        columns.append(_null_when_empty(headers))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _null_when_empty(headers: pa.ListArray) -> pa.ListArray:
    """The same lists, with null for every empty one (Spark's Kafka source gives null, not [], for a
    record without headers). Rebuilt from the offsets and a validity mask: no per-row work in Python."""
    empty = pc.equal(pc.list_value_length(headers), 0)
    if not pc.any(empty).as_py():
        return headers
    return pa.ListArray.from_arrays(headers.offsets, headers.values, type=HEADER_TYPE, mask=empty)
