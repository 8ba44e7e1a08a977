"""The size catalog: what each tsproxy instance wrote, so a listing needs no HEAD per object. Pure, no I/O.

A backend listing knows each object's stored size and backend ETag, but a client must see the original
size and the ETag it was given. Each instance therefore appends a `CatalogRecord` per object it writes
to small immutable catalog objects in the reserved namespace; a listing loads them and answers from a
record only when the record's backend ETag and stored size are what the backend's own listing says of
that key right now. Anything else (an overwrite by a writer that has not flushed yet, a passthrough
object, a record lost in a crash) does not match and falls back to a HEAD, so correctness never rests on
the catalog: it only saves requests.

Bytes of a catalog object (docs/FORMAT.md, "Size catalog"):

    magic "TSPC" | u8 version (2; 1 is still read) | u8 flags (bit 0: body is one zstd frame)
    | varint record count | body | u32 CRC-32 (zlib) of everything before it

body: the records, each

    text key | text backend ETag | varint stored size | varint original size
    | text client ETag | varint last-modified (milliseconds since the epoch)
    | u8 record flags (version 2 only; bit 0: what a HEAD shows follows, bit 1: with a content type)
    | [text content type] | map user metadata | map stored headers   (only with bit 0)

with texts as varint length + UTF-8 and maps as a count then sorted key and value texts (see
wire.py); the key is the client's key in its bucket. What a HEAD shows (content type, user metadata,
headers kept with the object) lets an instance answer a HEAD with a backend HEAD instead of reading
the object's tail, when the backend's answer matches the record as a listing's must. A record
with an empty backend ETag is a tombstone: the key was deleted through tsproxy at that time, and its
records written before then are dead. The CRC catches torn or damaged objects. The catalog is not
authenticated, which is safe because a record is only ever used together with the backend's listing and
never for reading data (GETs use the object's own authenticated manifest).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import zstandard

from tsproxy.errors import IntegrityError
from tsproxy.format.wire import Reader, Writer

MAGIC = b"TSPC"
VERSION = 2
READABLE_VERSIONS = (1, 2)
FLAG_ZSTD = 0x01
RECORD_HEAD = 0x01  # record flags: the HEAD facts follow
RECORD_CONTENT_TYPE = 0x02  # ... with a content type
_CRC = struct.Struct(">I")
# Compress bodies above this size: a handful of records is smaller raw than framed.
COMPRESS_ABOVE = 512
# No catalog object may claim to expand beyond this (a hostile frame header cannot make us allocate more).
MAX_BODY = 1 << 30


@dataclass(frozen=True, slots=True)
class HeadFacts:
    """What a HEAD shows of an object besides its size, ETag and date (all of it from the manifest)."""

    content_type: str | None
    metadata: tuple[tuple[str, str], ...] = ()  # the client's x-amz-meta-*, sorted by name
    headers: tuple[tuple[str, str], ...] = ()  # other headers kept with the object, sorted by name

    @classmethod
    def of(
        cls, content_type: str | None, metadata: Mapping[str, str], headers: Mapping[str, str]
    ) -> HeadFacts:
        if content_type is None and not metadata and not headers:
            return NO_EXTRAS
        return cls(content_type, tuple(sorted(metadata.items())), tuple(sorted(headers.items())))


NO_EXTRAS = HeadFacts(None)  # the usual case for segments: one shared instance


@dataclass(frozen=True, slots=True)
class CatalogRecord:
    """What one write left in the backend: enough to list it as the client wrote it, and to HEAD it."""

    key: str  # the client's key, in the client bucket the catalog belongs to
    backend_etag: str  # unquoted, as the backend lists it
    stored_size: int
    original_size: int
    client_etag: str  # unquoted, as clients see it
    last_modified_ms: int
    head: HeadFacts | None = None  # None: not recorded (a tombstone, or a version 1 record)


def encode_catalog(records: Iterable[CatalogRecord], *, level: int = 3) -> bytes:
    """One catalog object holding `records` (sorted by key, so equal sets encode equally)."""
    ordered = sorted(records, key=lambda r: (r.key, r.backend_etag))
    body = Writer()
    for r in ordered:
        body.text(r.key)
        body.text(r.backend_etag)
        body.varint(r.stored_size)
        body.varint(r.original_size)
        body.text(r.client_etag)
        body.varint(r.last_modified_ms)
        _write_head(body, r.head)
    payload = bytes(body.buf)
    flags = 0
    if len(payload) > COMPRESS_ABOVE:
        payload = zstandard.ZstdCompressor(level=level, write_content_size=True).compress(payload)
        flags |= FLAG_ZSTD
    out = Writer()
    out.raw(MAGIC)
    out.u8(VERSION)
    out.u8(flags)
    out.varint(len(ordered))
    out.raw(payload)
    out.u32(zlib.crc32(out.buf))
    return bytes(out.buf)


def decode_catalog(data: bytes | bytearray | memoryview) -> list[CatalogRecord]:
    """The records of a catalog object; IntegrityError when it is damaged, truncated or not one."""
    view = memoryview(data).cast("B")
    if len(view) < len(MAGIC) + 2 + 1 + _CRC.size or bytes(view[: len(MAGIC)]) != MAGIC:
        raise IntegrityError("catalog: not a catalog object")
    (crc,) = _CRC.unpack_from(view, len(view) - _CRC.size)
    if zlib.crc32(view[: len(view) - _CRC.size]) != crc:
        raise IntegrityError("catalog: checksum mismatch")
    head = Reader(view[: len(view) - _CRC.size], "catalog")
    head.take(len(MAGIC))
    version = head.u8()
    if version not in READABLE_VERSIONS:
        raise IntegrityError(f"catalog: unsupported version {version}")
    flags = head.u8()
    if flags & ~FLAG_ZSTD:
        raise IntegrityError(f"catalog: unknown flags {flags:#x}")
    count = head.varint()
    payload = head.take(head.remaining())
    if flags & FLAG_ZSTD:
        payload = memoryview(_decompress(payload))
    # Each record takes at least 6 bytes, so a hostile count cannot make us loop far past the body.
    if count > len(payload) // 6 + 1:
        raise IntegrityError(f"catalog: {count} records cannot fit in {len(payload)} bytes")
    r = Reader(payload, "catalog")
    with_heads = version >= 2  # version 1 records end at their last-modified time
    out = [
        CatalogRecord(
            r.text(),
            r.text(),
            r.varint(),
            r.varint(),
            r.text(),
            r.varint(),
            _read_head(r) if with_heads else None,
        )
        for _ in range(count)
    ]
    r.end()
    return out


def _write_head(body: Writer, head: HeadFacts | None) -> None:
    if head is None:
        body.u8(0)
        return
    body.u8(RECORD_HEAD | (RECORD_CONTENT_TYPE if head.content_type is not None else 0))
    if head.content_type is not None:
        body.text(head.content_type)
    body.mapping(dict(head.metadata))
    body.mapping(dict(head.headers))


def _read_head(r: Reader) -> HeadFacts | None:
    flags = r.u8()
    if flags & ~(RECORD_HEAD | RECORD_CONTENT_TYPE) or (
        flags & RECORD_CONTENT_TYPE and not flags & RECORD_HEAD
    ):
        raise IntegrityError(f"catalog: unknown record flags {flags:#x}")
    if not flags & RECORD_HEAD:
        return None
    content_type = r.text() if flags & RECORD_CONTENT_TYPE else None
    return HeadFacts.of(content_type, r.mapping(), r.mapping())


def _decompress(frame: memoryview) -> bytes:
    try:
        size = zstandard.frame_content_size(frame)
        if size < 0 or size > MAX_BODY:
            raise IntegrityError("catalog: body size missing or too large")
        return zstandard.ZstdDecompressor().decompress(frame, max_output_size=size)
    except zstandard.ZstdError as e:
        raise IntegrityError(f"catalog: body does not decompress ({e})") from None


def tombstone(key: str, deleted_ms: int) -> CatalogRecord:
    """The record of a delete: it retires the key's earlier records wherever they were written."""
    return CatalogRecord(key, "", 0, 0, "", deleted_ms)


class CatalogIndex:
    """The records loaded so far, by key; answers only for entries the backend still lists.

    Memory is one small tuple per (key, backend ETag) seen: a key keeps its `KEEP_VERSIONS` newest
    versions, and a tombstone (a delete through tsproxy) drops the versions written before it.
    """

    KEEP_VERSIONS = 2

    def __init__(self) -> None:
        # key -> {backend etag: (stored size, original size, client etag, last-modified ms, HEAD facts)}
        self._by_key: dict[str, dict[str, tuple[int, int, str, int, HeadFacts | None]]] = {}
        self._deleted: dict[str, int] = {}  # key -> time of its latest tombstone (ms)
        self.loaded: set[str] = set()  # names of the catalog objects merged in

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_key.values())

    def add(self, records: Iterable[CatalogRecord]) -> None:
        for r in records:
            deleted = self._deleted.get(r.key, -1)
            if not r.backend_etag:  # a tombstone
                if r.last_modified_ms > deleted:
                    self._deleted[r.key] = r.last_modified_ms
                    versions = self._by_key.get(r.key, {})
                    for etag in [e for e, f in versions.items() if f[3] <= r.last_modified_ms]:
                        del versions[etag]
                    if not versions:
                        self._by_key.pop(r.key, None)
                continue
            if r.last_modified_ms <= deleted:
                continue
            versions = self._by_key.setdefault(r.key, {})
            versions[r.backend_etag] = (
                r.stored_size,
                r.original_size,
                r.client_etag,
                r.last_modified_ms,
                r.head,
            )
            if len(versions) > self.KEEP_VERSIONS:
                oldest = min(versions, key=lambda e: versions[e][3])
                del versions[oldest]

    def tombstones(self, since_ms: int) -> Iterator[CatalogRecord]:
        """Tombstones newer than `since_ms`: a compacted catalog keeps them while late records may come."""
        for key, ms in self._deleted.items():
            if ms >= since_ms:
                yield tombstone(key, ms)

    def __contains__(self, key: str) -> bool:
        """Whether any version of `key` is recorded (worth a backend HEAD to check it)."""
        return key in self._by_key

    def lookup(self, key: str, backend_etag: str, stored_size: int) -> CatalogRecord | None:
        """The record for what the backend lists now, or None when nothing matches both facts."""
        found = self._by_key.get(key, {}).get(backend_etag)
        if found is None or found[0] != stored_size:
            return None
        return CatalogRecord(key, backend_etag, *found)

    def summary(self, key: str, backend_etag: str, stored_size: int) -> tuple[int, str] | None:
        """`lookup`'s (original size, client ETag) alone: what a listing needs, per listed object."""
        found = self._by_key.get(key)
        facts = found.get(backend_etag) if found is not None else None
        if facts is None or facts[0] != stored_size:
            return None
        return facts[1], facts[2]

    def records(self) -> Iterator[CatalogRecord]:
        for key, versions in self._by_key.items():
            for etag, facts in versions.items():
                yield CatalogRecord(key, etag, *facts)

    def retain(self, listed: Iterable[tuple[str, str]]) -> None:
        """Keep only the (key, backend ETag) pairs a complete listing of the catalog's scope returned."""
        keep: dict[str, set[str]] = {}
        for key, etag in listed:
            keep.setdefault(key, set()).add(etag)
        for key in list(self._by_key):
            versions = {e: f for e, f in self._by_key[key].items() if e in keep.get(key, ())}
            if versions:
                self._by_key[key] = versions
            else:
                del self._by_key[key]


def catalog_object_name(written_ms: int, instance: str, sequence: int) -> str:
    """Name of a catalog object under the catalog prefix: sortable by time, unique per instance."""
    return f"{written_ms:013d}-{instance}-{sequence:08d}"
