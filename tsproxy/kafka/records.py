"""Kafka log segments: record batches of format v2 (magic 2) read directly from bytes.

A segment (``.log`` file or tiered ``.log`` object) is a sequence of record batches, each a 61-byte
header then its records (big-endian; position: size field)::

     0: 8 base offset              27: 8 base timestamp
     8: 4 length (from byte 12 on) 35: 8 max timestamp
    12: 4 partition leader epoch   43: 8 producer id
    16: 1 magic (2)                51: 2 producer epoch
    17: 4 CRC-32C of bytes 21..end 53: 4 base sequence
    21: 2 attributes               57: 4 records count
    23: 4 last offset delta        61: records (one compressed stream when the codec is not 0)

Attributes: bits 0-2 codec, bit 3 timestamp type (1 = LogAppendTime), bit 4 transactional, bit 5 control.

Each record is ``length, attributes, timestamp delta, offset delta, key, value, headers`` with zigzag
varints. The reader trusts nothing it has not checked: the header's length must fit the data and the
CRC-32C must match before the records are looked at, and every record must end exactly where its
length says. Corruption raises :class:`CorruptRecordError` naming the object and the batch's byte
position, or, with ``skip_corrupt``, is counted and skipped: the reader goes on at the next intact batch
(found by the batch's own length when its CRC vouches for it, else by scanning for a header whose CRC
checks out).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from awscrt.checksums import crc32c

from .codecs import CODEC_NAMES, CODEC_NONE, CodecDataError, decompress
from .errors import CorruptRecordError
from .indexes import AbortedRanges

# One struct for the whole 61-byte header; field positions named for single-field reads.
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
LOG_OVERHEAD = 12  # base offset + length: the bytes in front of what "length" counts
BATCH_OVERHEAD = BATCH_HEADER.size  # 61
MIN_BATCH_LENGTH = BATCH_OVERHEAD - LOG_OVERHEAD  # 49, an empty batch
LENGTH_OFFSET = 8
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21  # the CRC covers from here to the end of the batch
RECORDS_OFFSET = 61
_LENGTH = struct.Struct(">i")
_CRC = struct.Struct(">I")

MAGIC_V2 = 2
CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
CREATE_TIME = 0
LOG_APPEND_TIME = 1

# Smallest possible record: 1-byte varints for length, timestamp, offset, key, value, header count, plus
# the attributes byte. Bounds the record count of an uncompressed batch before decoding it.
MIN_RECORD_SIZE = 7

# Scanning for the next intact batch copies at most this much at a time from a non-bytes buffer.
_SCAN_WINDOW = 1 << 20


@dataclass(frozen=True, slots=True)
class Record:
    """One record, with its absolute offset and its effective timestamp.

    ``timestamp_type`` follows Spark's Kafka source: 0 CreateTime, 1 LogAppendTime (then ``timestamp``
    is the batch's max timestamp, as the broker stamped it).
    """

    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


# A record as a plain tuple in Record's field order: what a Spark data source yields, without the cost
# of building an object per record.
RecordRow = tuple[int, int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed header of a record batch and where the batch sits in its object."""

    base_offset: int
    length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    position: int  # byte position of the batch within the object

    @property
    def codec(self) -> int:
        """Compression codec: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd."""
        return self.attributes & CODEC_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        """A control batch holds transaction markers (commit/abort), not user records."""
        return bool(self.attributes & CONTROL_MASK)

    @property
    def timestamp_type(self) -> int:
        """0 CreateTime, 1 LogAppendTime."""
        return LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_MASK else CREATE_TIME

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def size(self) -> int:
        """Bytes of the whole batch, including the 12-byte log overhead."""
        return self.length + LOG_OVERHEAD


@dataclass
class DecodeStats:
    """Counters a reader fills in as it goes (pass one in, read it afterwards)."""

    batches: int = 0  # intact batches walked, control ones and ones filtered out by offset included
    records: int = 0  # records handed out
    control_batches: int = 0
    corrupt_batches: int = 0  # corrupt stretches skipped with skip_corrupt
    aborted_records: int = 0  # records of aborted transactions left out (``aborted`` given)
    bytes: int = 0  # bytes of the intact batches walked


class _Corrupt(Exception):
    """Internal: this batch is bad; the caller knows its position and adds the object name."""


class _Truncated(_Corrupt):
    """Internal: the data ends inside this batch."""


def iter_batches(
    segment: bytes | bytearray | memoryview,
    *,
    object_name: str = "",
    start_position: int = 0,
    verify_crc: bool = True,
    allow_partial_tail: bool = False,
    skip_corrupt: bool = False,
    stats: DecodeStats | None = None,
    base_position: int = 0,
) -> Iterator[BatchHeader]:
    """Walk the batch headers of a segment without decompressing anything.

    ``start_position`` is where in ``segment`` to begin (a batch boundary, e.g. from the offset index).
    ``base_position`` is where ``segment`` itself begins in its object, for a segment read as a byte
    range: it is added to every reported position. With ``allow_partial_tail`` a batch cut off by the
    end of the data ends the walk quietly (a ranged read), unless an intact batch follows it, which
    proves its length field wrong. ``verify_crc=False`` skips the CRC-32C check of each batch.
    ``skip_corrupt`` counts each damaged stretch in ``stats.corrupt_batches`` and goes on at the next
    intact batch instead of raising CorruptRecordError.
    """
    walker = _Walker(segment, object_name, base_position, verify_crc, skip_corrupt, allow_partial_tail, stats)
    return walker.walk(start_position)


def iter_records(
    segment: bytes | bytearray | memoryview,
    *,
    object_name: str = "",
    start_position: int = 0,
    min_offset: int | None = None,
    max_offset: int | None = None,
    skip_corrupt: bool = False,
    stats: DecodeStats | None = None,
    allow_partial_tail: bool = False,
    include_control: bool = False,
    verify_crc: bool = True,
    base_position: int = 0,
    aborted: AbortedRanges | None = None,
) -> Iterator[Record]:
    """Decode every record of a segment, in offset order.

    Records below ``min_offset`` or above ``max_offset`` (both inclusive) are left out, and batches
    wholly outside that range are never decompressed. Control batches (transaction markers) are skipped
    and counted unless ``include_control``, which yields their records too (key: version int16 + type
    int16, 0 abort / 1 commit). A corrupt batch raises CorruptRecordError, or with ``skip_corrupt`` is
    counted in ``stats.corrupt_batches`` and skipped. With ``aborted`` (the partition's aborted
    transactions), the records of aborted transactions are left out too, as a read_committed consumer
    leaves them out, and counted in ``stats.aborted_records``. Other arguments as for
    :func:`iter_batches`.
    """
    walker = _Walker(segment, object_name, base_position, verify_crc, skip_corrupt, allow_partial_tail, stats)
    return walker.records(Record, start_position, min_offset, max_offset, include_control, aborted)


def iter_rows(
    segment: bytes | bytearray | memoryview,
    *,
    object_name: str = "",
    start_position: int = 0,
    min_offset: int | None = None,
    max_offset: int | None = None,
    skip_corrupt: bool = False,
    stats: DecodeStats | None = None,
    allow_partial_tail: bool = False,
    include_control: bool = False,
    verify_crc: bool = True,
    base_position: int = 0,
    aborted: AbortedRanges | None = None,
) -> Iterator[RecordRow]:
    """Like :func:`iter_records`, but each record is a plain tuple in Record's field order (faster)."""
    walker = _Walker(segment, object_name, base_position, verify_crc, skip_corrupt, allow_partial_tail, stats)
    return walker.records(None, start_position, min_offset, max_offset, include_control, aborted)


def decode_batch(
    segment: bytes | bytearray | memoryview,
    position: int,
    *,
    object_name: str = "",
    verify_crc: bool = True,
    base_position: int = 0,
) -> tuple[BatchHeader, list[Record]]:
    """Decode the one batch that starts at ``position`` in ``segment`` (a control batch too)."""
    walker = _Walker(segment, object_name, base_position, verify_crc, False, False, None)
    try:
        header = walker.read_header(position)
    except _Corrupt as exc:
        raise CorruptRecordError(object_name, base_position + position, str(exc)) from None
    return header, walker.decode(header, Record, _MIN_OFFSET, _MAX_OFFSET)


def is_aborted(header: BatchHeader, aborted: AbortedRanges) -> bool:
    """Whether a batch holds records of an aborted transaction (never true of a control batch)."""
    return (
        header.is_transactional
        and not header.is_control
        and aborted.covers(header.producer_id, header.base_offset)
    )


def _in_range(header: BatchHeader, low: int, high: int) -> int:
    # Records of the batch with offsets in [low, high]: exact for a batch wholly inside, else counted
    # as if its offsets were dense (an upper bound for a compacted batch).
    if low <= header.base_offset and header.last_offset <= high:
        return header.records_count
    return max(0, min(header.last_offset, high) - max(header.base_offset, low) + 1)


_MIN_OFFSET = -(1 << 63)
_MAX_OFFSET = (1 << 63) - 1


class _Walker:
    """Finds the batches of one buffer and decodes their records; holds what every step needs."""

    def __init__(
        self,
        segment: bytes | bytearray | memoryview,
        object_name: str,
        base_position: int,
        verify_crc: bool,
        skip_corrupt: bool,
        allow_partial_tail: bool,
        stats: DecodeStats | None,
    ) -> None:
        # Indexing and slicing ``bytes`` is the fastest way to read records, so bytes input is used as
        # it is; any other buffer is copied once per batch (then every key and value is a slice of it).
        self.raw = segment if isinstance(segment, bytes) else None
        self.view = memoryview(segment).cast("B")
        self.end = len(self.view)
        self.object_name = object_name
        self.base_position = base_position
        self.verify_crc = verify_crc
        self.skip_corrupt = skip_corrupt
        self.allow_partial_tail = allow_partial_tail
        self.stats = stats if stats is not None else DecodeStats()

    def walk(self, pos: int) -> Iterator[BatchHeader]:
        """Yield the header of every intact batch from ``pos`` on, dealing with corrupt ones."""
        end, stats = self.end, self.stats
        if not 0 <= pos <= end:
            raise ValueError(f"start position {pos} is outside the {end} bytes of data")
        while pos < end:
            try:
                header = self.read_header(pos)
            except _Corrupt as exc:
                pos = self._recover(pos, exc)
                continue
            stats.batches += 1
            stats.bytes += header.size
            yield header
            pos += header.size

    def records(
        self,
        make: Callable[..., Any] | None,
        start: int,
        min_offset: int | None,
        max_offset: int | None,
        include_control: bool,
        aborted: AbortedRanges | None = None,
    ) -> Iterator[Any]:
        stats = self.stats
        low = _MIN_OFFSET if min_offset is None else min_offset
        high = _MAX_OFFSET if max_offset is None else max_offset
        for header in self.walk(start):
            if header.is_control:
                stats.control_batches += 1
                if not include_control:
                    continue
            if header.base_offset + header.last_offset_delta < low:
                continue
            if header.base_offset > high:
                return  # offsets only grow along a segment
            if aborted and is_aborted(header, aborted):
                stats.aborted_records += _in_range(header, low, high)
                continue
            try:
                records = self.decode(header, make, low, high)
            except CorruptRecordError:
                if not self.skip_corrupt:
                    raise
                stats.corrupt_batches += 1
                continue
            stats.records += len(records)
            yield from records

    def read_header(self, pos: int) -> BatchHeader:
        """The header of the batch at ``pos``, its magic, length, bounds and CRC checked."""
        view, left = self.view, self.end - pos
        if left < BATCH_OVERHEAD:
            # Judge what is there before calling it a cut-off batch.
            if left > MAGIC_OFFSET and view[pos + MAGIC_OFFSET] != MAGIC_V2:
                raise _Corrupt(f"magic byte is {view[pos + MAGIC_OFFSET]}, expected {MAGIC_V2}")
            if left >= LOG_OVERHEAD and _LENGTH.unpack_from(view, pos + LENGTH_OFFSET)[0] < MIN_BATCH_LENGTH:
                raise _Corrupt(f"batch length below the minimum {MIN_BATCH_LENGTH}")
            raise _Truncated(f"only {left} bytes left, a batch header needs {BATCH_OVERHEAD}")
        fields = BATCH_HEADER.unpack_from(view, pos)
        (base_offset, length, leader_epoch, magic, crc, attributes, last_offset_delta, base_timestamp,
         max_timestamp, producer_id, producer_epoch, base_sequence, records_count) = fields  # fmt: skip
        if magic != MAGIC_V2:
            hint = " (message format v0/v1 is not supported)" if magic in (0, 1) else ""
            raise _Corrupt(f"magic byte is {magic}, expected {MAGIC_V2}{hint}")
        if length < MIN_BATCH_LENGTH:
            raise _Corrupt(f"batch length {length} is below the minimum {MIN_BATCH_LENGTH}")
        if length + LOG_OVERHEAD > left:
            raise _Truncated(f"batch of {length + LOG_OVERHEAD} bytes runs past the end ({left} bytes left)")
        if self.verify_crc:
            actual = crc32c(view[pos + ATTRIBUTES_OFFSET : pos + LOG_OVERHEAD + length])
            if actual != crc:
                raise _Corrupt(f"CRC-32C mismatch: stored {crc:#010x}, computed {actual:#010x}")
        if last_offset_delta < 0 or records_count < 0:
            raise _Corrupt(
                f"negative last offset delta ({last_offset_delta}) or records count ({records_count})"
            )
        return BatchHeader(
            base_offset, length, leader_epoch, magic, crc, attributes, last_offset_delta, base_timestamp,
            max_timestamp, producer_id, producer_epoch, base_sequence, records_count,
            self.base_position + pos,
        )  # fmt: skip

    def _recover(self, pos: int, exc: _Corrupt) -> int:
        """Decide what a bad batch at ``pos`` means: raise, or return where to go on (``end`` stops)."""
        if isinstance(exc, _Truncated) and self.allow_partial_tail:
            following = self._scan(pos + 1)
            if following == self.end:
                return self.end  # a batch cut off by the end of a ranged read
            exc = _Corrupt(f"{exc}, yet an intact batch follows at byte {self.base_position + following}")
        elif self._zero_tail(pos):
            return self.end  # the unused rest of a preallocated segment file
        if not self.skip_corrupt:
            raise CorruptRecordError(self.object_name, self.base_position + pos, str(exc)) from None
        self.stats.corrupt_batches += 1
        # Trust the length field if it leads exactly to the end or to an intact batch, so that a bad bit
        # in a batch's body does not make us rescan the bytes of its records.
        length = (
            _LENGTH.unpack_from(self.view, pos + LENGTH_OFFSET)[0] if self.end - pos >= LOG_OVERHEAD else -1
        )
        after = pos + LOG_OVERHEAD + length
        if length >= MIN_BATCH_LENGTH and (after == self.end or (after < self.end and self._intact(after))):
            return after
        return self._scan(pos + 1)

    def _zero_tail(self, pos: int) -> bool:
        # Twelve zero bytes or more cannot start a batch (its length would be 0), while a shorter run
        # may be the start of a cut-off batch with a small base offset.
        if self.end - pos < LOG_OVERHEAD:
            return False
        rest = self.raw[pos:] if self.raw is not None else self.view[pos:].tobytes()
        return not rest.strip(b"\x00")

    def _intact(self, pos: int) -> bool:
        """True if a batch with a plausible header and a matching CRC starts at ``pos``."""
        view = self.view
        if pos < 0 or self.end - pos < BATCH_OVERHEAD or view[pos + MAGIC_OFFSET] != MAGIC_V2:
            return False
        (length,) = _LENGTH.unpack_from(view, pos + LENGTH_OFFSET)
        if length < MIN_BATCH_LENGTH or pos + LOG_OVERHEAD + length > self.end:
            return False
        (stored,) = _CRC.unpack_from(view, pos + CRC_OFFSET)
        return bool(crc32c(view[pos + ATTRIBUTES_OFFSET : pos + LOG_OVERHEAD + length]) == stored)

    def _scan(self, pos: int) -> int:
        """Position of the first intact batch at or after ``pos``, or ``end`` if there is none."""
        end, magic = self.end, bytes([MAGIC_V2])
        at = pos + MAGIC_OFFSET  # find a magic byte, then check the header around it
        while at < end:
            if self.raw is not None:
                found = self.raw.find(magic, at)
            else:
                window = min(end, at + _SCAN_WINDOW)
                hit = self.view[at:window].tobytes().find(magic)
                if hit < 0:
                    at = window
                    continue
                found = at + hit
            if found < 0:
                break
            if self._intact(found - MAGIC_OFFSET):
                return found - MAGIC_OFFSET
            at = found + 1
        return end

    def decode(self, header: BatchHeader, make: Callable[..., Any] | None, low: int, high: int) -> list[Any]:
        """The records of a checked batch with offsets in [low, high], each ``make(*Record fields)``."""
        local = header.position - self.base_position
        body_start, body_end = local + RECORDS_OFFSET, local + header.size
        codec = header.codec
        try:
            if codec == CODEC_NONE:
                if header.records_count * MIN_RECORD_SIZE > body_end - body_start:
                    raise _Corrupt(
                        f"{header.records_count} records cannot fit in {body_end - body_start} bytes"
                    )
                if self.raw is not None:
                    data, start, stop = self.raw, body_start, body_end
                else:
                    data, start, stop = self.view[body_start:body_end].tobytes(), 0, body_end - body_start
            elif codec in CODEC_NAMES:
                try:
                    data = decompress(codec, self.view[body_start:body_end])
                except CodecDataError as exc:
                    raise _Corrupt(f"{CODEC_NAMES[codec]} body does not decompress: {exc}") from None
                start, stop = 0, len(data)
            else:
                raise _Corrupt(f"unknown compression codec {codec}")
            return _decode_records(data, start, stop, header, make, low, high)
        except _Corrupt as exc:
            raise CorruptRecordError(self.object_name, header.position, str(exc)) from None


def _decode_records(
    data: bytes, pos: int, end: int, header: BatchHeader, make: Callable[..., Any] | None, low: int, high: int
) -> list[Any]:
    """Decode ``header.records_count`` records from ``data[pos:end]``, which they must fill exactly.

    This is the hot loop of every export, so varints are decoded inline: one or two bytes hold the
    zigzag values -8192..8191, which covers deltas and lengths of most records; longer ones go through
    ``_varint``. Records outside [low, high] are checked but left out. ``make`` builds each record from
    Record's fields; None means a plain tuple, the fastest.
    """
    out: list[Any] = []
    append = out.append
    varint = _varint
    base_offset = header.base_offset
    ts_type = header.timestamp_type
    log_append = ts_type == LOG_APPEND_TIME
    base_ts = header.max_timestamp if log_append else header.base_timestamp
    first = record_at = pos
    index = 0
    try:
        for index in range(header.records_count):  # noqa: B007 (named in error messages)
            record_at = pos
            b = data[pos]  # record length
            if b < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | (data[pos + 1] << 7)
                pos += 2
            else:
                b, pos = varint(data, pos, 32)
            length = (b >> 1) ^ -(b & 1)
            record_end = pos + length
            if length < MIN_RECORD_SIZE - 1 or record_end > end:
                raise _Corrupt(f"length {length} does not fit")
            pos += 1  # record attributes: unused in format v2
            b = data[pos]  # timestamp delta, a varlong
            if b < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | (data[pos + 1] << 7)
                pos += 2
            else:
                b, pos = varint(data, pos, 64)
            timestamp = base_ts if log_append else base_ts + ((b >> 1) ^ -(b & 1))
            b = data[pos]  # offset delta
            if b < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | (data[pos + 1] << 7)
                pos += 2
            else:
                b, pos = varint(data, pos, 32)
            offset = base_offset + ((b >> 1) ^ -(b & 1))
            b = data[pos]  # key
            if b < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | (data[pos + 1] << 7)
                pos += 2
            else:
                b, pos = varint(data, pos, 32)
            size = (b >> 1) ^ -(b & 1)
            key: bytes | None = None
            if size >= 0:
                if pos + size > record_end:
                    raise _Corrupt(f"key of {size} bytes overruns the record")
                key = data[pos : pos + size]
                pos += size
            elif size != -1:
                raise _Corrupt(f"key length {size}")
            b = data[pos]  # value
            if b < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | (data[pos + 1] << 7)
                pos += 2
            else:
                b, pos = varint(data, pos, 32)
            size = (b >> 1) ^ -(b & 1)
            value: bytes | None = None
            if size >= 0:
                if pos + size > record_end:
                    raise _Corrupt(f"value of {size} bytes overruns the record")
                value = data[pos : pos + size]
                pos += size
            elif size != -1:
                raise _Corrupt(f"value length {size}")
            headers: tuple[tuple[str, bytes | None], ...] = ()
            if data[pos] == 0:  # no headers, the common case
                pos += 1
            else:
                headers, pos = _decode_headers(data, pos, record_end)
            if pos != record_end:
                raise _Corrupt(
                    f"fields end at byte {pos - record_at}, the length says {record_end - record_at}"
                )
            if low <= offset <= high:
                if make is None:
                    append((offset, timestamp, ts_type, key, value, headers))
                else:
                    append(make(offset, timestamp, ts_type, key, value, headers))
    except IndexError:
        raise _Corrupt(
            f"record {index} (byte {record_at - first} of the records) runs past the data"
        ) from None
    except _Corrupt as exc:
        raise _Corrupt(f"record {index} (byte {record_at - first} of the records): {exc}") from None
    if pos != end:
        raise _Corrupt(f"{end - pos} stray bytes after the last of {header.records_count} records")
    return out


def _decode_headers(
    data: bytes, pos: int, record_end: int
) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    count, pos = _signed_varint(data, pos, 32)
    if count < 0 or 2 * count > record_end - pos:  # a header takes two bytes at least
        raise _Corrupt(f"header count {count} does not fit")
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        size, pos = _signed_varint(data, pos, 32)
        if size < 0 or pos + size > record_end:
            raise _Corrupt(f"header key length {size} does not fit")
        try:
            name = data[pos : pos + size].decode("utf-8")
        except UnicodeDecodeError:
            raise _Corrupt("header key is not UTF-8") from None
        pos += size
        size, pos = _signed_varint(data, pos, 32)
        if size >= 0:
            if pos + size > record_end:
                raise _Corrupt(f"header value of {size} bytes overruns the record")
            headers.append((name, data[pos : pos + size]))
            pos += size
        elif size == -1:
            headers.append((name, None))
        else:
            raise _Corrupt(f"header value length {size}")
    return tuple(headers), pos


def _varint(data: bytes, pos: int, bits: int) -> tuple[int, int]:
    """The raw (still zigzag-encoded) varint of at most ``bits`` bits at ``pos``, and the next position."""
    result = shift = 0
    limit = pos + (bits + 6) // 7
    while pos < limit:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result >> bits:
                raise _Corrupt(f"varint overflows {bits} bits")
            return result, pos
        shift += 7
    raise _Corrupt(f"varint longer than {(bits + 6) // 7} bytes")


def _signed_varint(data: bytes, pos: int, bits: int) -> tuple[int, int]:
    b = data[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    b, pos = _varint(data, pos, bits)
    return (b >> 1) ^ -(b & 1), pos
