"""Test data: Kafka segments built with kafka-python's own record builder, stored as brokers tier them.

kafka-python writes batches the way a producer does (base offset 0, CreateTime); a broker then sets the
base offset and, for LogAppendTime topics, the timestamp type and max timestamp. `broker_stamp` does the
same to a built batch. Transaction markers (control batches) are something only a broker writes, and
kafka-python cannot build them: those come from tsproxy.kafka.builder. Segments and their offset and time
indexes are assembled by tsproxy.kafka.builder.SegmentBuilder, which indexes like a broker.

`upload_aiven` stores segments in the Aiven RemoteStorageManager layout with the plugin's compression and
encryption off: the `.log` byte for byte, the `.indexes` object and the `.rsm-manifest` JSON. A segment
holding an abort marker gets a transaction index, as a broker writes it, in both layouts.
"""

from __future__ import annotations

import base64
import struct
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from awscrt.checksums import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

from tsproxy.kafka.builder import SegmentBuilder, build_control_batch, build_indexes_object, encode_txn_index
from tsproxy.kafka.layout import aiven_segment_key, logdir_segment_key
from tsproxy.kafka.manifest import plain_manifest

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
# (offset, timestamp, timestampType, key, value, headers): what the source returns for a record.
Row = tuple[int, int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


def kafka_uuid() -> str:
    """A random Kafka UUID as Kafka prints it (22 characters of URL-safe base64)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def broker_stamp(batch: bytearray, base_offset: int, *, log_append_time: int | None = None) -> bytes:
    """What a broker does to a producer's batch: set its base offset (and LogAppendTime), fix the CRC."""
    struct.pack_into(">q", batch, 0, base_offset)
    if log_append_time is not None:
        attributes = struct.unpack_from(">h", batch, 21)[0] | 0x08
        struct.pack_into(">h", batch, 21, attributes)
        struct.pack_into(">q", batch, 35, log_append_time)
        struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


def producer_batch(
    rows: Sequence[tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
    codec: str,
    *,
    transactional: bool = False,
    producer_id: int = -1,
    producer_epoch: int = -1,
) -> bytearray:
    """A batch from kafka-python's builder: rows are (timestamp, key, value, headers), offsets 0..n-1."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=CODECS[codec],
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=0 if producer_id >= 0 else -1,
        batch_size=1 << 30,
    )
    for delta, (timestamp, key, value, headers) in enumerate(rows):
        builder.append(delta, timestamp=timestamp, key=key, value=value, headers=list(headers))
    return builder.build()


@dataclass
class BuiltSegment:
    """One segment: its bytes, its indexes, and the records a reader should get from it."""

    topic: str
    partition: int
    base_offset: int
    data: bytes
    offset_index: bytes
    time_index: bytes
    next_offset: int  # the offset after this segment's last batch (control batches included)
    rows: list[Row] = field(default_factory=list)
    segment_id: str = field(default_factory=kafka_uuid)
    # (producer id, first offset, marker offset) of each transaction aborted in this segment
    aborted: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def txn_index(self) -> bytes | None:
        return encode_txn_index(self.aborted) if self.aborted else None


class PartitionWriter:
    """Builds the segments of one partition: offsets continue from segment to segment."""

    def __init__(
        self, topic: str, partition: int, *, start_offset: int = 0, index_interval: int = 1024
    ) -> None:
        self.topic, self.partition = topic, partition
        self.offset = start_offset
        self.index_interval = index_interval
        self.segments: list[BuiltSegment] = []
        self._builder: SegmentBuilder | None = None
        self._rows: list[Row] = []
        self._base = start_offset
        # Every record in offset order, transaction markers too: (offset, timestamp, is_marker).
        self.timeline: list[tuple[int, int, bool]] = []
        self._open: dict[int, list[int]] = {}  # producer id -> offsets of its open transaction
        self._aborted: list[tuple[int, int, int]] = []  # aborted in the current segment
        self.aborted_offsets: set[int] = set()  # every record offset of an aborted transaction

    def _current(self) -> SegmentBuilder:
        if self._builder is None:
            self._builder = SegmentBuilder(self.offset, index_interval_bytes=self.index_interval)
            self._base, self._rows = self.offset, []
        return self._builder

    def batch(
        self,
        rows: Sequence[tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
        *,
        codec: str = "none",
        log_append_time: int | None = None,
        transactional: bool = False,
        producer_id: int = -1,
    ) -> None:
        """Append a producer batch (records get the next offsets)."""
        built = producer_batch(
            rows, codec, transactional=transactional, producer_id=producer_id,
            producer_epoch=0 if producer_id >= 0 else -1,
        )  # fmt: skip
        stamped = broker_stamp(built, self.offset, log_append_time=log_append_time)
        self._current().append(stamped)
        for delta, (timestamp, key, value, headers) in enumerate(rows):
            ts, ts_type = (log_append_time, 1) if log_append_time is not None else (timestamp, 0)
            self._rows.append((self.offset + delta, ts, ts_type, key, value, tuple(headers)))
            self.timeline.append((self.offset + delta, ts, False))
            if transactional:
                self._open.setdefault(producer_id, []).append(self.offset + delta)
        self.offset += len(rows)

    def marker(self, *, commit: bool, producer_id: int, timestamp: int) -> None:
        """A transaction marker (control batch); it takes an offset but is not a record for readers."""
        self._current().append(
            build_control_batch(
                self.offset, commit=commit, producer_id=producer_id, producer_epoch=0, timestamp=timestamp
            )
        )
        self.timeline.append((self.offset, timestamp, True))
        offsets = self._open.pop(producer_id, [])
        if not commit and offsets:
            self._aborted.append((producer_id, offsets[0], self.offset))
            self.aborted_offsets.update(offsets)
        self.offset += 1

    def roll(self) -> BuiltSegment:
        """Close the current segment (as a broker rolls it) and start a new one at the next batch."""
        builder = self._current()
        builder.close()
        seg = BuiltSegment(
            self.topic, self.partition, self._base, builder.segment, builder.offset_index,
            builder.time_index, self.offset, self._rows, aborted=self._aborted,
        )  # fmt: skip
        self.segments.append(seg)
        self._builder = None
        self._aborted = []
        return seg


def upload_aiven(
    client: Any, bucket: str, prefix: str, segments: Iterable[BuiltSegment], topic_id: str
) -> list[str]:
    """Store segments as the Aiven plugin does (compression and encryption off); returns the .log keys."""
    keys = []
    for seg in segments:

        def key(suffix: str, seg: BuiltSegment = seg) -> str:
            return aiven_segment_key(
                prefix, seg.topic, topic_id, seg.partition, seg.base_offset, seg.segment_id, suffix
            )

        indexes, ranges = build_indexes_object(seg.offset_index, seg.time_index, transaction=seg.txn_index)
        manifest = plain_manifest(len(seg.data), index_ranges=ranges)
        client.put_object(Bucket=bucket, Key=key("log"), Body=seg.data)
        client.put_object(Bucket=bucket, Key=key("indexes"), Body=indexes)
        client.put_object(Bucket=bucket, Key=key("rsm-manifest"), Body=manifest.to_json())
        keys.append(key("log"))
    return keys


def upload_logdir(client: Any, bucket: str, prefix: str, segments: Iterable[BuiltSegment]) -> None:
    """Store segments as a copied broker log directory (.log, .index, .timeindex, .txnindex if any)."""
    for seg in segments:
        files = [("log", seg.data), ("index", seg.offset_index), ("timeindex", seg.time_index)]
        if seg.txn_index is not None:
            files.append(("txnindex", seg.txn_index))
        for suffix, body in files:
            k = logdir_segment_key(prefix, seg.topic, seg.partition, seg.base_offset, suffix)
            client.put_object(Bucket=bucket, Key=k, Body=body)
