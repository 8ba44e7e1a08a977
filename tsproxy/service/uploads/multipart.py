"""Multipart uploads: each client part a segment of its own.

A part whose stored form is at least the backend's minimum part size goes *straight* (see the package)
into a backend multipart upload at the object's own key, begun with the client's upload, as the backend
part of the same number; at completion only the tail is uploaded (with a small last part, as a part
after the last one named) and the backend upload completed, so the backend receives every stored byte
once. A smaller part (the last one, or one that compression shrank) is kept inside its part record, and
an oversized one as an object of its own, until completion, which re-uploads or copies them into place.

An upload without metadata of its own carries what CreateMultipartUpload decided in its id (a ticket,
uploads.tickets), so it needs no state object to take parts anywhere; and the records of parts
sent straight or held for the tail are written late (uploads.keeper). The instance that took every part
completes the upload with CreateMultipartUpload, one UploadPart per part and CompleteMultipartUpload,
writing and reading nothing else. docs/FORMAT.md describes the objects an upload keeps in the reserved
namespace.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime

from tsproxy import defaults, errors
from tsproxy.format import (
    ObjectContext,
    SegmentEncoder,
    SegmentInfo,
    build_manifest,
    encode_tail,
)
from tsproxy.s3.limits import MAX_LIST_KEYS, MAX_PARTS, MIN_PART_SIZE, check_part_number
from tsproxy.service.core import (
    ServiceCore,
    bounded_gather,
    buffer_head,
    chain,
    quietly,
)
from tsproxy.service.namespace import Location
from tsproxy.service.reads import Reads
from tsproxy.service.records import StoredObject
from tsproxy.service.uploads import tickets
from tsproxy.service.uploads.completion import META_UPLOAD, Completion, straight_metadata
from tsproxy.service.uploads.ids import (
    MAX_UPLOAD_ID,
    backend_upload_of,
    straight_upload_id,
    ticket_of,
    upload_name,
    upload_token,
    valid_upload_id,
)
from tsproxy.service.uploads.keeper import RecordKeeper, holding
from tsproxy.service.uploads.pending import PendingUpload
from tsproxy.service.uploads.records import COMPLETED_UPLOAD_TTL, CompletedUpload, PartRecord, UploadState
from tsproxy.service.writes import Writes
from tsproxy.store.base import MultipartCapable, multipart_etag, multipart_of

log = logging.getLogger("tsproxy.service")

# How often each instance deletes the completed-upload records past their lifetime.
COMPLETED_SWEEP_INTERVAL = 600.0


class Uploads:
    """Create, fill, list, complete and abort multipart uploads: the uploads part of the service, which
    holds the upload's records (`keeper`) and its completion in place (`completion`)."""

    def __init__(
        self,
        core: ServiceCore,
        reads: Reads,
        writes: Writes,
        *,
        upload_records: str = defaults.UPLOAD_RECORDS,
        upload_record_delay: float = defaults.UPLOAD_RECORD_DELAY,
    ) -> None:
        self.core = core
        self.reads = reads
        self.writes = writes
        self.backend = core.backend
        self.ns = core.ns
        self.layout = core.layout
        self.part_size = core.part_size
        self.keeper = RecordKeeper(core, upload_records, upload_record_delay)
        self.completion = Completion(core, reads, writes)
        self.pending = self.keeper.pending
        self._completed_swept: dict[str, float] = {}  # client bucket -> when its records were last swept

    def start(self) -> None:
        """Start writing the records of quiet uploads in the background (with the server)."""
        self.keeper.start()

    async def close(self) -> int:
        """Write every record held (a graceful stop); how many the store refused."""
        return await self.keeper.close()

    def forget_upload(self, bucket: str, name: str) -> None:
        """Drop what this instance remembers of the upload stored as `name` (or of that upload id)."""
        self.keeper.forget(bucket, name)

    async def upload_state(self, bucket: str, key: str | None, upload_id: str) -> UploadState:
        """The upload's state (NoSuchUpload when there is no such upload at the key)."""
        return await self.keeper.upload_state(bucket, key, upload_id)

    async def create_upload(
        self,
        bucket: str,
        key: str,
        *,
        content_type: str | None,
        metadata: Mapping[str, str],
        headers: Mapping[str, str],
    ) -> str:
        straight = isinstance(self.backend, MultipartCapable)
        if self.ns.mapped or not straight:
            await self.core.head_bucket(bucket)  # else the backend upload's creation says NoSuchBucket
        ctx = await self.core.cpu("store", ObjectContext.new, self.core.settings, self.core.keyring)
        token = secrets.token_urlsafe(24)
        upload_id, backend_upload = token, None
        now = datetime.now(UTC)
        initiated = now.replace(microsecond=now.microsecond // 1000 * 1000)  # as a ticket keeps it
        if straight:
            # Parts go straight into this upload; until it completes nothing is visible at the key.
            dst = self.ns.object(bucket, key)
            backend_upload = await multipart_of(self.backend).create_multipart(
                dst.bucket,
                dst.key,
                metadata=straight_metadata(token, self.core.settings.format_version),
                content_type=content_type,
            )
            upload_id = straight_upload_id(token, backend_upload)
            if tickets.ticketable(content_type, metadata, headers):
                ticket = tickets.UploadTicket(ctx.to_state(), self.core.settings, content_type, initiated)
                sealed = await self.core.cpu("store", tickets.seal, ticket, ctx, bucket, key, upload_id)
                with_ticket = straight_upload_id(token, backend_upload, sealed)
                if len(with_ticket) <= MAX_UPLOAD_ID:  # else (a large wrapped DEK) a state object
                    upload_id = with_ticket
        state = UploadState(
            upload_id,
            key,
            ctx.to_state(),
            self.core.settings,
            content_type,
            dict(metadata),
            dict(headers),
            initiated,
            backend_upload,
        )
        # A ticket stands for the state object, which is written when the upload goes quiet (listings of
        # other instances show the upload from then on), or now with eager records.
        write_state = ticket_of(upload_id) is None or not self.keeper.defers_records
        if write_state:
            try:
                await self.keeper.put_state(bucket, state)
            except BaseException:
                await quietly(self._abort_backend_upload(bucket, state))
                raise
        self.keeper.states.put((bucket, upload_id), state)
        if backend_upload is not None:
            self._entry(bucket, state, state_stored=write_state)
        return upload_id

    def _entry(self, bucket: str, state: UploadState, *, state_stored: bool) -> PendingUpload:
        """This instance's entry of a straight upload (uploads.pending), made when first met."""
        entry = self.pending.get(bucket, upload_name(state.upload_id))
        if entry is None or entry.closed:
            entry = self.pending.open(bucket, state, state_written=state_stored)
            if state_stored:
                entry.written.add(self.layout.state(bucket, state.upload_id).key)
        return entry

    async def upload_part(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_no: int,
        payload: AsyncIterable[bytes | memoryview],
        *,
        content_md5: bytes | None = None,
        size_hint: int | None = None,
    ) -> PartRecord:
        """Transform one client part as its own segment and keep it until the upload completes.

        size_hint: the part's length as the request declares it (checked as the payload is read): a
        part stored uncompressed has a stored size known from it, and goes to the backend as it is sealed.

        content_md5: the client's Content-MD5, checked against the transform's own MD5 of the part
        (BadDigest, and nothing kept, when they differ).
        """
        check_part_number(part_no)
        state = await self.keeper.upload_state(bucket, key, upload_id)
        if state.backend_upload is None:
            return await self._take_part(bucket, key, state, None, part_no, payload, content_md5, size_hint)
        entry = self.pending.get(bucket, upload_name(state.upload_id))
        if entry is None or entry.closed or entry.idle(time.monotonic(), self.keeper.upload_record_delay):
            # Met here for the first time (another instance took its parts, or this one restarted), or
            # quiet here long enough for another instance to have ended it: a ticket still opens once
            # the upload is completed or aborted, and a state may have been read before. The backend
            # upload says whether it is still there (NoSuchUpload when not), before a byte of the part
            # is read; the parts of a busy upload through this instance need not ask.
            await self.keeper.backend_parts(bucket, state)
        entry = self._entry(bucket, state, state_stored=ticket_of(state.upload_id) is None)
        entry.in_flight += 1  # the upload is busy: its records wait
        entry.last_activity = time.monotonic()
        try:
            return await self._take_part(bucket, key, state, entry, part_no, payload, content_md5, size_hint)
        finally:
            entry.in_flight -= 1
            entry.last_activity = time.monotonic()

    async def _take_part(
        self,
        bucket: str,
        key: str,
        state: UploadState,
        entry: PendingUpload | None,
        part_no: int,
        payload: AsyncIterable[bytes | memoryview],
        content_md5: bytes | None,
        size_hint: int | None = None,
    ) -> PartRecord:
        ctx = await self.core.cpu("store", ObjectContext.from_state, state.ctx_state, self.core.keyring)
        # A resent part goes to a fresh data object; the record written after it switches over atomically.
        data_loc = self.layout.part_data(bucket, state.upload_id, part_no)
        result: dict[str, SegmentInfo] = {}
        encoders: list[SegmentEncoder] = []

        async def stored() -> AsyncGenerator[bytes, None]:
            async for item in self.writes.encode(
                ctx,
                state.settings,
                part_no,
                payload,
                object_start=part_no == 1,
                expected_md5=content_md5,
                on_encoder=encoders.append,
            ):
                if isinstance(item, SegmentInfo):
                    result["segment"] = item
                else:
                    yield item

        record: PartRecord | None = None
        if state.backend_upload is not None:
            backend = multipart_of(self.backend)
            chunks = stored()
            first = await anext(chunks, None)
            # Its first chunk sealed, the part knows whether it is compressed; uncompressed (Kafka
            # batches their producer compressed), its stored size follows from its declared length, and
            # it goes to the backend as it is sealed instead of after its last byte arrived.
            raw = encoders[0].stored_size_if_raw(size_hint) if size_hint is not None and encoders else None
            if first is not None and raw is not None and raw >= backend.min_part_size and part_no < MAX_PARTS:
                dst = self.ns.object(bucket, key)
                try:
                    etag = await backend.upload_part(
                        dst.bucket,
                        dst.key,
                        state.backend_upload,
                        part_no,
                        chain(first, chunks),
                        raw,
                        content_md5=lambda: stored_digest(result["segment"]),
                    )
                finally:
                    await chunks.aclose()  # a failed upload stops receiving and sealing now
                seg, received = result["segment"], datetime.now(UTC)
                record = PartRecord(
                    part_no, seg.md5.hex(), seg.original_size, "", seg, received, etag, received=received
                )
                return await self._keep_record(bucket, entry, state, record, None)
            # Held whole up to one backend part (as a streamed PUT holds one): then it is known whether
            # it is big enough to be a backend part of its own.
            head, rest = await buffer_head(
                chain(first, chunks) if first is not None else chunks, self.part_size
            )
            if rest is None:
                seg, received = result["segment"], datetime.now(UTC)
                fields = (part_no, seg.md5.hex(), seg.original_size, "", seg, received)
                if len(head) >= backend.min_part_size and part_no < MAX_PARTS:
                    dst = self.ns.object(bucket, key)
                    etag = await backend.upload_part(
                        dst.bucket, dst.key, state.backend_upload, part_no, head, content_md5=seg.stored_md5
                    )
                    record = PartRecord(*fields, etag, received=received)
                elif len(head) < backend.min_part_size:
                    # Too small to be a backend part but the last: kept in its record.
                    record = PartRecord(*fields, None, head, received=received)
            if record is None:
                body: bytes | AsyncIterator[bytes] = head if rest is None else chain(head, rest)
                info = await self.backend.put(data_loc.bucket, data_loc.key, body)
        else:
            info = await self.backend.put(data_loc.bucket, data_loc.key, stored())
        if record is None:
            seg = result["segment"]
            record = PartRecord(
                part_no,
                seg.md5.hex(),
                seg.original_size,
                data_loc.key,
                seg,
                info.last_modified,
                received=datetime.now(UTC),
            )
            if entry is not None:
                entry.written.add(data_loc.key)
        return await self._keep_record(bucket, entry, state, record, data_loc)

    async def _keep_record(
        self,
        bucket: str,
        entry: PendingUpload | None,
        state: UploadState,
        record: PartRecord,
        data_loc: Location | None,
    ) -> PartRecord:
        """Hold a part's record until the upload goes quiet, or write it now."""
        if entry is not None and not record.data_key and self.keeper.defers_records:
            if record.inline is not None:
                # One part kept in its record (its stored form below the backend's minimum part size) is
                # held per upload: the newest, most likely the last; an older one is a middle part that
                # compression shrank, written now with its stored bytes, so an upload of highly
                # compressible parts does not hold them all in memory.
                for no in sorted(entry.unwritten):
                    older = entry.parts.get(no)
                    if no != record.part_no and older is not None and older.inline is not None:
                        await self.keeper.write_now(bucket, entry, state, older)
            if self.pending.hold(entry, record):
                return record  # its record is written when the upload goes quiet
        try:
            return await self.keeper.write_now(bucket, entry, state, record)
        except BaseException:
            if record.data_key and data_loc is not None:
                await quietly(self.backend.delete(data_loc.bucket, data_loc.key))
            raise

    async def list_parts(self, bucket: str, key: str, upload_id: str) -> tuple[UploadState, list[PartRecord]]:
        state, records, _ = await self.keeper.gather(bucket, key, upload_id, None)
        return state, records

    async def complete_upload(
        self, bucket: str, key: str, upload_id: str, parts: Sequence[tuple[int, str]]
    ) -> CompletedUpload:
        """Build the final object from the listed parts, in order; the upload's state is removed after.

        A repeat of a Complete that succeeded (same key, same parts) is answered as the first was.
        """
        if not parts:
            raise errors.MalformedXML()
        entry = self.pending.get(bucket, upload_name(upload_id)) if valid_upload_id(upload_id) else None
        if entry is not None:
            async with entry.lock:  # a flush of the upload's records in flight ends first; no other starts
                entry.completing += 1
        try:
            return await self._complete(bucket, key, upload_id, parts, entry)
        except errors.NoSuchUpload:
            done = await self._completed_upload(bucket, key, upload_id, parts)
            if done is not None and done.answers(key, parts, datetime.now(UTC)):
                return done
            raise
        finally:
            if entry is not None:
                entry.completing -= 1

    async def _complete(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        parts: Sequence[tuple[int, str]],
        entry: PendingUpload | None,
    ) -> CompletedUpload:
        state = await self.keeper.upload_state(bucket, key, upload_id)
        if entry is not None and entry.closed:
            entry = None
        known = self._known_upload(bucket, state, entry, parts)
        if known is not None:
            try:
                return await self._complete_from(bucket, key, upload_id, parts, state, *known)
            except errors.InvalidPart:
                pass  # a part was sent again through another instance meanwhile: read what is stored
        if entry is not None:
            # What this instance holds is written first: a completion by copying reads it from there.
            async with entry.lock:
                await self.keeper.write_held(entry)
        state, records, keys = await self.keeper.gather(bucket, key, upload_id, parts)
        return await self._complete_from(bucket, key, upload_id, parts, state, records, keys)

    def _known_upload(
        self,
        bucket: str,
        state: UploadState,
        entry: PendingUpload | None,
        parts: Sequence[tuple[int, str]],
    ) -> tuple[list[PartRecord], list[str]] | None:
        """The records this instance holds of a straight upload and the keys it knows the upload has in
        the backend, when it holds a record of every named part (as the Complete names it); else None.

        Such a completion needs no listing: should another instance have received one of the parts again
        meanwhile, the backend upload no longer holds the part its record names and the backend's
        Complete fails (InvalidPart), and the completion starts over from a listing. Objects of the
        upload that this instance did not write (parts sent through another, or left out) are left to
        the janitor.
        """
        if entry is None or state.backend_upload is None:
            return None
        records = dict(entry.parts)
        for no, etag in parts:
            record = records.get(no)
            if record is None or record.etag != etag.strip('"'):
                return None
            if record.kept_inline and record.inline is None:  # written: its bytes from memory or by range
                info = self.layout.record(bucket, state.upload_id, no)
                records[no] = dataclasses.replace(
                    record, inline=self.keeper.inline_parts.get((info.bucket, info.key))
                )
        if not self.completion.in_place(state, [records[no] for no, _ in parts]):
            return None  # completed by copying: that needs the parts stored
        return list(records.values()), sorted(entry.written)

    async def _complete_from(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        parts: Sequence[tuple[int, str]],
        state: UploadState,
        records: Sequence[PartRecord],
        keys: Sequence[str],
    ) -> CompletedUpload:
        by_no = {r.part_no: r for r in records}
        chosen: list[PartRecord] = []
        for i, (no, etag) in enumerate(parts):
            record = by_no.get(no)
            if record is None or record.etag != etag.strip('"'):
                raise errors.InvalidPart(UploadId=upload_id, PartNumber=str(no), ETag=etag)
            if i < len(parts) - 1 and record.size < MIN_PART_SIZE:
                raise errors.EntityTooSmall(
                    ProposedSize=str(record.size),
                    MinSizeAllowed=str(MIN_PART_SIZE),
                    PartNumber=str(no),
                    ETag=etag,
                )
            chosen.append(record)
        ctx = await self.core.cpu("store", ObjectContext.from_state, state.ctx_state, self.core.keyring)
        etag = multipart_etag([r.etag for r in chosen])
        manifest = build_manifest(
            ctx,
            state.settings,
            [r.segment for r in chosen],
            etag=etag,
            md5=None,
            content_type=state.content_type,
            metadata=state.metadata,
            headers=state.headers,
        )
        dst = self.ns.object(bucket, key)
        if self.completion.in_place(state, chosen):
            info, manifest, meta = await self.completion.complete_in_place(
                bucket, dst, state, ctx, records, chosen, manifest
            )
        else:
            tail = await self.core.cpu("store", encode_tail, manifest, ctx)
            pieces = [self.completion.kept(bucket, upload_id, r) for r in chosen if r.segment.stored_size]
            meta = manifest.backend_metadata(len(tail))
            if state.backend_upload is not None:
                meta[META_UPLOAD] = upload_token(upload_id)
            try:
                info = await self.writes.assemble(dst, pieces, tail, meta, state.content_type)
            except errors.PreconditionFailed:
                # A part's record changed since it was read (the part sent again meanwhile).
                raise errors.InvalidPart(UploadId=upload_id) from None
            await quietly(self._abort_backend_upload(bucket, state))
        self.core.invalidate(bucket, key)
        self.core.cataloged(bucket, key, info, StoredObject.written(dst, info, manifest, ctx, meta))
        done = CompletedUpload(key, etag, tuple(parts), datetime.now(UTC))
        if state.backend_upload is None:
            # The record goes in before the upload's state goes: a retry finds one or the other. (The
            # object of a straight upload names its upload itself.)
            done_loc = self.layout.completed(bucket, upload_id)
            await quietly(self.backend.put(done_loc.bucket, done_loc.key, done.to_bytes()))
            await quietly(self._sweep_completed(bucket))
        await quietly(self._drop_upload(bucket, upload_id, keys))
        return done

    async def _abort_backend_upload(self, bucket: str, state: UploadState) -> None:
        if state.backend_upload is not None:
            dst = self.ns.object(bucket, state.key)
            await multipart_of(self.backend).abort_multipart(dst.bucket, dst.key, state.backend_upload)

    async def _completed_upload(
        self, bucket: str, key: str, upload_id: str, parts: Sequence[tuple[int, str]]
    ) -> CompletedUpload | None:
        """What a Complete of the upload answered, if it succeeded: for a straight upload, the object at
        `key` when that object names the upload and has the ETag these parts make; for another, the
        completed-upload record."""
        if not valid_upload_id(upload_id):
            return None
        if backend_upload_of(upload_id) is not None:
            try:
                etag = multipart_etag([e for _, e in parts])
                obj: StoredObject | None = await self.reads.resolve(bucket, key)
            except (errors.NoSuchKey, errors.InvalidPart):
                obj = None
            if obj is not None and obj.backend_metadata.get(META_UPLOAD) == upload_token(upload_id):
                if obj.etag == etag:
                    return CompletedUpload(key, etag, tuple(parts), obj.last_modified)
            if ticket_of(upload_id) is not None:
                return None  # a ticketed upload never wrote a completed-upload record
        loc = self.layout.completed(bucket, upload_id)
        try:
            _, data = await self.backend.get_bytes(loc.bucket, loc.key)
        except errors.NoSuchKey:
            return None
        try:
            return CompletedUpload.from_bytes(data)
        except (ValueError, KeyError, TypeError):
            return None

    async def _sweep_completed(self, bucket: str) -> None:
        """Delete completed-upload records past their lifetime (at most every COMPLETED_SWEEP_INTERVAL)."""
        swept = self._completed_swept
        now = time.monotonic()
        if now - swept.get(bucket, -COMPLETED_SWEEP_INTERVAL) < COMPLETED_SWEEP_INTERVAL:
            return
        swept[bucket] = now
        prefix = self.layout.completed(bucket)
        cutoff = datetime.now(UTC) - COMPLETED_UPLOAD_TTL
        token: str | None = None
        while True:
            page = await self.backend.list(prefix.bucket, prefix=prefix.key, token=token, max_keys=1000)
            old = [o.key for o in page.objects if o.last_modified < cutoff]
            if old:
                await self.backend.delete_many(prefix.bucket, old)
            if not page.is_truncated:
                break
            token = page.next_token

    async def abort_upload(self, bucket: str, key: str, upload_id: str) -> None:
        state = await self.keeper.upload_state(bucket, key, upload_id)
        entry = self.pending.get(bucket, upload_name(upload_id))
        async with holding(entry):
            gone = False
            if ticket_of(upload_id) is not None:
                # A ticketed upload is there as long as its backend upload is (some stores abort an
                # unknown upload without a word).
                try:
                    await self.keeper.backend_parts(bucket, state)
                except errors.NoSuchUpload:
                    gone = True
            await self._drop_upload(bucket, upload_id)
            if not gone:
                await quietly(self._abort_backend_upload(bucket, state))
        if gone:
            raise errors.NoSuchUpload(UploadId=upload_id)

    async def _drop_upload(self, bucket: str, upload_id: str, keys: Sequence[str] | None = None) -> None:
        """End the upload (completed or aborted: its id names no upload any more) and delete its objects:
        `keys` when the caller knows them (a part that arrives after its listing is left to the
        janitor), else as listed now."""
        self.keeper.end(bucket, upload_id)
        prefix = self.layout.upload(bucket, upload_id)
        if keys is not None:
            if keys:
                await self.backend.delete_many(prefix.bucket, keys)  # batched by the store as it can take
            return
        while True:
            page = await self.backend.list(prefix.bucket, prefix=prefix.key, max_keys=MAX_LIST_KEYS)
            keys = [o.key for o in page.objects]
            if keys:
                await self.backend.delete_many(prefix.bucket, keys)
            if not page.is_truncated or not keys:
                break

    async def list_uploads(self, bucket: str, prefix: str = "") -> list[UploadState]:
        """The uploads stored in the bucket (by their state objects) and those this instance holds whose
        state is not written yet."""
        await self.core.head_bucket(bucket)
        # Taken before the listing: an upload whose state is written while the listing runs is then in
        # one or the other (taken after, it could fall between them).
        held = [e for e in self.pending if e.bucket == bucket and not e.closed and not e.state_written]
        root = self.layout.uploads(bucket).key
        loc_bucket = self.ns.root(bucket).bucket
        names: list[str] = []
        token: str | None = None
        while True:
            page = await self.backend.list(
                loc_bucket, prefix=root, delimiter="/", token=token, max_keys=MAX_LIST_KEYS
            )
            names += [p[len(root) :].rstrip("/") for p in page.common_prefixes]
            if not page.is_truncated:
                break
            token = page.next_token

        async def load(name: str) -> UploadState | None:
            try:
                return await self.keeper.upload_state(bucket, None, name)
            except errors.NoSuchUpload:
                return None

        states = [s for s in await bounded_gather(16, names, load) if s is not None]
        stored = {upload_name(s.upload_id) for s in states}
        states += [e.state for e in held if e.name not in stored and not e.closed]
        return sorted((s for s in states if s.key.startswith(prefix)), key=lambda s: (s.key, s.initiated))


def stored_digest(segment: SegmentInfo) -> bytes:
    """The MD5 of a segment's stored chunks, which the store path computes as it seals them."""
    if segment.stored_md5 is None:
        raise errors.InternalError("a segment sealed without the MD5 of its stored chunks")
    return segment.stored_md5
