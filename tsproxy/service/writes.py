"""Writing objects: PutObject through the transform, delete, server-side copy and assembly, rewrap."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import math
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from tsproxy import errors
from tsproxy.format import (
    ChunkCut,
    Manifest,
    ObjectContext,
    SegmentEncoder,
    SegmentInfo,
    TransformSettings,
    build_manifest,
    encode_tail,
)
from tsproxy.format import rewrap as rewrap_manifest
from tsproxy.format.digests import BoundedMD5
from tsproxy.format.manifest import META_FORMAT, META_SIZE
from tsproxy.s3.limits import MAX_PARTS
from tsproxy.service.core import (
    SMALL_OBJECT,
    ServiceCore,
    bounded_gather,
    buffer_head,
    chain,
    encode_meta_value,
    quietly,
)
from tsproxy.service.lane import Lane
from tsproxy.service.namespace import Location
from tsproxy.service.reads import Reads
from tsproxy.service.receive import BATCH_SIZE, BATCHES_AHEAD, PayloadBatches, batch_size
from tsproxy.service.records import (
    ByteRange,
    StoredObject,
)
from tsproxy.store.base import ObjectInfo, multipart_of

# Deleted objects whose stored version one DeleteObjects looks up at once (to drop their cached chunks).
FORGET_LOOKUPS = 8
# Chunks of one segment sealed at once, on any of the CPU pool's threads, beside the lane. On two cores a
# broker's one-part-at-a-time upload is CPU-bound (client, event loop, store and the two threads share
# them) and gains nothing over one; a single large PutObject gains a little, and more cores are there
# for the taking (README, "Figures behind the code's constants"). Each holds its chunk's batch until it
# is sealed, so a request holds at most this many batches beyond those waiting (BATCHES_AHEAD).
SEALS_AHEAD = 2
# Functions waiting in each lane (the payload's MD5 steps hold their batch, records their stored chunk):
# enough that sealing seldom waits for them, few enough that each holds a couple of batches at most: two
# lanes peak no higher than one did (benchmarks/proxy.py).
LANE_AHEAD = 4

log = logging.getLogger("tsproxy.service")


class Writes:
    """Store, copy, delete and rewrap objects (the write half of the objects part)."""

    def __init__(self, core: ServiceCore, reads: Reads) -> None:
        self.core = core
        self.reads = reads
        self.backend = core.backend
        self.ns = core.ns
        self.metrics = core.metrics
        self.part_size = core.part_size

    async def encode(
        self,
        ctx: ObjectContext,
        settings: TransformSettings,
        segment_no: int,
        payload: AsyncIterable[bytes | memoryview],
        *,
        object_start: bool = True,
        expected_md5: bytes | None = None,
        stored_md5: Any = None,
        on_encoder: Callable[[SegmentEncoder], None] | None = None,
    ) -> AsyncIterator[bytes | SegmentInfo]:
        """Transform a payload stream into stored chunks; the last item yielded is the SegmentInfo.

        object_start: the payload is the start of the object (PutObject, part 1), so the `auto`
        compression probe looks for a Kafka batch at its first byte rather than anywhere near its start.
        expected_md5: the client's Content-MD5; BadDigest is raised when the payload's MD5 differs, before
        the last chunk is yielded, so a consumer storing the chunks aborts and nothing is stored.
        stored_md5: a hashlib MD5 object to feed the stored chunks to (the caller goes on with what it
        stores after them); by default one of the segment's own. Either way SegmentInfo.stored_md5 is
        the MD5 of the chunks, so the backend need not hash them again.
        on_encoder: given the segment's encoder as it is made, so the caller can ask it (between chunks)
        what it has decided, e.g. whether the stored size is known before the chunks are.

        The stages overlap, on the event loop and the CPU pool's threads: a task receives the payload
        into batches of whole chunks ahead of the transform (at most BATCHES_AHEAD wait); each batch's
        chunks are cut in order and sealed (zstd, AES-GCM), up to SEALS_AHEAD at once on any thread;
        beside them one lane hashes the payload batch by batch and another records the sealed chunks in
        order (their sizes, the MD5 of the stored bytes), each one thread at a time; the chunks go to the
        consumer in order as soon as they are sealed, whose sending (however slow) holds back only what
        was already received. The first error of any stage (a failed body check, a client gone, a transform
        error) ends the stream with that error.
        """
        md5 = hashlib.md5(usedforsecurity=False)
        encoder = SegmentEncoder(
            ctx,
            settings,
            segment_no,
            object_start=object_start,
            hash_payload=False,
            stored_md5=hashlib.md5(usedforsecurity=False) if stored_md5 is None else stored_md5,
        )
        if on_encoder is not None:
            on_encoder(encoder)
        batches = PayloadBatches(payload, batch_size(settings.chunk_size), BATCHES_AHEAD)
        # Batches of whole chunks are cut into views of them, on the loop; a chunk larger than a batch is
        # gathered from several by a copy, which is the pool's work.
        gathered = settings.chunk_size > BATCH_SIZE
        run = functools.partial(self.core.cpu, "store")
        # Two lanes, so the payload's MD5 and the stored bytes' (fed by the records) run on two threads at
        # once: each is a full pass over its bytes, and an uncompressed part has as many stored bytes as
        # payload.
        hashing, lane = Lane(run, LANE_AHEAD), Lane(run, LANE_AHEAD)
        sealing: deque[tuple[ChunkCut, asyncio.Future[bytes]]] = deque()
        original = stored = 0

        def seal(cut: ChunkCut) -> None:
            sealing.append((cut, asyncio.ensure_future(self.core.cpu("store", encoder.seal, cut))))

        async def sealed() -> bytes:
            # The oldest chunk, in order; recorded down the lane behind everything before it.
            cut, future = sealing.popleft()
            chunk = await future
            await lane.submit(encoder.record, cut.chunk_no, chunk)
            return chunk

        try:
            while (batch := await batches.next()) is not None:
                original += len(batch)
                await hashing.submit(md5.update, batch)
                cuts = await self.core.cpu("store", encoder.cut, batch) if gathered else encoder.cut(batch)
                for cut in cuts:
                    while len(sealing) >= SEALS_AHEAD:
                        chunk = await sealed()
                        stored += len(chunk)
                        yield chunk
                    seal(cut)
                while sealing and sealing[0][1].done():
                    chunk = await sealed()
                    stored += len(chunk)
                    yield chunk
            for cut in encoder.cut_last():  # sealed while the payload's MD5 is finished
                seal(cut)
            digest = await (await hashing.submit(md5.digest))
            if expected_md5 is not None and digest != expected_md5:
                raise errors.BadDigest()
            while sealing:
                chunk = await sealed()
                stored += len(chunk)
                yield chunk
            info = await (await lane.submit(encoder.conclude, digest))
        finally:
            for _, future in sealing:
                future.cancel()
            await hashing.close()
            await lane.close()
            await batches.close()
        if self.metrics is not None:
            self.metrics.transform_original_bytes.inc(original)
            self.metrics.transform_stored_bytes.inc(stored)
        yield info

    async def put(
        self,
        bucket: str,
        key: str,
        payload: AsyncIterable[bytes | memoryview],
        *,
        content_type: str | None,
        metadata: Mapping[str, str],
        headers: Mapping[str, str],
        size_hint: int | None = None,
        etag: str | None = None,
        content_md5: bytes | None = None,
    ) -> StoredObject:
        """Store a whole object from a payload stream (PutObject). Nothing is visible unless it completes.

        `etag` keeps a given ETag instead of the payload's MD5 (migrating an object keeps the ETag its
        clients already saw). `content_md5`: the client's Content-MD5, checked against the MD5 the
        transform computes anyway (BadDigest, nothing stored), so the payload need not be hashed twice.
        """
        await self.core.check_bucket(bucket)  # before a byte of the payload is read
        loc = self.ns.object(bucket, key)
        settings = self.core.settings
        ctx = await self.core.cpu("store", ObjectContext.new, settings, self.core.keyring)
        result: dict[str, Any] = {}
        # The MD5 of the stored object (chunks, then tail), hashed as it is made: the backend's
        # Content-MD5 of an object it gets in one request is then no pass over it once it is whole. Only
        # as far as the backend would send it in one request (see BoundedMD5).
        encoders: list[SegmentEncoder] = []

        def stored_size() -> int | None:
            # The chunks' stored size, once the encoder knows it (a lower bound of the object's).
            if size_hint is None or not encoders:
                return None
            return encoders[0].stored_size_if_raw(size_hint)

        stored_md5 = BoundedMD5(getattr(self.backend, "whole_md5_limit", None), stored_size)

        async def stored() -> AsyncGenerator[bytes, None]:
            async for item in self.encode(
                ctx,
                settings,
                1,
                payload,
                expected_md5=content_md5,
                stored_md5=stored_md5,
                on_encoder=encoders.append,
            ):
                if isinstance(item, SegmentInfo):
                    result["segment"] = item
                else:
                    yield item
            seg: SegmentInfo = result["segment"]
            manifest = build_manifest(
                ctx,
                settings,
                [seg],
                etag=etag or seg.md5.hex(),
                md5=seg.md5,
                content_type=content_type,
                metadata=metadata,
                headers=headers,
            )
            tail = await self.core.cpu("store", encode_tail, manifest, ctx)
            result["manifest"], result["tail"] = manifest, len(tail)
            stored_md5.update(tail)  # (the chunks are all in it: _encode has recorded them)
            yield tail

        # Small objects are buffered whole so their backend metadata can carry size and ETag; larger
        # ones stream, and the size/ETag are found in their tail (HEAD then costs one ranged GET).
        body = stored()
        try:
            buffered, stream = await buffer_head(body, min(self.part_size, SMALL_OBJECT))
            if stream is None:
                manifest = result["manifest"]
                meta = manifest.backend_metadata(result["tail"])
                info = await self.backend.put(
                    loc.bucket,
                    loc.key,
                    buffered,
                    metadata=meta,
                    content_type=content_type,
                    content_md5=stored_md5.digest(),  # None: beyond one request, hashed in parts
                )
            else:
                meta = {META_FORMAT: str(settings.format_version)}
                if size_hint is not None:
                    meta[META_SIZE] = str(size_hint)
                info = await self.backend.put(
                    loc.bucket,
                    loc.key,
                    chain(buffered, stream),
                    metadata=meta,
                    content_type=content_type,
                    content_md5=stored_md5.whole,  # asked for once the stream has ended, if it fits
                )
                manifest = result["manifest"]
        finally:
            # A failed or abandoned upload stops its receiving and transforming now, not at collection.
            await body.aclose()
        self.core.invalidate(bucket, key)
        return self.core.cataloged(bucket, key, info, StoredObject.written(loc, info, manifest, ctx, meta))

    async def delete(self, bucket: str, key: str) -> None:
        await self.core.check_bucket(bucket)
        loc = self.ns.object(bucket, key)
        cached = await self._cached_versions(bucket, [(key, loc)])
        self.core.invalidate(bucket, key)
        await self.backend.delete(loc.bucket, loc.key)
        self.core.uncataloged(bucket, [key])
        await self._forget(cached)

    async def delete_many(self, bucket: str, keys: Sequence[str]) -> list[tuple[str, str, str]]:
        """DeleteObjects: the keys that could not be deleted, each with an S3 error code and message."""
        await self.core.check_bucket(bucket)
        failures: list[tuple[str, str, str]] = []
        by_name: dict[str, str] = {}
        located: list[tuple[str, Location]] = []
        for key in keys:
            try:
                loc = self.ns.object(bucket, key)
            except errors.S3Error as e:
                failures.append((key, e.code, e.message))
                continue
            by_name[loc.key] = key
            located.append((key, loc))
        cached = await self._cached_versions(bucket, located)
        for key in keys:
            self.core.invalidate(bucket, key)
        backend_bucket = self.ns.root(bucket).bucket
        failed = await self.backend.delete_many(backend_bucket, list(by_name)) if by_name else []
        failures += [(by_name[name], code, msg) for name, code, msg in failed]
        gone = {by_name[name] for name, _, _ in failed}
        self.core.uncataloged(bucket, [k for k in by_name.values() if k not in gone])
        await self._forget([(key, manifest) for key, manifest in cached if key not in gone])
        return failures

    async def _cached_versions(
        self, bucket: str, located: Sequence[tuple[str, Location]]
    ) -> list[tuple[str, Manifest]]:
        """The stored versions of objects about to be deleted whose chunks this instance may hold: the
        version it resolved last (kept in memory), else, while its disk cache holds any chunk, the one
        the store holds now (a ranged GET of its tail, FORGET_LOOKUPS at once). Chunk keys name versions,
        not keys (cache.reader.version_id), so without the version its chunks cannot be found.
        Passthrough objects have no chunks; one that cannot be read has none to find."""
        found: list[tuple[str, Manifest]] = []
        unknown: list[tuple[str, Location]] = []
        for key, loc in located:
            kept = self.core.resolved.stale((bucket, key), math.inf)
            if kept is not None:
                if kept[0].manifest is not None:
                    found.append((key, kept[0].manifest))
            elif self.core.reader.caches_on_disk:
                unknown.append((key, loc))
        if not unknown:
            return found

        async def stored(loc: Location) -> Manifest | None:
            try:
                obj = await self.reads.stored_at(loc)
            except Exception as e:  # the delete itself says what is wrong with the store
                log.debug("no stored version to forget: %s", type(e).__name__)
                return None
            return obj.manifest if obj is not None else None

        manifests = await bounded_gather(FORGET_LOOKUPS, [loc for _, loc in unknown], stored)
        found += [(key, m) for (key, _), m in zip(unknown, manifests, strict=True) if m is not None]
        return found

    async def _forget(self, cached: Sequence[tuple[str, Manifest]]) -> None:
        """Drop the cached chunks of deleted objects' versions from this instance's caches."""
        for _, manifest in cached:
            try:
                await self.core.reader.forget(manifest)
            except Exception:  # the cache is an optimisation: its failure never fails a delete
                log.warning("cached chunks of a deleted object not dropped", exc_info=True)

    async def copy(
        self,
        src: StoredObject,
        bucket: str,
        key: str,
        *,
        replace: bool,
        content_type: str | None,
        metadata: Mapping[str, str],
        headers: Mapping[str, str],
    ) -> StoredObject:
        """CopyObject, server-side: the stored bytes are never downloaded unless part sizes require it."""
        await self.core.check_bucket(bucket)
        dst = self.ns.object(bucket, key)
        if src.manifest is None or src.ctx is None:
            meta = {k: encode_meta_value(v) for k, v in metadata.items()} if replace else None
            info = await self.backend.copy(
                src.loc.bucket,
                src.loc.key,
                dst.bucket,
                dst.key,
                metadata=meta,
                content_type=content_type if replace else None,
            )
            self.core.invalidate(bucket, key)
            return await self.reads.resolve(bucket, key) if info is None else await self.reads.load(dst, info)
        manifest, ctx = src.manifest, src.ctx
        if replace:
            manifest = manifest.replace(
                content_type=content_type, metadata=dict(metadata), headers=dict(headers)
            )
        tail = await self.core.cpu("store", encode_tail, manifest, ctx)
        pieces = (
            [ByteRange(src.loc, 0, manifest.data_size - 1, src.backend_etag)] if manifest.data_size else []
        )
        info = await self.assemble(
            dst,
            pieces,
            tail,
            manifest.backend_metadata(len(tail)),
            manifest.content_type,
        )
        self.core.invalidate(bucket, key)
        stored = StoredObject.written(dst, info, manifest, ctx, manifest.backend_metadata(len(tail)))
        return self.core.cataloged(bucket, key, info, stored)

    async def assemble(
        self,
        dst: Location,
        pieces: Sequence[ByteRange],
        tail: bytes,
        metadata: Mapping[str, str],
        content_type: str | None,
    ) -> ObjectInfo:
        """Build one backend object from byte ranges of others plus a tail, server-side where possible.

        Ranges of at least the backend's minimum part size become UploadPartCopy parts; smaller ones are
        gathered (bounded by the part size) and uploaded, so compressed parts that shrank below the
        minimum never cause EntityTooSmall. The tail always ends the last part.
        """
        backend = multipart_of(self.backend)
        min_part = backend.min_part_size
        upload_id = await backend.create_multipart(
            dst.bucket, dst.key, metadata=metadata, content_type=content_type
        )
        parts: list[tuple[int, str]] = []
        total = sum(p.last - p.first + 1 for p in pieces) + len(tail)
        # Gathered parts only a little above the minimum keep memory low; a big object needs bigger ones
        # to stay within S3's 10,000 parts.
        gather = min(self.part_size, max(min_part, -(-total // (MAX_PARTS - 100))))

        async def upload(data: bytearray) -> None:
            etag = await backend.upload_part(dst.bucket, dst.key, upload_id, len(parts) + 1, data)
            parts.append((len(parts) + 1, etag))

        try:
            spool = bytearray()
            for piece in pieces:
                if len(spool) >= min_part:
                    await upload(spool)
                    spool = bytearray()
                size = piece.last - piece.first + 1
                if not spool and size >= min_part:
                    etag = await backend.upload_part_copy(
                        dst.bucket,
                        dst.key,
                        upload_id,
                        len(parts) + 1,
                        piece.loc.bucket,
                        piece.loc.key,
                        piece.first,
                        piece.last,
                        src_etag=piece.etag,
                    )
                    parts.append((len(parts) + 1, etag))
                    continue
                reader = await self.backend.get(
                    piece.loc.bucket, piece.loc.key, piece.first, piece.last, if_match=piece.etag
                )
                try:
                    async for data in reader:
                        spool += data
                        if len(spool) >= gather:
                            await upload(spool)
                            spool = bytearray()
                finally:
                    await reader.close()
            spool += tail
            await upload(spool)
            return await backend.complete_multipart(dst.bucket, dst.key, upload_id, parts)
        except BaseException:
            await quietly(backend.abort_multipart(dst.bucket, dst.key, upload_id))
            raise

    async def rewrap(self, bucket: str, key: str) -> bool:
        """Wrap the object's data key with the active KEK, rewriting only its tail (server-side copy of the
        data where the backend's part rules allow). Returns False when there was nothing to do."""
        if self.core.keyring is None:
            raise errors.InvalidRequest("rewrap needs a key ring")
        obj = await self.reads.resolve(bucket, key)
        if obj.manifest is None or obj.ctx is None or not obj.manifest.encrypted:
            return False
        if obj.manifest.kek_id == self.core.keyring.active_id:
            return False
        manifest, ctx = await self.core.cpu(
            "store", rewrap_manifest, obj.manifest, obj.ctx, self.core.keyring
        )
        tail = await self.core.cpu("store", encode_tail, manifest, ctx)
        pieces = (
            [ByteRange(obj.loc, 0, manifest.data_size - 1, obj.backend_etag)] if manifest.data_size else []
        )
        meta = manifest.backend_metadata(len(tail))
        info = await self.assemble(obj.loc, pieces, tail, meta, manifest.content_type)
        self.core.invalidate(bucket, key)
        self.core.cataloged(bucket, key, info, StoredObject.written(obj.loc, info, manifest, ctx, meta))
        return True
