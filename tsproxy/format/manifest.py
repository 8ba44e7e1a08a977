"""The manifest and the tail: everything a reader needs, written after an object's chunks.

    stored object = data area (every segment's chunks, in segment order)
                    || manifest body || manifest check (16-byte HMAC or 4-byte CRC32C)
                    || trailer (16 bytes)

The trailer is fixed-size so a reader finds the manifest from the object's end alone:

    u32 BE  manifest length (body + check)
    u16 BE  format version
    u16 BE  reserved, 0
    8       magic b"\\x89TSPROXY"

docs/FORMAT.md has the manifest body field by field.
"""

from __future__ import annotations

import dataclasses
import hmac
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from awscrt.checksums import crc32c

from tsproxy.errors import FormatError, IntegrityError

from .context import MANIFEST_MAC_SIZE, MAX_SEGMENT_NO, OBJECT_ID_SIZE, ObjectContext
from .index import ChunkIndex
from .keyring import KeyRing
from .pipeline import SEAL_FLAG_BITS, Stages
from .segment import MD5_SIZE, SegmentInfo
from .settings import (
    COMPRESSION_MODES,
    MAX_CHUNK_SIZE,
    MAX_LEVEL,
    MIN_CHUNK_SIZE,
    MIN_LEVEL,
    READABLE_VERSIONS,
    TransformSettings,
)
from .wire import Reader, Writer

MAGIC = b"\x89TSPROXY"
TRAILER_SIZE = 16
SUPPORTED_VERSIONS = frozenset(READABLE_VERSIONS)
_TRAILER = struct.Struct(">IHH8s")
_CRC_SIZE = 4

# Bit 0 (encrypted) names the seal stage, as the registry in pipeline.py says (Stages.from_manifest_flags).
_F_MD5 = 0x02
_F_CONTENT_TYPE = 0x04
_F_KNOWN = SEAL_FLAG_BITS | _F_MD5 | _F_CONTENT_TYPE

# Backend user-metadata keys (the backend adds its own x-amz-meta- prefix).
META_FORMAT = "tsproxy-format"
META_SIZE = "tsproxy-size"
META_ETAG = "tsproxy-etag"
META_TAIL_LENGTH = "tsproxy-tail-length"


@dataclass(frozen=True)
class Manifest:
    """What a stored object is: sizes, checksums, transform parameters, keys and client metadata.

    Constructing one checks it is self-consistent (ValueError otherwise); the chunk index is derived.
    """

    version: int
    object_id: bytes
    chunk_size: int
    size: int
    etag: str  # unquoted, as S3 shows it
    md5: bytes | None  # MD5 of the whole original when known (single PUT)
    segments: tuple[SegmentInfo, ...]
    compression: str  # the mode the object was written with; the codec is stages.codec
    level: int
    stages: Stages  # what the chunks went through, as the format records it
    kek_id: str | None
    wrapped_dek: bytes | None
    content_type: str | None
    metadata: dict[str, str]
    headers: dict[str, str]
    index: ChunkIndex = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", tuple(self.segments))
        object.__setattr__(self, "metadata", dict(self.metadata))
        object.__setattr__(self, "headers", dict(self.headers))
        _validate(self)
        object.__setattr__(self, "index", ChunkIndex(self.chunk_size, self.segments))

    @property
    def encrypted(self) -> bool:
        """Whether the object is sealed under a DEK (wrapped by a KEK, so rewrapping applies)."""
        return self.stages.keyed

    @property
    def data_size(self) -> int:
        """Stored bytes before the tail (all chunks of all segments)."""
        return self.index.stored_size

    def backend_metadata(self, tail_len: int) -> dict[str, str]:
        """The fields HEAD and listings need, for the backend object's user metadata."""
        return {
            META_FORMAT: str(self.version),
            META_SIZE: str(self.size),
            META_ETAG: self.etag,
            META_TAIL_LENGTH: str(tail_len),
        }

    def replace(self, **changes: Any) -> Manifest:
        """A copy with some fields changed (new metadata, or a rewrapped DEK); checked like any manifest."""
        return dataclasses.replace(self, **changes)


def _chunk_count(size: int, chunk_size: int) -> int:
    return -(-size // chunk_size)


def _validate(m: Manifest) -> None:
    def need(ok: bool, why: str) -> None:
        if not ok:
            raise ValueError(f"manifest: {why}")

    need(m.version in SUPPORTED_VERSIONS, f"unsupported version {m.version}")
    need(len(m.object_id) == OBJECT_ID_SIZE, "object_id must be 16 bytes")
    need(MIN_CHUNK_SIZE <= m.chunk_size <= MAX_CHUNK_SIZE, f"chunk size {m.chunk_size} out of range")
    need(m.compression in COMPRESSION_MODES, f"unknown compression mode {m.compression!r}")
    need(MIN_LEVEL <= m.level <= MAX_LEVEL, f"compression level {m.level} out of range")
    need(m.md5 is None or len(m.md5) == MD5_SIZE, "md5 must be 16 bytes")
    if m.encrypted:
        need(bool(m.kek_id) and bool(m.wrapped_dek), "an encrypted object needs kek_id and wrapped_dek")
    else:
        need(m.kek_id is None and m.wrapped_dek is None, "an unencrypted object has no kek_id or wrapped_dek")
    overhead = m.stages.overhead
    previous = 0
    total = 0
    for seg in m.segments:
        need(seg.segment_no > previous, "segments must be in ascending segment_no order")
        previous = seg.segment_no
        need(bool(seg.salt) == m.stages.keyed, f"segment {seg.segment_no} disagrees on encryption")
        count = len(seg.stored_sizes)
        need(
            count == _chunk_count(seg.original_size, m.chunk_size),
            f"segment {seg.segment_no}: {count} chunks do not fit {seg.original_size} bytes in chunks of "
            f"{m.chunk_size}",
        )
        if count:
            # Every chunk holds at least one payload byte and is never larger than raw plus the tag.
            last_len = seg.original_size - (count - 1) * m.chunk_size
            need(
                seg.stored_sizes[-1] <= last_len + overhead, f"segment {seg.segment_no}: last chunk too large"
            )
            need(min(seg.stored_sizes) >= 1 + overhead, f"segment {seg.segment_no}: chunk too small")
            if count > 1:
                need(
                    max(seg.stored_sizes[:-1]) <= m.chunk_size + overhead,
                    f"segment {seg.segment_no}: chunk too large",
                )
        total += seg.original_size
    need(total == m.size, f"segment sizes add up to {total}, not {m.size}")


def build_manifest(
    ctx: ObjectContext,
    settings: TransformSettings,
    segments: Sequence[SegmentInfo],
    *,
    etag: str,
    md5: bytes | None,
    content_type: str | None,
    metadata: Mapping[str, str],
    headers: Mapping[str, str],
) -> Manifest:
    """The manifest of an object whose segments are all transformed (in ascending segment_no order)."""
    return Manifest(
        version=settings.format_version,
        object_id=ctx.object_id,
        chunk_size=settings.chunk_size,
        size=sum(s.original_size for s in segments),
        etag=etag,
        md5=md5,
        segments=tuple(segments),
        compression=settings.compression,
        level=settings.level,
        stages=Stages.for_context(ctx),
        kek_id=ctx.kek_id,
        wrapped_dek=ctx.wrapped_dek,
        content_type=content_type,
        metadata=dict(metadata),
        headers=dict(headers),
    )


def _encode_body(m: Manifest) -> bytes:
    w = Writer()
    flags = m.stages.manifest_flags
    flags |= _F_MD5 if m.md5 is not None else 0
    flags |= _F_CONTENT_TYPE if m.content_type is not None else 0
    w.u8(flags)
    w.u8(COMPRESSION_MODES.index(m.compression))
    w.u8(m.level)
    w.u32(m.chunk_size)
    w.raw(m.object_id)
    w.varint(m.size)
    if m.md5 is not None:
        w.raw(m.md5)
    w.text(m.etag)
    if m.kek_id is not None and m.wrapped_dek is not None:
        w.text(m.kek_id)
        w.blob(m.wrapped_dek)
    if m.content_type is not None:
        w.text(m.content_type)
    w.mapping(m.metadata)
    w.mapping(m.headers)
    w.varint(len(m.segments))
    for seg in m.segments:
        seg.write(w)
    return bytes(w.buf)


def encode_tail(manifest: Manifest, ctx: ObjectContext) -> bytes:
    """Manifest bytes plus trailer, to be written right after the object's last chunk."""
    if manifest.version not in SUPPORTED_VERSIONS:
        raise ValueError(f"format version {manifest.version} cannot be written")
    if ctx.object_id != manifest.object_id or ctx.encrypted != manifest.encrypted:
        raise ValueError("the context is not this manifest's object")
    if ctx.encrypted and (ctx.kek_id != manifest.kek_id or ctx.wrapped_dek != manifest.wrapped_dek):
        raise ValueError("the context's wrapped DEK is not the manifest's")
    body = _encode_body(manifest)
    check_size = MANIFEST_MAC_SIZE if manifest.encrypted else _CRC_SIZE
    trailer = _TRAILER.pack(len(body) + check_size, manifest.version, 0, MAGIC)
    if ctx.encrypted:
        check = ctx.manifest_mac(body + trailer)
    else:
        check = crc32c(body + trailer).to_bytes(4, "big")
    return body + check + trailer


def is_tsproxy_trailer(trailer: bytes | bytearray | memoryview) -> bool:
    """Whether these bytes (an object's last TRAILER_SIZE or more) end in a tsproxy trailer."""
    view = memoryview(trailer).cast("B")
    return len(view) >= TRAILER_SIZE and view[-len(MAGIC) :] == MAGIC


def tail_length(trailer: bytes | bytearray | memoryview) -> int:
    """Length of manifest plus trailer, from an object's last TRAILER_SIZE (or more) bytes.

    FormatError when the bytes are not a tsproxy trailer or name an unsupported format version.
    """
    view = memoryview(trailer).cast("B")
    if not is_tsproxy_trailer(view):
        raise FormatError("not a tsproxy object (no trailer magic)")
    length, version, reserved, _ = _TRAILER.unpack(view[-TRAILER_SIZE:])
    if version not in SUPPORTED_VERSIONS:
        raise FormatError(f"tsproxy format version {version} is not supported by this reader")
    if reserved != 0 or length < _CRC_SIZE + 1:
        raise IntegrityError("tsproxy trailer is malformed")
    return int(length) + TRAILER_SIZE


def decode_tail(
    tail: bytes | bytearray | memoryview, keyring: KeyRing | None
) -> tuple[Manifest, ObjectContext]:
    """Parse and authenticate an object's tail (any suffix of the object that holds it).

    IntegrityError when the manifest fails its HMAC or CRC32C or is malformed, KeyNotFound when its
    KEK is not on the ring, FormatError when it is no tsproxy tail at all.
    """
    view = memoryview(tail).cast("B")
    needed = tail_length(view)
    if len(view) < needed:
        raise FormatError(f"tail needs the object's last {needed} bytes, got {len(view)}")
    view = view[len(view) - needed :]
    version = _TRAILER.unpack(view[-TRAILER_SIZE:])[1]
    return _decode(view, keyring, version)


def _decode(tail: memoryview, keyring: KeyRing | None, version: int) -> tuple[Manifest, ObjectContext]:
    """Versions 1 and 2 share the manifest's layout; 2 differs in its chunks (runs of zstd frames)."""
    trailer = tail[-TRAILER_SIZE:]
    signed = tail[:-TRAILER_SIZE]
    stages = Stages.from_manifest_flags(signed[0])
    encrypted = stages.keyed
    check_size = MANIFEST_MAC_SIZE if encrypted else _CRC_SIZE
    if len(signed) < check_size + 1:
        raise IntegrityError("manifest: truncated")
    body = signed[:-check_size]
    check = bytes(signed[-check_size:])
    if not encrypted and crc32c(bytes(body) + bytes(trailer)).to_bytes(4, "big") != check:
        raise IntegrityError("manifest: CRC32C mismatch (corrupted or tampered)")

    r = Reader(body)
    flags = r.u8()
    if flags & ~_F_KNOWN:
        raise r.fail(f"unknown flags {flags:#x}")
    mode = r.u8()
    if mode >= len(COMPRESSION_MODES):
        raise r.fail(f"unknown compression mode {mode}")
    level = r.u8()
    chunk_size = r.u32()
    if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
        raise r.fail(f"chunk size {chunk_size} out of range")
    object_id = bytes(r.take(OBJECT_ID_SIZE))
    size = r.varint()
    md5 = bytes(r.take(MD5_SIZE)) if flags & _F_MD5 else None
    etag = r.text()
    kek_id = wrapped = None
    if encrypted:
        kek_id = r.text()
        wrapped = r.blob()
        # Authenticate before reading any further, so what follows (counts, sizes) is trusted input.
        ctx = ObjectContext.unwrapped(object_id, kek_id, wrapped, keyring)
        if not hmac.compare_digest(ctx.manifest_mac(bytes(body) + bytes(trailer)), check):
            raise IntegrityError("manifest: HMAC mismatch (tampered, or not this object's DEK)")
    else:
        ctx = ObjectContext(object_id)
    content_type = r.text() if flags & _F_CONTENT_TYPE else None
    metadata = r.mapping()
    headers = r.mapping()
    count = r.varint(min(r.remaining(), MAX_SEGMENT_NO))
    segments = tuple(SegmentInfo.read(r, chunk_size, stages) for _ in range(count))
    r.end()

    try:
        manifest = Manifest(
            version=version,
            object_id=object_id,
            chunk_size=chunk_size,
            size=size,
            etag=etag,
            md5=md5,
            segments=segments,
            compression=COMPRESSION_MODES[mode],
            level=level,
            stages=stages,
            kek_id=kek_id,
            wrapped_dek=wrapped,
            content_type=content_type,
            metadata=metadata,
            headers=headers,
        )
    except ValueError as e:
        raise IntegrityError(str(e)) from None
    return manifest, ctx


def rewrap(manifest: Manifest, ctx: ObjectContext, keyring: KeyRing) -> tuple[Manifest, ObjectContext]:
    """The same DEK wrapped by the ring's active KEK; write encode_tail() of the result as the new tail.

    The data area does not change. An unencrypted object comes back unchanged.
    """
    if not manifest.encrypted or ctx.dek is None:
        return manifest, ctx
    kek_id, wrapped = keyring.wrap(ctx.dek)
    new_ctx = ObjectContext(ctx.object_id, ctx.dek, kek_id, wrapped)
    return manifest.replace(kek_id=kek_id, wrapped_dek=wrapped), new_ctx
