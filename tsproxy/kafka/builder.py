"""A small writer of Kafka log data: v2 record batches, segments and their offset/time indexes.

It exists for tests, benchmarks and synthetic data, and writes what a broker writes: batches as Java
producers make them (first record's timestamp as base timestamp, xerial-framed snappy, independent lz4
blocks, zstd frames without a content size), control batches as transaction coordinators make them,
LogAppendTime as a broker stamps it, and sparse indexes on the broker's rule (an entry once more than
``index_interval_bytes`` were appended since the last one).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from awscrt.checksums import crc32c

from .codecs import CODEC_NONE, compress
from .indexes import OFFSET_INDEX_ENTRY, TIME_INDEX_ENTRY, TXN_INDEX_ENTRY
from .records import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER,
    CONTROL_MASK,
    CRC_OFFSET,
    LOG_OVERHEAD,
    MAGIC_V2,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    Record,
)

NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
CONTROL_ABORT = 0
CONTROL_COMMIT = 1
_CONTROL_KEY = struct.Struct(">hh")  # version, type
_CONTROL_VALUE = struct.Struct(">hi")  # version, coordinator epoch


def encode_varint(value: int, out: bytearray) -> None:
    """Append ``value`` as a zigzag varint (Kafka's varint and varlong alike)."""
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"{value} does not fit a varlong")
    raw = (value << 1) ^ (value >> 63)
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)


def encode_record(
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
    out: bytearray,
) -> None:
    """Append one length-prefixed record."""
    body = bytearray(b"\x00")  # record attributes
    encode_varint(timestamp_delta, body)
    encode_varint(offset_delta, body)
    for blob in (key, value):
        if blob is None:
            encode_varint(-1, body)
        else:
            encode_varint(len(blob), body)
            body += blob
    encode_varint(len(headers), body)
    for name, header_value in headers:
        encoded = name.encode("utf-8")
        encode_varint(len(encoded), body)
        body += encoded
        if header_value is None:
            encode_varint(-1, body)
        else:
            encode_varint(len(header_value), body)
            body += header_value
    encode_varint(len(body), out)
    out += body


def assemble_batch(
    records_body: bytes,
    *,
    base_offset: int,
    records_count: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    attributes: int = 0,
    partition_leader_epoch: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """Put a header with a correct length and CRC-32C in front of an already encoded records body.

    The low-level step, also for tests that need a batch whose CRC is right but whose records are not.
    """
    header = BATCH_HEADER.pack(
        base_offset, BATCH_HEADER.size - LOG_OVERHEAD + len(records_body), partition_leader_epoch,
        MAGIC_V2, 0, attributes, last_offset_delta, base_timestamp, max_timestamp,
        producer_id, producer_epoch, base_sequence, records_count,
    )  # fmt: skip
    batch = bytearray(header + records_body)
    struct.pack_into(">I", batch, CRC_OFFSET, crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
    return bytes(batch)


def build_batch(
    records: Sequence[Record],
    *,
    base_offset: int | None = None,
    codec: int = CODEC_NONE,
    log_append_time: int | None = None,
    transactional: bool = False,
    control: bool = False,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = 0,
    last_offset_delta: int | None = None,
    snappy_xerial: bool = True,
) -> bytes:
    """One v2 batch holding ``records`` at their own offsets and timestamps.

    ``base_offset`` defaults to the first record's offset; gaps between offsets are kept (as after
    compaction). ``log_append_time`` marks the batch LogAppendTime with that max timestamp, leaving the
    records' deltas as the producer wrote them, as a broker does. An empty batch (everything compacted
    away) needs ``base_offset`` and ``last_offset_delta``. The records' ``timestamp_type`` is ignored.
    """
    if not records and (base_offset is None or last_offset_delta is None):
        raise ValueError("an empty batch needs base_offset and last_offset_delta")
    if base_offset is None:
        base_offset = records[0].offset
    base_timestamp = records[0].timestamp if records else NO_TIMESTAMP
    body = bytearray()
    for record in records:
        encode_record(
            record.offset - base_offset, record.timestamp - base_timestamp,
            record.key, record.value, record.headers, body,
        )  # fmt: skip
    if last_offset_delta is None:
        last_offset_delta = records[-1].offset - base_offset
    max_timestamp = max((r.timestamp for r in records), default=NO_TIMESTAMP)
    attributes = codec
    if log_append_time is not None:
        attributes |= TIMESTAMP_TYPE_MASK
        max_timestamp = log_append_time
    if transactional:
        attributes |= TRANSACTIONAL_MASK
    if control:
        attributes |= CONTROL_MASK
    payload = (
        bytes(body) if codec == CODEC_NONE else compress(codec, bytes(body), snappy_xerial=snappy_xerial)
    )
    return assemble_batch(
        payload, base_offset=base_offset, records_count=len(records), last_offset_delta=last_offset_delta,
        base_timestamp=base_timestamp, max_timestamp=max_timestamp, attributes=attributes,
        partition_leader_epoch=partition_leader_epoch, producer_id=producer_id,
        producer_epoch=producer_epoch, base_sequence=base_sequence,
    )  # fmt: skip


def build_control_batch(
    offset: int,
    *,
    commit: bool,
    producer_id: int,
    producer_epoch: int,
    timestamp: int,
    coordinator_epoch: int = 0,
    partition_leader_epoch: int = 0,
) -> bytes:
    """A transaction marker: a transactional control batch with one commit or abort record."""
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = _CONTROL_VALUE.pack(0, coordinator_epoch)
    marker = Record(offset, timestamp, 0, key, value, ())
    return build_batch(
        [marker], transactional=True, control=True, producer_id=producer_id,
        producer_epoch=producer_epoch, partition_leader_epoch=partition_leader_epoch,
    )  # fmt: skip


def parse_control_record(record: Record) -> tuple[int, int]:
    """(marker type, coordinator epoch) of a control record: type 0 is abort, 1 commit."""
    if record.key is None or record.value is None or len(record.key) < 4 or len(record.value) < 6:
        raise ValueError("not a transaction marker record")
    _, kind = _CONTROL_KEY.unpack_from(record.key)
    _, epoch = _CONTROL_VALUE.unpack_from(record.value)
    return kind, epoch


def encode_offset_index(entries: Iterable[tuple[int, int]], base_offset: int) -> bytes:
    """A ``.index`` file from (absolute offset, position) entries."""
    return b"".join(OFFSET_INDEX_ENTRY.pack(offset - base_offset, position) for offset, position in entries)


def encode_time_index(entries: Iterable[tuple[int, int]], base_offset: int) -> bytes:
    """A ``.timeindex`` file from (timestamp, absolute offset) entries."""
    return b"".join(TIME_INDEX_ENTRY.pack(timestamp, offset - base_offset) for timestamp, offset in entries)


class SegmentBuilder:
    """Appends batches to a segment and keeps its offset and time indexes as a broker would."""

    def __init__(self, base_offset: int = 0, *, index_interval_bytes: int = 4096) -> None:
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.offset_entries: list[tuple[int, int]] = []  # (last offset of the batch, its position)
        self.time_entries: list[tuple[int, int]] = []  # (max timestamp so far, offset it belongs to)
        self.positions: list[int] = []  # where every batch starts
        self._data = bytearray()
        self._since_last_entry = 0
        self._max_timestamp = NO_TIMESTAMP
        self._offset_of_max_timestamp = -1
        self._closed = False

    def append(self, batch: bytes) -> int:
        """Append one encoded batch; returns its position."""
        if self._closed:
            raise ValueError("segment is closed")
        fields = BATCH_HEADER.unpack_from(batch)
        last_offset, max_timestamp = fields[0] + fields[6], fields[8]
        position = len(self._data)
        if max_timestamp > self._max_timestamp:
            self._max_timestamp, self._offset_of_max_timestamp = max_timestamp, last_offset
        if self._since_last_entry > self.index_interval_bytes:
            self.offset_entries.append((last_offset, position))
            self._maybe_add_time_entry()
            self._since_last_entry = 0
        self._data += batch
        self._since_last_entry += len(batch)
        self.positions.append(position)
        return position

    def add(self, records: Sequence[Record], **batch_options: object) -> int:
        """Build a batch of ``records`` (options as for :func:`build_batch`) and append it."""
        return self.append(build_batch(records, **batch_options))  # type: ignore[arg-type]

    def close(self) -> None:
        """Finish the segment: a rolled segment's time index ends with its max timestamp."""
        if not self._closed:
            self._maybe_add_time_entry()
            self._closed = True

    def _maybe_add_time_entry(self) -> None:
        # The time index only grows: a broker skips an entry that would not raise the timestamp.
        if self._offset_of_max_timestamp >= 0 and (
            not self.time_entries or self._max_timestamp > self.time_entries[-1][0]
        ):
            self.time_entries.append((self._max_timestamp, self._offset_of_max_timestamp))

    @property
    def segment(self) -> bytes:
        return bytes(self._data)

    @property
    def offset_index(self) -> bytes:
        return encode_offset_index(self.offset_entries, self.base_offset)

    @property
    def time_index(self) -> bytes:
        return encode_time_index(self.time_entries, self.base_offset)


def encode_txn_index(aborted: Iterable[tuple[int, int, int]]) -> bytes:
    """A ``.txnindex`` from (producer id, first offset, abort marker offset) entries."""
    # The last stable offset is written as the one after the marker: what a broker records when no
    # other transaction was open at the abort.
    return b"".join(TXN_INDEX_ENTRY.pack(0, p, first, last, last + 1) for p, first, last in aborted)


def build_indexes_object(
    offset_index: bytes,
    time_index: bytes,
    producer_snapshot: bytes = b"",
    leader_epoch: bytes = b"",
    transaction: bytes | None = None,
) -> tuple[bytes, dict[str, tuple[int, int] | None]]:
    """The tiered-storage plugin's ``.indexes`` object and each index's (position, size) in it.

    The order is the plugin's: offset, timestamp, producer snapshot, leader epoch, transaction (the last
    only when the segment has one). Keys of the returned dict are the manifest's ``segmentIndexes`` names.
    """
    parts: list[tuple[str, bytes | None]] = [
        ("offset", offset_index), ("timestamp", time_index), ("producerSnapshot", producer_snapshot),
        ("leaderEpoch", leader_epoch), ("transaction", transaction),
    ]  # fmt: skip
    ranges: dict[str, tuple[int, int] | None] = {}
    position = 0
    for name, blob in parts:
        if blob is None:
            ranges[name] = None
            continue
        ranges[name] = (position, len(blob))
        position += len(blob)
    return b"".join(blob for _, blob in parts if blob is not None), ranges
