"""Reading one planned piece: stream its bytes, cut them at batch boundaries, decode, filter, to Arrow.

Memory stays at about REGION_BYTES plus the largest batch, whatever the size of the piece: bytes are
decoded as they arrive, a region of whole batches at a time, and the cut-off batch at the end of a
region waits for the next bytes.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from tsproxy.kafka.errors import CorruptRecordError
from tsproxy.kafka.indexes import AbortedRanges
from tsproxy.kafka.records import (
    LOG_OVERHEAD,
    MIN_BATCH_LENGTH,
    DecodeStats,
    RecordRow,
    decode_batch,
    is_aborted,
    iter_batches,
    iter_rows,
)

from .arrow import rows_to_batch
from .bucket import Bucket
from .planning import Piece
from .prefetch import ReadAhead

log = logging.getLogger(__name__)

REGION_BYTES = 8 << 20  # decode once this much is buffered
ROWS_PER_BATCH = 32768  # Arrow batch size handed to Spark / the Parquet writer ...
MAX_ARROW_BATCH_BYTES = 16 << 20  # ... or less, when keys and values are large
MAX_BATCH_BYTES = 1 << 30  # a larger length field is corruption (Kafka's segments are at most 1 GiB)
_LENGTH = struct.Struct(">i")
_BASE = struct.Struct(">q")


@dataclass
class _TimeFilter:
    """Per-piece state of the timestamp bounds (see Piece): started once, stopped once.

    Like Kafka's offsetsForTimes, transaction markers count when finding the first record at or after a
    timestamp, though they are never returned; so are records outside the offset bounds (an end found
    before the start offset means an empty range).
    """

    skip_until_ts: int | None
    stop_at_ts: int | None
    min_offset: int | None
    max_offset: int | None
    started: bool = False
    stopped: bool = False

    def apply(self, records: Iterable[tuple[RecordRow, bool]]) -> list[RecordRow]:
        """The rows to keep of (row, is_control) pairs, in offset order."""
        kept: list[RecordRow] = []
        if self.stopped:
            return kept
        low = self.min_offset if self.min_offset is not None else -1
        high = self.max_offset if self.max_offset is not None else 1 << 63
        for row, control in records:
            ts = row[1]
            if self.stop_at_ts is not None and ts >= self.stop_at_ts:
                self.stopped = True
                break
            if not self.started and (self.skip_until_ts is None or ts >= self.skip_until_ts):
                self.started = True
            if self.started and not control and low <= row[0] <= high:
                kept.append(row)
        return kept


def _with_markers(
    data: bytes,
    position: int,
    name: str,
    skip_corrupt: bool,
    stats: DecodeStats,
    aborted: AbortedRanges | None = None,
) -> Iterator[tuple[RecordRow, bool]]:
    """Every record of whole batches, flagged when it is not to be returned: transaction markers and
    (with ``aborted``) records of aborted transactions. The slower path."""
    for header in iter_batches(
        data, object_name=name, base_position=position, skip_corrupt=skip_corrupt, stats=stats
    ):
        try:
            _, records = decode_batch(
                data, header.position - position, object_name=name, base_position=position, verify_crc=False
            )
        except CorruptRecordError:
            if not skip_corrupt:
                raise
            stats.corrupt_batches += 1
            continue
        if header.is_control:
            stats.control_batches += 1
        hidden = header.is_control
        if aborted and is_aborted(header, aborted):
            stats.aborted_records += len(records)
            hidden = True
        for r in records:
            yield (r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers), hidden


def whole_batches(buf: bytes | bytearray | memoryview) -> tuple[int, str | None]:
    """How many leading bytes of buf are whole record batches, by their length fields.

    The second value is a reason when the batch after them has an impossible length (corruption).
    """
    pos, end = 0, len(buf)
    while pos + LOG_OVERHEAD <= end:
        length = _LENGTH.unpack_from(buf, pos + 8)[0]
        if length < MIN_BATCH_LENGTH or length > MAX_BATCH_BYTES:
            return pos, f"batch length {length} is impossible"
        if pos + LOG_OVERHEAD + length > end:
            break
        pos += LOG_OVERHEAD + length
    return pos, None


def piece_rows(
    bucket: Bucket, piece: Piece, *, skip_corrupt: bool = False, stats: DecodeStats | None = None
) -> Iterator[list[RecordRow]]:
    """The records of a piece that pass its offset and timestamp filters, a region at a time."""
    stats = stats if stats is not None else DecodeStats()
    times = _TimeFilter(piece.skip_until_ts, piece.stop_at_ts, piece.min_offset, piece.max_offset)
    name = bucket.uri(piece.key)
    aborted = AbortedRanges(piece.aborted) if piece.aborted else None
    buf = bytearray()
    buf_pos = piece.first  # object position of buf[0]

    def decode(data: bytes, position: int) -> list[RecordRow]:
        if piece.skip_until_ts is not None or piece.stop_at_ts is not None:
            # At most two pieces of a partition hold a timestamp bound: they take the slower path.
            kept = times.apply(_with_markers(data, position, name, skip_corrupt, stats, aborted))
            stats.records += len(kept)
            return kept
        return list(
            iter_rows(
                data,
                object_name=name,
                base_position=position,
                min_offset=piece.min_offset,
                max_offset=piece.max_offset,
                skip_corrupt=skip_corrupt,
                stats=stats,
                aborted=aborted,
            )
        )

    stream = ReadAhead(bucket.stream(piece.key, piece.first, piece.end, stored_size=piece.size))
    with closing(stream):
        try:
            yield from _regions(iter(stream), buf, buf_pos, piece, name, decode, times, skip_corrupt)
        except CorruptRecordError as e:
            if e.offset != 0:
                raise
            # Garbage from the first byte on: most likely not a segment as Kafka wrote it.
            hint = "; not a plain Kafka segment (stored with the plugin's compression or encryption?)"
            raise CorruptRecordError(e.object_name, e.offset, e.reason + hint) from None


def _regions(
    stream: Iterator[bytes],
    buf: bytearray,
    buf_pos: int,
    piece: Piece,
    name: str,
    decode: Callable[[bytes, int], list[RecordRow]],
    times: _TimeFilter,
    skip_corrupt: bool,
) -> Iterator[list[RecordRow]]:
    slurp = False  # after an impossible length with skip_corrupt: decode the rest in one go at the end
    for data in stream:
        buf += data
        if slurp or len(buf) < REGION_BYTES:
            continue
        cut, bad = whole_batches(buf)
        if bad is not None and cut == 0:
            if not skip_corrupt:
                raise CorruptRecordError(name, buf_pos, bad)
            slurp = True
            continue
        if cut == 0:
            continue  # one batch larger than a region: wait for the rest of it
        rows = decode(bytes(buf[:cut]), buf_pos)
        del buf[:cut]
        buf_pos += cut
        if rows:
            yield rows
        if times.stopped or _past_max(buf, piece):
            return
    if buf:
        # The end of the piece is a batch boundary (from the index) or the end of the object, so
        # anything cut off here is a truncated segment: the decoder reports it (or skips it).
        rows = decode(bytes(buf), buf_pos)
        if rows:
            yield rows


def _past_max(rest: bytearray, piece: Piece) -> bool:
    # Offsets only grow within a segment: once the next batch starts past max_offset, stop reading.
    return piece.max_offset is not None and len(rest) >= 8 and _BASE.unpack_from(rest)[0] > piece.max_offset


def _payload_sizes(table: pa.Table) -> pa.ChunkedArray:
    lengths = [pc.fill_null(pc.binary_length(table.column(name)), 0) for name in ("key", "value")]
    return pc.add(lengths[0], lengths[1])


def _cut(table: pa.Table, rows_per_batch: int, max_bytes: int) -> int | None:
    """Rows of the next batch to hand out, or None while the pending rows make no full batch.

    A batch ends at rows_per_batch rows or before the row that takes its keys and values past
    max_bytes (one row at least). The cut depends on the rows alone, not on how the bytes arrived, so
    the batches (and so the Parquet row groups of an export) are the same on every run.
    """
    n = table.num_rows
    if n == 0:
        return None
    over = pc.index(pc.greater(pc.cumulative_sum(_payload_sizes(table)), max_bytes), True).as_py()
    if over is not None and over >= 0:
        return min(max(over, 1), rows_per_batch)
    return rows_per_batch if n >= rows_per_batch else None


def read_piece(
    bucket: Bucket,
    piece: Piece,
    *,
    include_headers: bool,
    skip_corrupt: bool = False,
    timestamp_unit: str = "us",
    stats: DecodeStats | None = None,
    rows_per_batch: int = ROWS_PER_BATCH,
    max_batch_bytes: int = MAX_ARROW_BATCH_BYTES,
) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of a piece's records, in offset order, bounded in rows and bytes.

    With skip_corrupt, a read that skipped anything says so in one warning (the executor's log); the
    count is in `stats` too.
    """
    stats = stats if stats is not None else DecodeStats()
    skipped_before = stats.corrupt_batches
    pending: pa.Table | None = None
    for rows in piece_rows(bucket, piece, skip_corrupt=skip_corrupt, stats=stats):
        batch = rows_to_batch(
            rows, piece.topic, piece.partition, include_headers=include_headers, timestamp_unit=timestamp_unit
        )
        new = pa.Table.from_batches([batch])
        pending = new if pending is None else pa.concat_tables([pending, new])
        while (cut := _cut(pending, rows_per_batch, max_batch_bytes)) is not None:
            yield _one_batch(pending.slice(0, cut))
            pending = pending.slice(cut)
    if pending is not None and pending.num_rows:
        yield _one_batch(pending)
    skipped = stats.corrupt_batches - skipped_before
    if skipped:
        span = f"{piece.first}..{'end' if piece.end is None else piece.end}"
        log.warning(
            "tsproxy: skipped %d corrupt stretch%s of record batches in %s (bytes %s, skipCorrupt)",
            skipped, "" if skipped == 1 else "es", bucket.uri(piece.key), span,
        )  # fmt: skip


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    # One contiguous batch whatever regions the rows came from: same batches, same row groups.
    batch: pa.RecordBatch = table.combine_chunks().to_batches()[0]
    return batch
