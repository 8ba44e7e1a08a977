"""An upload's state (from its state object or its id's ticket), and its part records, written late:
held while the upload is busy, written once it goes quiet.

A part that goes straight into its upload's backend upload, or a small one held for the tail, is answered
before its `.info` record is written (uploads.pending holds it). The records of an upload, and its state
object when its id carries a ticket, are written when no part has arrived or been in flight for
`upload_record_delay` seconds, when the instance stops gracefully, or at once with `upload_records =
"eager"` (and past the memory bound). The instance that took every part completes the upload without
ever writing them; another instance, or this one after a restart, completes from what is stored, and
waits up to `upload_record_delay` plus a few seconds for records another instance still holds.

The price, written in docs/OPERATIONS.md: a crash (not a graceful stop) loses the records of the parts
acknowledged in the last `upload_record_delay` of an upload still in progress; its Complete then fails
(InvalidPart, NoSuchUpload) and the client uploads again. Nothing completed is ever affected.

A record written late must not replace a newer one of the same part number written meanwhile by another
instance: before writing, the backend upload is asked which parts it holds (a record of a part sent
straight whose backend part was replaced is dropped), and a stored record written by another instance is
read and kept when it was received later than the one held here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Iterable, Sequence

from tsproxy import errors
from tsproxy.service.core import BytesLru, ServiceCore, TtlCache, bounded_gather, encode_meta_value
from tsproxy.service.uploads import tickets
from tsproxy.service.uploads.ids import backend_upload_of, ticket_of, upload_name, valid_upload_id
from tsproxy.service.uploads.layout import is_record
from tsproxy.service.uploads.pending import PendingUpload, PendingUploads
from tsproxy.service.uploads.records import PartRecord, UploadState
from tsproxy.store.base import ObjectInfo, list_everything, multipart_of

log = logging.getLogger("tsproxy.service")

# A part record's head (JSON line and segment) is read with this many bytes, which holds it whole unless
# the segment has a great many chunks; a part kept in the record after it is left for a ranged read.
RECORD_HEAD_READ = 64 * 1024
# How much longer than upload_record_delay a completion (or ListParts) waits for a record another
# instance holds: its flusher looks every eighth of the delay, and writing takes a moment. With the
# default delay the wait ends before a slow CompleteMultipartUpload is answered early (server.multipart),
# so a part that never comes is a plain 400 InvalidPart.
RECORD_WAIT_MARGIN = 1.5
FLUSH_CONCURRENCY = 8  # uploads written at once
FLUSH_RETRY_AFTER = 5.0  # seconds at least before a write the store refused is tried again
WRITE_CONCURRENCY = 16  # records of one upload written at once
# Part records (and the small parts kept in them) an instance holds unwritten, at most: past it, a part's
# record is written before its UploadPart is answered, as with upload_records = "eager".
PENDING_BYTES = 64 << 20
# Stored bytes of small multipart parts held in memory for the completion of their upload (see
# RecordKeeper.inline_parts): three or more, as each is below the backend's minimum part size.
INLINE_PARTS_BYTES = 16 << 20
# Uploads this instance completed or aborted, remembered (newest) so that their ids name no upload here
# at once, tickets and all; an older one is found gone by its backend upload (Uploads.upload_part).
ENDED_UPLOADS = 16_384


class RecordKeeper:
    """Where an upload's state and part records are: held here, written when quiet, read back with a wait."""

    def __init__(self, core: ServiceCore, upload_records: str, upload_record_delay: float) -> None:
        self.core = core
        self.backend = core.backend
        self.ns = core.ns
        self.layout = core.layout
        # (client bucket, upload id as the client spells it) -> its state, once read or its ticket checked.
        self.states: TtlCache[tuple[str, str], UploadState] = TtlCache(1024, 0)
        # (backend bucket, key of a part record) -> (its backend ETag, the record): the records this
        # instance wrote need no GET at completion while the listing shows them unchanged.
        self.part_records: TtlCache[tuple[str, str], tuple[str, PartRecord]] = TtlCache(16_384, 0)
        # The stored bytes of the newest small parts kept in those records (each below the backend's
        # minimum part size), until their upload ends: a completion by this instance needs not read
        # them back. Bounded in bytes: an upload of compressible parts makes one (below the backend's
        # minimum part size) a part, and held after their upload ended they weighed on the peak RSS.
        self.inline_parts: BytesLru[tuple[str, str]] = BytesLru(8, INLINE_PARTS_BYTES)
        # Part records acknowledged and not yet written: "deferred" holds them until an upload is quiet
        # for upload_record_delay seconds, "eager" writes each at once.
        self.upload_records = upload_records
        self.upload_record_delay = upload_record_delay
        self.pending = PendingUploads(PENDING_BYTES)
        # (client bucket, upload name) of the uploads this instance completed or aborted.
        self.ended: TtlCache[tuple[str, str], bool] = TtlCache(ENDED_UPLOADS, 0)
        self._flusher: asyncio.Task[None] | None = None

    def forget(self, bucket: str, name: str) -> None:
        """Drop what this instance remembers of the upload stored as `name` (or of that upload id): it
        completed, was aborted, or the janitor removed it."""
        name = upload_name(name)
        self.states.pop_where(lambda k: k[0] == bucket and upload_name(k[1]) == name)
        where = self.layout.upload(bucket, name)
        self.inline_parts.pop_where(lambda k: k[0] == where.bucket and k[1].startswith(where.key))
        entry = self.pending.get(bucket, name)
        if entry is not None:
            self.pending.close(entry)

    def end(self, bucket: str, upload_id: str) -> None:
        """The upload is completed or aborted: forgotten, and its id names no upload from now on (a
        ticket would still open: it says what the upload was, not that it still is)."""
        self.forget(bucket, upload_id)
        self.ended.put((bucket, upload_name(upload_id)), True)

    @property
    def defers_records(self) -> bool:
        """Whether a record may wait: records are deferred, and the flusher is there to write them."""
        running = self._flusher is not None and not self._flusher.done()
        return self.upload_records == "deferred" and running

    def start(self) -> None:
        """Start writing the records of quiet uploads in the background (with the server)."""
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_quiet_uploads())

    async def close(self) -> int:
        """Stop the background writes, then write every record held (a graceful stop). Returns how many
        records are left unwritten because the store refused them."""
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self.flush_records()
        return self.pending.records_unwritten()

    async def flush_records(self) -> None:
        """Write the records (and ticketed states) of every upload held, busy or not."""
        await bounded_gather(FLUSH_CONCURRENCY, [e for e in self.pending if e.has_unwritten], self._flush)

    async def _flush_quiet_uploads(self) -> None:
        tick = min(1.0, max(0.01, self.upload_record_delay / 8))
        while True:
            await asyncio.sleep(tick)
            due = self.pending.due(time.monotonic(), self.upload_record_delay)
            if due:
                await bounded_gather(FLUSH_CONCURRENCY, due, self._flush)

    async def _flush(self, entry: PendingUpload) -> None:
        try:
            async with entry.lock:
                if not entry.closed:
                    await self.write_held(entry)
        except Exception as e:  # the store is down or refusing: held, and tried again later
            entry.retry_after = time.monotonic() + max(self.upload_record_delay, FLUSH_RETRY_AFTER)
            fields = {
                "bucket": entry.bucket,
                "upload": entry.name,
                "records": len(entry.unwritten),
                "error": str(e),
            }
            log.warning("multipart part records not written yet", extra={"fields": fields})

    async def write_held(self, entry: PendingUpload) -> None:
        """Write the upload's state (unless stored already) and its held records, but none that a newer
        record or backend part replaced. The caller holds `entry.lock`."""
        bucket, state = entry.bucket, entry.state
        held = [entry.parts[no] for no in sorted(entry.unwritten)]
        if not held and entry.state_written:
            return
        prefix = self.layout.upload(bucket, state.upload_id)
        listed = {o.key: o for o in await list_everything(self.backend, prefix.bucket, prefix.key)}
        backend_parts: dict[int, set[str]] | None = None
        if state.backend_upload is not None:
            try:
                backend_parts = await self.backend_parts(bucket, state)
            except errors.NoSuchUpload:
                # Completed or aborted through another instance: nothing of it is written any more.
                fields = {"bucket": bucket, "upload": entry.name, "records": len(held)}
                log.info("multipart upload gone; held records dropped", extra={"fields": fields})
                self.pending.close(entry)
                return
        if not entry.state_written:
            loc = self.layout.state(bucket, state.upload_id)
            if loc.key not in listed:
                await self.put_state(bucket, state)
            self.pending.state_stored(entry, loc.key)

        async def write(record: PartRecord) -> None:
            if backend_parts is not None and not _held_by(record, backend_parts):
                self.pending.superseded(entry, record)
                return
            loc = self.layout.record(bucket, state.upload_id, record.part_no)
            seen = listed.get(loc.key)
            mine = self.part_records.get((loc.bucket, loc.key))
            if seen is not None and (mine is None or mine[0] != seen.etag):
                # Another instance wrote this part number: the part received last is the part.
                stored = await self.load_record(loc.bucket, seen)
                if stored.newness > record.newness:
                    self.pending.superseded(entry, record)
                    return
            await self.put_record(bucket, entry, state, record)

        await bounded_gather(WRITE_CONCURRENCY, held, write)

    async def write_now(
        self, bucket: str, entry: PendingUpload | None, state: UploadState, record: PartRecord
    ) -> PartRecord:
        """Write a record before its part is answered (eager records, the bound reached, parts kept as
        objects of their own), the upload's state first when it is not stored yet."""
        if entry is not None and not entry.state_written:
            async with entry.lock:
                if not entry.state_written:
                    await self.put_state(bucket, state)
                    self.pending.state_stored(entry, self.layout.state(bucket, state.upload_id).key)
        return await self.put_record(bucket, entry, state, record)

    async def put_state(self, bucket: str, state: UploadState) -> None:
        loc = self.layout.state(bucket, state.upload_id)
        meta = {"tsproxy-key": encode_meta_value(state.key)}
        await self.backend.put(loc.bucket, loc.key, state.to_bytes(), metadata=meta)

    async def put_record(
        self, bucket: str, entry: PendingUpload | None, state: UploadState, record: PartRecord
    ) -> PartRecord:
        loc = self.layout.record(bucket, state.upload_id, record.part_no)
        written = await self.backend.put(loc.bucket, loc.key, record.to_bytes())
        self.part_records.put((loc.bucket, loc.key), (written.etag, record_alone(record, written.etag)))
        if record.inline is not None:
            self.inline_parts.put((loc.bucket, loc.key), record.inline)
        if entry is not None:
            self.pending.wrote(entry, record, loc.key, written.etag)
        return dataclasses.replace(record, record_etag=written.etag)

    async def backend_parts(self, bucket: str, state: UploadState) -> dict[int, set[str]]:
        """The ETags of the parts the upload's backend upload holds, by part number (NoSuchUpload once
        it is completed or aborted)."""
        assert state.backend_upload is not None
        dst = self.ns.object(bucket, state.key)
        parts: dict[int, set[str]] = {}
        for no, etag in await multipart_of(self.backend).list_parts(
            dst.bucket, dst.key, state.backend_upload
        ):
            parts.setdefault(no, set()).add(etag)
        return parts

    # -- an upload's state: its state object, or its id's ticket ---------------------------------

    async def upload_state(self, bucket: str, key: str | None, upload_id: str) -> UploadState:
        if self.ended.get((bucket, upload_name(upload_id))):
            raise errors.NoSuchUpload(UploadId=upload_id)
        state = self.states.get((bucket, upload_id))
        if state is None:
            if not valid_upload_id(upload_id):
                raise errors.NoSuchUpload(UploadId=upload_id)
            ticket = ticket_of(upload_id)
            if ticket is not None:
                state = await self._ticket_state(bucket, key, upload_id, ticket)
            else:
                loc = self.layout.state(bucket, upload_id)
                try:
                    _, data = await self.backend.get_bytes(loc.bucket, loc.key)
                except errors.NoSuchKey:
                    raise errors.NoSuchUpload(UploadId=upload_id) from None
                state = UploadState.from_bytes(data)
            self.states.put((bucket, upload_id), state)
        if key is not None and state.key != key:
            raise errors.NoSuchUpload(UploadId=upload_id)
        return state

    async def _ticket_state(self, bucket: str, key: str | None, upload_id: str, ticket: bytes) -> UploadState:
        """The state an upload id's ticket carries, once it is found to be this upload's own; anything
        else (changed, moved to another key, stripped of its encryption) names no upload."""
        backend_upload = backend_upload_of(upload_id)
        if key is None or backend_upload is None:
            raise errors.NoSuchUpload(UploadId=upload_id)
        try:
            opened, _ = await self.core.cpu(
                "store",
                lambda: tickets.open_ticket(
                    ticket,
                    bucket,
                    key,
                    upload_name(upload_id),
                    self.core.keyring,
                    require_encryption=self.core.settings.encryption,
                ),
            )
        except tickets.TicketRefused as e:
            log.info("upload ticket refused", extra={"fields": {"bucket": bucket, "reason": str(e)}})
            raise errors.NoSuchUpload(UploadId=upload_id) from None
        return UploadState(
            upload_id,
            key,
            opened.ctx_state,
            opened.settings,
            opened.content_type,
            {},
            {},
            opened.initiated,
            backend_upload,
        )

    # -- reading an upload's records -------------------------------------------------------------

    async def load_record(self, backend_bucket: str, o: ObjectInfo) -> PartRecord:
        """A stored record by its listing: from memory when this instance wrote it and it is unchanged,
        else its head only (a part kept inside it is read by range when needed, so a completion of many
        small parts does not hold them all at once)."""
        where = (backend_bucket, o.key)
        known = self.part_records.get(where)
        if known is not None and known[0] == o.etag:
            inline = self.inline_parts.get(where) if known[1].kept_inline else None
            return dataclasses.replace(known[1], last_modified=o.last_modified, inline=inline)
        record: PartRecord | None = None
        try:
            info, data = await self.backend.get_bytes(
                backend_bucket, o.key, 0, min(o.size, RECORD_HEAD_READ) - 1, if_match=o.etag
            )
            record = PartRecord.from_head(data, o.size, o.last_modified, info.etag)
        except errors.PreconditionFailed:
            pass  # the part was sent again since the listing: read the record there now
        if record is None:  # (or a head longer than the first read)
            info, data = await self.backend.get_bytes(backend_bucket, o.key)
            whole = PartRecord.from_bytes(data, o.last_modified, info.etag)
            record = dataclasses.replace(whole, inline=None)
        return record

    async def gather(
        self, bucket: str, key: str, upload_id: str, named: Sequence[tuple[int, str]] | None
    ) -> tuple[UploadState, list[PartRecord], list[str]]:
        """The upload's state, the current record of each part number (stored, or held here) and every
        key it holds in the backend.

        When a part named (`named`; for a listing, a part the backend upload holds) has no record yet,
        another instance may still hold it: the upload is listed again, with a short backoff, for up to
        `upload_record_delay` plus RECORD_WAIT_MARGIN seconds before the caller gets what there is.
        """
        state = await self.upload_state(bucket, key, upload_id)
        entry = self.pending.get(bucket, upload_name(upload_id))
        deadline = time.monotonic() + self.upload_record_delay + RECORD_WAIT_MARGIN
        pause = 0.05
        prefix = self.layout.upload(bucket, upload_id)
        while True:
            listed = await list_everything(self.backend, prefix.bucket, prefix.key)
            infos = [o for o in listed if is_record(o.key)]
            stored = await bounded_gather(16, infos, lambda o: self.load_record(prefix.bucket, o))
            backend_parts = await self.backend_parts(bucket, state) if state.backend_upload else None
            own = entry.parts.values() if entry is not None and not entry.closed else ()
            records = current_records([*stored, *own], backend_parts)
            done = not self.defers_records or not lacking(records, named, backend_parts)
            if done or time.monotonic() >= deadline:
                return state, sorted(records.values(), key=lambda r: r.part_no), [o.key for o in listed]
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)


def _held_by(record: PartRecord, backend_parts: dict[int, set[str]]) -> bool:
    """Whether the backend upload still holds the part a record of a straight part names."""
    return record.backend_etag is None or record.backend_etag in backend_parts.get(record.part_no, ())


def current_records(
    records: Iterable[PartRecord], backend_parts: dict[int, set[str]] | None
) -> dict[int, PartRecord]:
    """Of several records of each part number, the one received last, among those whose backend part
    (for a part sent straight) the backend upload still holds; later ones win ties (this instance's own,
    which may hold the part's bytes, come last)."""
    best: dict[int, PartRecord] = {}
    for r in records:
        if backend_parts is not None and not _held_by(r, backend_parts):
            continue
        current = best.get(r.part_no)
        if current is None or r.newness >= current.newness:
            best[r.part_no] = r
    return best


def lacking(
    records: dict[int, PartRecord],
    named: Sequence[tuple[int, str]] | None,
    backend_parts: dict[int, set[str]] | None,
) -> bool:
    """Whether a part named (with its ETag) has no record, or, for a listing, a part the backend upload
    holds has none."""
    if named is not None:
        return any(no not in records or records[no].etag != etag.strip('"') for no, etag in named)
    return backend_parts is not None and any(no not in records for no in backend_parts)


def record_alone(record: PartRecord, record_etag: str | None = None) -> PartRecord:
    """A part record without the stored bytes it may keep (what is remembered of a written record)."""
    return dataclasses.replace(record, inline=None, record_etag=record_etag or record.record_etag)


@contextlib.asynccontextmanager
async def holding(entry: PendingUpload | None) -> AsyncIterator[None]:
    """The upload's lock, when this instance holds anything of it."""
    if entry is None:
        yield
    else:
        async with entry.lock:
            yield
