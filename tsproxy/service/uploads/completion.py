"""Completing a straight multipart upload in place: the backend upload its parts went into.

Parts sent straight are already backend parts; parts kept aside (in their record, or as objects of
their own) are copied in, or stored again uncompressed when compression shrank them below the backend's
minimum part size; the tail goes in a part after the last one named. Overlapping completions of one
upload, and completions that find the backend upload gone, are resolved here too (see
`complete_in_place`). multipart.py has the rest of the upload's life.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence

from tsproxy import errors
from tsproxy.format import (
    ChunkDecoder,
    ObjectContext,
    SegmentEncoder,
    SegmentInfo,
    TransformSettings,
    build_manifest,
    encode_tail,
)
from tsproxy.format.manifest import META_FORMAT, Manifest
from tsproxy.s3.limits import MAX_PARTS
from tsproxy.service.core import ServiceCore
from tsproxy.service.namespace import Location
from tsproxy.service.reads import Reads
from tsproxy.service.records import ByteRange, StoredObject
from tsproxy.service.uploads.ids import upload_token
from tsproxy.service.uploads.records import PartRecord, UploadState
from tsproxy.service.writes import Writes
from tsproxy.store.base import ObjectInfo, multipart_etag, multipart_of

# Backend metadata naming the client upload (its id's random token) an object was completed from.
META_UPLOAD = "tsproxy-upload"


class Completion:
    """Where an upload's parts are, and the in-place completion of a straight upload."""

    def __init__(self, core: ServiceCore, reads: Reads, writes: Writes) -> None:
        self.core = core
        self.reads = reads
        self.writes = writes
        self.backend = core.backend
        self.ns = core.ns
        self.layout = core.layout
        self.part_size = core.part_size

    def in_place(self, state: UploadState, chosen: Sequence[PartRecord]) -> bool:
        """Whether a completion of `chosen` completes the upload's own backend upload: when a part went
        straight into it, or when no part but the last would have to be stored again (uncompressed) to
        be a backend part (else copying keeps the parts as they are)."""
        if state.backend_upload is None:
            return False
        if any(r.backend_etag is not None for r in chosen):
            return True
        min_part = multipart_of(self.backend).min_part_size
        return all(r.segment.stored_size >= min_part for r in chosen[:-1])

    def kept(self, bucket: str, upload_id: str, record: PartRecord) -> ByteRange:
        """Where the stored bytes of a part not sent straight are: its data object, or its record."""
        root = self.ns.root(bucket)
        size = record.segment.stored_size
        if record.data_key:
            return ByteRange(Location(root.bucket, record.data_key), 0, size - 1)
        if not record.kept_inline:
            raise errors.InternalError("A part sent straight has no stored bytes of its own.")
        info = self.layout.record(bucket, upload_id, record.part_no)
        first = record.inline_offset
        return ByteRange(info, first, first + size - 1, record.record_etag)

    async def complete_in_place(
        self,
        bucket: str,
        dst: Location,
        state: UploadState,
        ctx: ObjectContext,
        records: Sequence[PartRecord],
        chosen: Sequence[PartRecord],
        manifest: Manifest,
    ) -> tuple[ObjectInfo, Manifest, dict[str, str]]:
        """Complete the backend upload the parts went to: parts kept aside are copied in (or, when
        compression shrank them below the minimum part size, stored again uncompressed), the tail is
        uploaded after the last part, and nothing is downloaded but a small last part.

        The parts this completion uploads itself take backend part numbers that no part sent straight
        holds, the tail's chosen at random among the free ones after the last part: two overlapping
        completions of one upload do not overwrite each other's parts. The one whose backend Complete
        lands second finds the backend upload gone and builds its object from the first one's (see
        _complete_after_another).
        """
        backend = multipart_of(self.backend)
        upload = state.backend_upload
        assert upload is not None
        root = self.ns.root(bucket)
        straight = {r.part_no for r in records if r.backend_etag is not None}
        parts: list[tuple[int, str]] = []
        segments: list[SegmentInfo] = []
        last_bytes: bytes | None = None  # the last part's stored bytes, when this completion holds them
        *middle, last = chosen
        try:
            for r in middle:
                seg, etag = r.segment, r.backend_etag
                if etag is None and seg.stored_size >= backend.min_part_size:
                    end = seg.stored_size - 1
                    etag = await backend.upload_part_copy(
                        dst.bucket, dst.key, upload, r.part_no, root.bucket, r.data_key, 0, end
                    )
                elif etag is None:
                    stored = await self.part_bytes(bucket, state.upload_id, r)
                    seg, data = await self.core.cpu(
                        "store", store_uncompressed, ctx, state.settings, seg, stored
                    )
                    etag = await backend.upload_part(dst.bucket, dst.key, upload, r.part_no, data)
                parts.append((r.part_no, etag))
                segments.append(seg)
            segments.append(last.segment)
            if segments != [r.segment for r in chosen]:
                manifest = build_manifest(
                    ctx,
                    state.settings,
                    segments,
                    etag=manifest.etag,
                    md5=None,
                    content_type=state.content_type,
                    metadata=state.metadata,
                    headers=state.headers,
                )
            tail = await self.core.cpu("store", encode_tail, manifest, ctx)

            def free_number() -> int:
                after = parts[-1][0] if parts else 0
                free = [n for n in range(after + 1, MAX_PARTS + 1) if n not in straight]
                if not free:
                    raise errors.InternalError("No backend part number is left for the object's tail.")
                return free[secrets.randbelow(len(free))] if len(free) > 1 else free[0]

            if last.backend_etag is None and last.segment.stored_size <= self.part_size:
                last_bytes = await self.part_bytes(bucket, state.upload_id, last)
                no = free_number()
                etag = await backend.upload_part(dst.bucket, dst.key, upload, no, last_bytes + tail)
                parts.append((no, etag))
            else:
                if last.backend_etag is not None:
                    parts.append((last.part_no, last.backend_etag))
                else:
                    no, end = free_number(), last.segment.stored_size - 1
                    etag = await backend.upload_part_copy(
                        dst.bucket, dst.key, upload, no, root.bucket, last.data_key, 0, end
                    )
                    parts.append((no, etag))
                no = free_number()
                parts.append((no, await backend.upload_part(dst.bucket, dst.key, upload, no, tail)))
            size = sum(s.stored_size for s in segments) + len(tail)
            info = await backend.complete_multipart(dst.bucket, dst.key, upload, parts, size=size)
        except errors.NoSuchUpload:
            # Another completion of this upload landed first and took the backend upload with it.
            return await self._complete_after_another(bucket, dst, state, ctx, chosen, last_bytes)
        return info, manifest, straight_metadata(upload_token(state.upload_id), state.settings.format_version)

    async def _complete_after_another(
        self,
        bucket: str,
        dst: Location,
        state: UploadState,
        ctx: ObjectContext,
        chosen: Sequence[PartRecord],
        last_bytes: bytes | None,
    ) -> tuple[ObjectInfo, Manifest, dict[str, str]]:
        """The slow path of overlapping completions: the parts sent straight now live only in the object
        the other completion made (if it is still there), so each chosen part is copied from there, or
        from where it was kept aside; a part found in neither makes the upload gone (NoSuchUpload)."""
        gone = errors.NoSuchUpload(UploadId=state.upload_id)
        self.core.invalidate(bucket, state.key)
        try:
            other: StoredObject | None = await self.reads.resolve(bucket, state.key)
        except errors.NoSuchKey:
            other = None
        if other is None or other.backend_metadata.get(META_UPLOAD) != upload_token(state.upload_id):
            raise gone  # aborted (or completed, then overwritten), not completed by another request
        found: dict[SegmentInfo, ByteRange] = {}
        if other.manifest is not None:
            offset = 0
            for seg in other.manifest.segments:
                found[seg] = ByteRange(other.loc, offset, offset + seg.stored_size - 1, other.backend_etag)
                offset += seg.stored_size
        segments = [r.segment for r in chosen]
        etag = multipart_etag([r.etag for r in chosen])
        if (
            other.manifest is not None
            and other.ctx is not None
            and other.ctx.to_state() == state.ctx_state
            and other.manifest.segments == tuple(segments)
        ):
            # The other completion made what this one would (a repeat of the same Complete): it answers.
            info = await self.backend.head(dst.bucket, dst.key)
            if info.etag == other.backend_etag:
                return info, other.manifest, dict(other.backend_metadata)
        pieces: list[ByteRange] = []
        *middle, last = chosen
        for r in middle:
            piece = found.get(r.segment)
            if piece is None and r.backend_etag is None:
                piece = self.kept(bucket, state.upload_id, r)
            if piece is None:
                raise gone
            pieces.append(piece)
        manifest = build_manifest(
            ctx,
            state.settings,
            segments,
            etag=etag,
            md5=None,
            content_type=state.content_type,
            metadata=state.metadata,
            headers=state.headers,
        )
        tail = await self.core.cpu("store", encode_tail, manifest, ctx)
        piece = found.get(last.segment)
        if piece is None and last_bytes is not None:
            tail = last_bytes + tail
        elif piece is None and last.backend_etag is None:
            piece = self.kept(bucket, state.upload_id, last)
        elif piece is None:
            raise gone
        if piece is not None:
            pieces.append(piece)
        meta = manifest.backend_metadata(len(tail)) | {META_UPLOAD: upload_token(state.upload_id)}
        try:
            pieces = [p for p in pieces if p.last >= p.first]
            info = await self.writes.assemble(dst, pieces, tail, meta, state.content_type)
        except (errors.NoSuchKey, errors.PreconditionFailed):
            raise gone from None  # what it was to be built from is gone or replaced meanwhile
        return info, manifest, meta

    async def part_bytes(self, bucket: str, upload_id: str, record: PartRecord) -> bytes:
        """The stored bytes of a part not sent straight (kept in its record, or an object of its own)."""
        if record.inline is not None:
            data = record.inline
        elif not record.segment.stored_size:
            return b""
        else:
            where = self.kept(bucket, upload_id, record)
            try:
                _, data = await self.backend.get_bytes(
                    where.loc.bucket, where.loc.key, where.first, where.last, if_match=where.etag
                )
            except errors.PreconditionFailed:
                raise errors.InvalidPart(UploadId=upload_id, PartNumber=str(record.part_no)) from None
        if len(data) != record.segment.stored_size:
            raise errors.InternalError("A stored part is not the size its record says.")
        return data


def straight_metadata(token: str, version: int) -> dict[str, str]:
    """The backend metadata of an object completed from a straight backend upload, set when that upload
    begins (its size, ETag and tail length are not known yet): the format, and the client upload it
    came from, so that a repeated CompleteMultipartUpload can be answered from the object itself."""
    return {META_FORMAT: str(version), META_UPLOAD: token}


def store_uncompressed(
    ctx: ObjectContext, settings: TransformSettings, segment: SegmentInfo, stored: bytes
) -> tuple[SegmentInfo, bytes]:
    """A stored segment stored again without compression (under a fresh salt, so no nonce is reused):
    a part at least the minimum part size before compression is then at least that size stored."""
    view = memoryview(stored)
    alone = build_manifest(
        ctx,
        settings,
        [segment],
        etag=segment.md5.hex(),
        md5=None,
        content_type=None,
        metadata={},
        headers={},
    )
    decoder = ChunkDecoder(alone, ctx)
    encoder = SegmentEncoder(
        ctx, dataclasses.replace(settings, compression="off"), segment.segment_no, object_start=False
    )
    out = bytearray()
    for ref in alone.index:
        for chunk in encoder.feed(
            decoder.decode(ref, view[ref.stored_offset : ref.stored_offset + ref.stored_len])
        ):
            out += chunk
    for chunk in encoder.finish():
        out += chunk
    if encoder.info.md5 != segment.md5:
        raise errors.InternalError("A stored part does not decode to what was uploaded.")
    return encoder.info, bytes(out)
