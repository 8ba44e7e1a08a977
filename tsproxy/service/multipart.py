"""Multipart uploads: each client part a segment of its own.

A part whose stored form is at least the backend's minimum part size goes straight into a backend
multipart upload at the object's own key, begun with the client's upload, as the backend part of the
same number; at completion only the tail is uploaded (with a small last part, as a part after the last
one named) and the backend upload completed, so the backend receives every stored byte once. A smaller
part (the last one, or one that compression shrank) is kept inside its part record, and an oversized
one as an object of its own, until completion, which re-uploads or copies them into place. Each part's
record is written before its UploadPart is answered, so any instance, or this one after a restart, can
complete the upload; the instance that received the parts completes it without reading any of them
back. docs/FORMAT.md describes the objects an upload keeps in the reserved namespace.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from tsproxy import errors
from tsproxy.format import (
    ObjectContext,
    SegmentInfo,
    build_manifest,
    encode_tail,
)
from tsproxy.s3.limits import MAX_LIST_KEYS, MAX_PARTS, MIN_PART_SIZE, check_part_number
from tsproxy.service.completion import META_UPLOAD, CompletionOps, straight_metadata
from tsproxy.service.core import (
    bounded_gather,
    buffer_head,
    chain,
    encode_meta_value,
    quietly,
)
from tsproxy.service.namespace import Location
from tsproxy.service.records import (
    MAX_UPLOAD_ID,
    PartRecord,
    StoredObject,
    UploadState,
    backend_upload_of,
    straight_upload_id,
    upload_token,
)
from tsproxy.store.base import MultipartCapable, ObjectInfo, list_everything, multipart_etag, multipart_of

# A part record's head (JSON line and segment) is read with this many bytes, which holds it whole unless
# the segment has a great many chunks; a part kept in the record after it is left for a ranged read.
RECORD_HEAD_READ = 64 * 1024
# How long a completed upload answers a repeated CompleteMultipartUpload as the first one was answered
# (SDKs repeat a Complete whose answer they did not get), and how often each instance deletes the
# records older than that.
COMPLETED_UPLOAD_TTL = timedelta(hours=1)
COMPLETED_SWEEP_INTERVAL = 600.0


@dataclass(frozen=True)
class CompletedUpload:
    """What a CompleteMultipartUpload answered, kept for COMPLETED_UPLOAD_TTL to answer a retry alike."""

    key: str
    etag: str
    parts: tuple[tuple[int, str], ...]  # the request's (part number, ETag) list
    completed: datetime

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "key": self.key,
                "etag": self.etag,
                "parts": [list(p) for p in self.parts],
                "completed": self.completed.isoformat(),
            }
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> CompletedUpload:
        f = json.loads(data)
        parts = tuple((int(no), str(etag)) for no, etag in f["parts"])
        return cls(f["key"], f["etag"], parts, datetime.fromisoformat(f["completed"]))

    def answers(self, key: str, parts: Sequence[tuple[int, str]], now: datetime) -> bool:
        """Whether a Complete of `key` with `parts` repeats this one, within its lifetime."""
        return key == self.key and tuple(parts) == self.parts and now - self.completed < COMPLETED_UPLOAD_TTL


class UploadOps(CompletionOps):
    """Create, fill, list, complete and abort multipart uploads."""

    # -- multipart uploads -----------------------------------------------------------------------

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
            await self.head_bucket(bucket)  # else the backend upload's creation says NoSuchBucket
        ctx = await self._cpu("store", ObjectContext.new, self.settings, self.keyring)
        token = secrets.token_urlsafe(24)
        upload_id, backend_upload = token, None
        if straight:
            # Parts go straight into this upload; until it completes nothing is visible at the key.
            dst = self.ns.object(bucket, key)
            backend_upload = await multipart_of(self.backend).create_multipart(
                dst.bucket, dst.key, metadata=straight_metadata(token), content_type=content_type
            )
            upload_id = straight_upload_id(token, backend_upload)
        state = UploadState(
            upload_id,
            key,
            ctx.to_state(),
            self.settings,
            content_type,
            dict(metadata),
            dict(headers),
            datetime.now(UTC),
            backend_upload,
        )
        loc = self._upload_loc(bucket, upload_id, "state")
        try:
            await self.backend.put(
                loc.bucket, loc.key, state.to_bytes(), metadata={"tsproxy-key": encode_meta_value(key)}
            )
        except BaseException:
            await quietly(self._abort_backend_upload(bucket, state))
            raise
        self._uploads.put(upload_id, state)
        return upload_id

    async def _upload_state(self, bucket: str, key: str | None, upload_id: str) -> UploadState:
        state = self._uploads.get(upload_id)
        if state is None:
            if not upload_id or "/" in upload_id or len(upload_id) > MAX_UPLOAD_ID:
                raise errors.NoSuchUpload(UploadId=upload_id)
            loc = self._upload_loc(bucket, upload_id, "state")
            try:
                _, data = await self.backend.get_bytes(loc.bucket, loc.key)
            except errors.NoSuchKey:
                raise errors.NoSuchUpload(UploadId=upload_id) from None
            state = UploadState.from_bytes(data)
            self._uploads.put(upload_id, state)
        if key is not None and state.key != key:
            raise errors.NoSuchUpload(UploadId=upload_id)
        return state

    async def upload_part(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_no: int,
        payload: AsyncIterable[bytes | memoryview],
        *,
        content_md5: bytes | None = None,
    ) -> PartRecord:
        """Transform one client part as its own segment and keep it until the upload completes.

        content_md5: the client's Content-MD5, checked against the transform's own MD5 of the part
        (BadDigest, and nothing kept, when they differ).
        """
        check_part_number(part_no)
        state = await self._upload_state(bucket, key, upload_id)
        ctx = await self._cpu("store", ObjectContext.from_state, state.ctx_state, self.keyring)
        # A resent part goes to a fresh data object; the .info written after it switches over atomically.
        data_loc = self._upload_loc(bucket, upload_id, f"{part_no:05d}-{secrets.token_hex(8)}")
        result: dict[str, SegmentInfo] = {}

        async def stored() -> AsyncIterator[bytes]:
            async for item in self._encode(
                ctx, state.settings, part_no, payload, object_start=part_no == 1, expected_md5=content_md5
            ):
                if isinstance(item, SegmentInfo):
                    result["segment"] = item
                else:
                    yield item

        record: PartRecord | None = None
        if state.backend_upload is not None:
            # Held whole up to one backend part (as a streamed PUT holds one): then it is known whether
            # it is big enough to be a backend part of its own.
            head, rest = await buffer_head(stored(), self.part_size)
            backend = multipart_of(self.backend)
            if rest is None:
                seg, modified = result["segment"], datetime.now(UTC)
                if len(head) >= backend.min_part_size and part_no < MAX_PARTS:
                    dst = self.ns.object(bucket, key)
                    etag = await backend.upload_part(
                        dst.bucket, dst.key, state.backend_upload, part_no, head, content_md5=seg.stored_md5
                    )
                    record = PartRecord(part_no, seg.md5.hex(), seg.original_size, "", seg, modified, etag)
                elif len(head) < backend.min_part_size:
                    # Too small to be a backend part but the last: kept in its record (one PUT).
                    record = PartRecord(
                        part_no, seg.md5.hex(), seg.original_size, "", seg, modified, None, head
                    )
            if record is None:
                body: bytes | AsyncIterator[bytes] = head if rest is None else chain(head, rest)
                info = await self.backend.put(data_loc.bucket, data_loc.key, body)
        else:
            info = await self.backend.put(data_loc.bucket, data_loc.key, stored())
        if record is None:
            seg = result["segment"]
            record = PartRecord(
                part_no, seg.md5.hex(), seg.original_size, data_loc.key, seg, info.last_modified
            )
        info_loc = self._upload_loc(bucket, upload_id, f"{part_no:05d}.info")
        try:
            written = await self.backend.put(info_loc.bucket, info_loc.key, record.to_bytes())
        except BaseException:
            if record.data_key:
                await quietly(self.backend.delete(data_loc.bucket, data_loc.key))
            raise
        record = dataclasses.replace(record, record_etag=written.etag)
        self._part_records.put((info_loc.bucket, info_loc.key), (written.etag, record_alone(record)))
        if record.inline is not None:
            self._inline_parts.put((info_loc.bucket, info_loc.key), record.inline)
        return record

    async def list_parts(self, bucket: str, key: str, upload_id: str) -> tuple[UploadState, list[PartRecord]]:
        state, records, _ = await self._list_upload(bucket, key, upload_id)
        return state, records

    async def _list_upload(
        self, bucket: str, key: str, upload_id: str
    ) -> tuple[UploadState, list[PartRecord], list[str]]:
        """The upload's state, its parts' records (by part number) and every key it holds."""
        state = await self._upload_state(bucket, key, upload_id)
        prefix = self._upload_loc(bucket, upload_id)
        listed = await list_everything(self.backend, prefix.bucket, prefix.key)

        async def load(o: ObjectInfo) -> PartRecord:
            where = (prefix.bucket, o.key)
            known = self._part_records.get(where)
            if known is not None and known[0] == o.etag:
                # Written by this instance and unchanged: a part it keeps comes from memory if still
                # there, else by a ranged read when it is needed.
                inline = self._inline_parts.get(where) if known[1].kept_inline else None
                return dataclasses.replace(known[1], last_modified=o.last_modified, inline=inline)
            # The record's head only: a part kept inside it is read (by range) when it is needed, so a
            # completion of many small parts does not hold them all at once.
            record: PartRecord | None = None
            try:
                info, data = await self.backend.get_bytes(
                    prefix.bucket, o.key, 0, min(o.size, RECORD_HEAD_READ) - 1, if_match=o.etag
                )
                record = PartRecord.from_head(data, o.size, o.last_modified, info.etag)
            except errors.PreconditionFailed:
                pass  # the part was sent again since the listing: read the record there now
            if record is None:  # (or a head longer than the first read)
                info, data = await self.backend.get_bytes(prefix.bucket, o.key)
                whole = PartRecord.from_bytes(data, o.last_modified, info.etag)
                record = dataclasses.replace(whole, inline=None)
            return record

        records = await bounded_gather(16, [o for o in listed if o.key.endswith(".info")], load)
        return state, sorted(records, key=lambda r: r.part_no), [o.key for o in listed]

    def _completed_loc(self, bucket: str, upload_id: str = "") -> Location:
        return self.ns.internal(bucket, f"mpu-done/{upload_id}")

    async def complete_upload(
        self, bucket: str, key: str, upload_id: str, parts: Sequence[tuple[int, str]]
    ) -> CompletedUpload:
        """Build the final object from the listed parts, in order; the upload's state is removed after.

        A repeat of a Complete that succeeded (same key, same parts) is answered as the first was.
        """
        if not parts:
            raise errors.MalformedXML()
        known = self._known_upload(bucket, key, upload_id, parts)
        if known is not None:
            try:
                return await self._complete_from(bucket, key, upload_id, parts, *known)
            except errors.InvalidPart:
                pass  # a part was sent again through another instance meanwhile: read what is stored
        try:
            state, records, keys = await self._list_upload(bucket, key, upload_id)
        except errors.NoSuchUpload:
            done = await self._completed_upload(bucket, key, upload_id, parts)
            if done is not None and done.answers(key, parts, datetime.now(UTC)):
                return done
            raise
        return await self._complete_from(bucket, key, upload_id, parts, state, records, keys)

    def _known_upload(
        self, bucket: str, key: str, upload_id: str, parts: Sequence[tuple[int, str]]
    ) -> tuple[UploadState, list[PartRecord], list[str]] | None:
        """The state, the named parts' records and the keys of a straight upload whose named parts this
        instance received (as the Complete names them, and at least one sent straight), or None.

        Such a completion needs no listing: should another instance have received one of the parts again
        meanwhile, the backend upload no longer holds the part its record names and the backend's
        Complete fails (InvalidPart), and the completion starts over from a listing. Objects of the
        upload that this instance did not write (parts sent through another, or left out) are left to
        the janitor.
        """
        state = self._uploads.get(upload_id)
        if state is None or state.key != key or state.backend_upload is None:
            return None
        records: list[PartRecord] = []
        keys = [self._upload_loc(bucket, upload_id, "state").key]
        for no, etag in parts:
            loc = self._upload_loc(bucket, upload_id, f"{no:05d}.info")
            known = self._part_records.get((loc.bucket, loc.key))
            if known is None or known[1].etag != etag.strip('"'):
                return None
            record = known[1]
            if record.kept_inline:  # its bytes from memory when still there, else read by range
                record = dataclasses.replace(record, inline=self._inline_parts.get((loc.bucket, loc.key)))
            records.append(record)
            keys += [loc.key, record.data_key] if record.data_key else [loc.key]
        if not self._in_place(state, records):
            return None  # completed by copying: that needs to know the parts are still there
        return state, records, keys

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
        ctx = await self._cpu("store", ObjectContext.from_state, state.ctx_state, self.keyring)
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
        if self._in_place(state, chosen):
            info, manifest, meta = await self._complete_in_place(
                bucket, dst, state, ctx, records, chosen, manifest
            )
        else:
            tail = await self._cpu("store", encode_tail, manifest, ctx)
            pieces = [self._kept(bucket, upload_id, r) for r in chosen if r.segment.stored_size]
            meta = manifest.backend_metadata(len(tail))
            if state.backend_upload is not None:
                meta[META_UPLOAD] = upload_token(upload_id)
            try:
                info = await self.assemble(dst, pieces, tail, meta, state.content_type)
            except errors.PreconditionFailed:
                # A part's record changed since it was read (the part sent again meanwhile).
                raise errors.InvalidPart(UploadId=upload_id) from None
            await quietly(self._abort_backend_upload(bucket, state))
        self.invalidate(bucket, key)
        self.cataloged(bucket, key, info, StoredObject.written(dst, info, manifest, ctx, meta))
        done = CompletedUpload(key, etag, tuple(parts), datetime.now(UTC))
        if state.backend_upload is None:
            # The record goes in before the upload's state goes: a retry finds one or the other. (The
            # object of a straight upload names its upload itself.)
            done_loc = self._completed_loc(bucket, upload_id)
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
        if not upload_id or "/" in upload_id or len(upload_id) > MAX_UPLOAD_ID:
            return None
        if backend_upload_of(upload_id) is not None:
            try:
                etag = multipart_etag([e for _, e in parts])
                obj: StoredObject | None = await self.resolve(bucket, key)
            except (errors.NoSuchKey, errors.InvalidPart):
                obj = None
            if obj is not None and obj.backend_metadata.get(META_UPLOAD) == upload_token(upload_id):
                if obj.etag == etag:
                    return CompletedUpload(key, etag, tuple(parts), obj.last_modified)
        loc = self._completed_loc(bucket, upload_id)
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
        swept: dict[str, float] = self.__dict__.setdefault("_completed_swept", {})
        now = time.monotonic()
        if now - swept.get(bucket, -COMPLETED_SWEEP_INTERVAL) < COMPLETED_SWEEP_INTERVAL:
            return
        swept[bucket] = now
        prefix = self._completed_loc(bucket)
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
        state = await self._upload_state(bucket, key, upload_id)
        await self._drop_upload(bucket, upload_id)
        await quietly(self._abort_backend_upload(bucket, state))

    async def _drop_upload(self, bucket: str, upload_id: str, keys: Sequence[str] | None = None) -> None:
        """Delete the upload's objects: `keys` when the caller has just listed them, else as listed now
        (a part that arrives after that listing is left to the janitor)."""
        self._uploads.pop(upload_id)
        prefix = self._upload_loc(bucket, upload_id)
        if keys is not None:
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
        await self.head_bucket(bucket)
        root = self._upload_loc(bucket, "").key.rstrip("/") + "/"
        loc_bucket = self.ns.root(bucket).bucket
        ids: list[str] = []
        token: str | None = None
        while True:
            page = await self.backend.list(
                loc_bucket, prefix=root, delimiter="/", token=token, max_keys=MAX_LIST_KEYS
            )
            ids += [p[len(root) :].rstrip("/") for p in page.common_prefixes]
            if not page.is_truncated:
                break
            token = page.next_token

        async def load(upload_id: str) -> UploadState | None:
            try:
                return await self._upload_state(bucket, None, upload_id)
            except errors.NoSuchUpload:
                return None

        states = [s for s in await bounded_gather(16, ids, load) if s is not None]
        return sorted((s for s in states if s.key.startswith(prefix)), key=lambda s: (s.key, s.initiated))


def record_alone(record: PartRecord) -> PartRecord:
    """A part record without the stored bytes it may keep (what the record cache holds)."""
    return dataclasses.replace(record, inline=None) if record.inline is not None else record
