"""The object service: S3 object semantics over a backend, in tsproxy's stored format.

The server's handlers speak HTTP; this module speaks objects. It resolves a client's (bucket, key) to a
backend location, reads manifests, streams uploads through the transform into the backend, assembles
multipart uploads and copies server-side, and answers listings in terms of the original bytes.

Internal state (multipart uploads in progress) lives in the backend under a reserved prefix, so a
restarted tsproxy, or another replica, picks up where the last one left off.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar
from urllib.parse import quote, unquote

from tsproxy import errors
from tsproxy.cache.reader import ChunkReader
from tsproxy.format import (
    TRAILER_SIZE,
    KeyRing,
    Manifest,
    ObjectContext,
    SegmentEncoder,
    SegmentInfo,
    TransformSettings,
    build_manifest,
    decode_tail,
    encode_tail,
    tail_length,
)
from tsproxy.format import rewrap as rewrap_manifest
from tsproxy.format.manifest import META_ETAG, META_FORMAT, META_SIZE
from tsproxy.format.manifest import META_TAIL_LENGTH as META_TAIL
from tsproxy.metrics import Metrics
from tsproxy.store.base import Backend, ListPage, ObjectInfo

log = logging.getLogger("tsproxy.objects")

INTERNAL = ".tsproxy/"
MIN_PART_SIZE = 5 << 20  # S3's minimum for every part but the last
MAX_PARTS = 10000
FEED_SIZE = 1 << 20  # payload bytes handed to the encoder per executor call
# Objects whose stored form fits in this are buffered whole, so that their backend metadata can carry
# the size and ETag (HEAD and listings then need no extra GET).
SMALL_OBJECT = 8 << 20

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


class ObjectChanged(errors.TsproxyError):
    """The backend object was replaced after it was resolved; its chunks belong to another version."""


@dataclass(frozen=True)
class Location:
    """Where an object lives in the backend."""

    bucket: str
    key: str


@dataclass(frozen=True)
class StoredObject:
    """An object as the client sees it, plus what is needed to read it."""

    loc: Location
    size: int
    etag: str  # unquoted, as the client knows it
    last_modified: datetime
    content_type: str | None
    metadata: Mapping[str, str]
    headers: Mapping[str, str]
    backend_etag: str
    manifest: Manifest | None = None  # None: passthrough (not written by tsproxy)
    ctx: ObjectContext | None = None
    backend_metadata: Mapping[str, str] = field(default_factory=dict)

    @property
    def passthrough(self) -> bool:
        return self.manifest is None

    @classmethod
    def written(
        cls,
        loc: Location,
        info: ObjectInfo,
        manifest: Manifest,
        ctx: ObjectContext,
        backend_metadata: Mapping[str, str],
    ) -> StoredObject:
        """A tsproxy object: what the client sees comes from its manifest, the rest from the backend."""
        return cls(
            loc,
            manifest.size,
            manifest.etag,
            info.last_modified,
            manifest.content_type,
            dict(manifest.metadata),
            dict(manifest.headers),
            info.etag,
            manifest,
            ctx,
            backend_metadata,
        )


@dataclass(frozen=True)
class ListedObject:
    key: str
    size: int
    etag: str
    last_modified: datetime


@dataclass(frozen=True)
class ListedPage:
    objects: list[ListedObject]
    common_prefixes: list[str]
    is_truncated: bool
    next_token: str | None


@dataclass(frozen=True)
class PartRecord:
    """One uploaded part of a multipart upload (the state kept in its `.info` object)."""

    part_no: int
    etag: str
    size: int
    data_key: str
    segment: SegmentInfo
    last_modified: datetime

    def to_bytes(self) -> bytes:
        head = json.dumps({"part": self.part_no, "etag": self.etag, "size": self.size, "data": self.data_key})
        return head.encode() + b"\n" + self.segment.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes, last_modified: datetime) -> PartRecord:
        head, _, seg = data.partition(b"\n")
        fields = json.loads(head)
        return cls(
            fields["part"],
            fields["etag"],
            fields["size"],
            fields["data"],
            SegmentInfo.from_bytes(seg),
            last_modified,
        )


@dataclass(frozen=True)
class UploadState:
    """A multipart upload in progress: what CreateMultipartUpload decided, kept in the backend."""

    upload_id: str
    key: str
    ctx_state: bytes
    settings: TransformSettings
    content_type: str | None
    metadata: dict[str, str]
    headers: dict[str, str]
    initiated: datetime

    def to_bytes(self) -> bytes:
        s = self.settings
        return json.dumps(
            {
                "upload_id": self.upload_id,
                "key": self.key,
                "ctx": base64.b64encode(self.ctx_state).decode(),
                "settings": [s.chunk_size, s.compression, s.level, s.encryption],
                "content_type": self.content_type,
                "metadata": self.metadata,
                "headers": self.headers,
                "initiated": self.initiated.isoformat(),
            }
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> UploadState:
        f = json.loads(data)
        chunk_size, compression, level, encryption = f["settings"]
        return cls(
            f["upload_id"],
            f["key"],
            base64.b64decode(f["ctx"]),
            TransformSettings(
                chunk_size=chunk_size, compression=compression, level=level, encryption=encryption
            ),
            f["content_type"],
            f["metadata"],
            f["headers"],
            datetime.fromisoformat(f["initiated"]),
        )


class Namespace:
    """Maps client buckets and keys to backend locations.

    By default a client bucket is the backend bucket of the same name. With `backend_bucket` set, every
    client bucket becomes a prefix `<backend_prefix><bucket>/` inside that one backend bucket.
    """

    def __init__(self, backend_bucket: str | None = None, backend_prefix: str = "") -> None:
        self.backend_bucket = backend_bucket
        self.backend_prefix = backend_prefix

    @property
    def mapped(self) -> bool:
        return self.backend_bucket is not None

    def root(self, bucket: str) -> Location:
        """The backend bucket and the key prefix under which a client bucket's objects live."""
        if self.backend_bucket is None:
            return Location(bucket, "")
        return Location(self.backend_bucket, f"{self.backend_prefix}{bucket}/")

    def object(self, bucket: str, key: str) -> Location:
        root = self.root(bucket)
        return Location(root.bucket, root.key + key)

    def internal(self, bucket: str, name: str) -> Location:
        root = self.root(bucket)
        return Location(root.bucket, root.key + INTERNAL + name)

    def client_key(self, bucket: str, backend_key: str) -> str | None:
        """The client's key for a backend key, or None for internal objects."""
        prefix = self.root(bucket).key
        if not backend_key.startswith(prefix):
            return None
        key = backend_key[len(prefix) :]
        return None if key.startswith(INTERNAL) else key


class _TtlCache(Generic[K, V]):
    """A small LRU with expiry, for manifests and listing summaries (bounded in entries)."""

    def __init__(self, max_entries: int, ttl: float) -> None:
        self._data: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self.max_entries, self.ttl = max_entries, ttl

    def get(self, key: K) -> V | None:
        item = self._data.get(key)
        if item is None:
            return None
        expires, value = item
        if self.ttl and expires < time.monotonic():
            del self._data[key]
            return None
        self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._data[key] = (time.monotonic() + self.ttl, value)
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)

    def pop(self, key: K) -> None:
        self._data.pop(key, None)

    def clear(self) -> None:
        self._data.clear()


def _encode_meta_value(value: str) -> str:
    # Backend user metadata must be ASCII; percent-encode anything else (and '%' itself).
    return quote(value, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")


async def _bounded_gather(limit: int, items: Sequence[T], fn: Callable[[T], Awaitable[Any]]) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(item: T) -> Any:
        async with sem:
            return await fn(item)

    return await asyncio.gather(*(one(i) for i in items))


class ObjectService:
    """S3 object operations in tsproxy's format, over one backend."""

    def __init__(
        self,
        backend: Backend,
        keyring: KeyRing | None,
        settings: TransformSettings,
        reader: ChunkReader,
        executor: Executor,
        *,
        namespace: Namespace | None = None,
        metrics: Metrics | None = None,
        part_size: int = 25 << 20,
        metadata_ttl: float = 5.0,
    ) -> None:
        self.backend = backend
        self.keyring = keyring
        self.settings = settings
        self.reader = reader
        self.executor = executor
        self.ns = namespace or Namespace()
        self.metrics = metrics
        self.part_size = part_size
        # (bucket, key) -> resolved object; revalidated after metadata_ttl. Local writes invalidate at once.
        self._objects: _TtlCache[tuple[str, str], StoredObject] = _TtlCache(4096, metadata_ttl)
        # (backend bucket, key, backend etag) -> (size, etag): listing summaries never go stale by key.
        self._summaries: _TtlCache[tuple[str, str, str], tuple[int, str]] = _TtlCache(100_000, 0)
        self._uploads: _TtlCache[str, UploadState] = _TtlCache(1024, 0)

    def replace_keyring(self, keyring: KeyRing) -> None:
        """Use another key ring from now on (after a reload).

        New objects are wrapped under its active KEK. Objects resolved under the old ring are resolved
        again, so a key removed from the ring stops reading at once rather than after metadata_ttl.
        """
        self.keyring = keyring
        self._objects.clear()

    # -- helpers ---------------------------------------------------------------------------------

    async def _cpu(self, direction: str, fn: Callable[..., T], *args: Any) -> T:
        """Run CPU work (zstd, AES, hashing) in the bounded pool, counting its thread CPU time."""
        metrics = self.metrics

        def timed() -> T:
            start = time.thread_time()
            try:
                return fn(*args)
            finally:
                if metrics is not None:
                    metrics.transform_cpu_seconds.labels(direction).inc(time.thread_time() - start)

        return await asyncio.get_running_loop().run_in_executor(self.executor, timed)

    def invalidate(self, bucket: str, key: str) -> None:
        self._objects.pop((bucket, key))

    # -- buckets ---------------------------------------------------------------------------------

    async def list_buckets(self) -> list[tuple[str, datetime]]:
        if not self.ns.mapped:
            return await self.backend.list_buckets()
        assert self.ns.backend_bucket is not None
        page = await self.backend.list(
            self.ns.backend_bucket, prefix=self.ns.backend_prefix, delimiter="/", max_keys=1000
        )
        names = [p[len(self.ns.backend_prefix) :].rstrip("/") for p in page.common_prefixes]
        return [(n, datetime.fromtimestamp(0, UTC)) for n in names if n]

    async def create_bucket(self, bucket: str) -> None:
        if not self.ns.mapped:
            await self.backend.create_bucket(bucket)
            return
        marker = self.ns.internal(bucket, "bucket")
        try:
            await self.backend.head(marker.bucket, marker.key)
        except errors.NoSuchKey:
            await self.backend.put(marker.bucket, marker.key, b"")
            return
        raise errors.BucketAlreadyOwnedByYou(BucketName=bucket)

    async def head_bucket(self, bucket: str) -> None:
        if not self.ns.mapped:
            await self.backend.head_bucket(bucket)
            return
        marker = self.ns.internal(bucket, "bucket")
        try:
            await self.backend.head(marker.bucket, marker.key)
        except errors.NoSuchKey:
            raise errors.NoSuchBucket(BucketName=bucket) from None

    async def delete_bucket(self, bucket: str) -> None:
        root = self.ns.root(bucket)
        await self.head_bucket(bucket)
        page = await self.list_objects(bucket, max_keys=1)
        if page.objects or page.common_prefixes:
            raise errors.BucketNotEmpty(BucketName=bucket)
        # Drop internal leftovers (aborted uploads' state) before the bucket itself.
        internal = self.ns.internal(bucket, "")
        while True:
            inner = await self.backend.list(internal.bucket, prefix=internal.key, max_keys=1000)
            keys = [
                o.key for o in inner.objects if not (self.ns.mapped and o.key.endswith(INTERNAL + "bucket"))
            ]
            if keys:
                await self.backend.delete_many(internal.bucket, keys)
            if not inner.is_truncated or not keys:
                break
        if self.ns.mapped:
            marker = self.ns.internal(bucket, "bucket")
            await self.backend.delete(marker.bucket, marker.key)
        else:
            await self.backend.delete_bucket(root.bucket)

    # -- reading ---------------------------------------------------------------------------------

    async def resolve(self, bucket: str, key: str) -> StoredObject:
        """The object at (bucket, key) as the client sees it: NoSuchKey / NoSuchBucket when absent."""
        cached = self._objects.get((bucket, key))
        if cached is not None:
            if self.metrics is not None:
                self.metrics.manifest_cache.labels("hit").inc()
            return cached
        if self.metrics is not None:
            self.metrics.manifest_cache.labels("miss").inc()
        loc = self.ns.object(bucket, key)
        for attempt in range(3):
            try:
                info = await self.backend.head(loc.bucket, loc.key)
            except errors.NoSuchKey:
                # A HEAD's 404 has no body to tell a missing key from a missing bucket: ask.
                await self.head_bucket(bucket)
                raise errors.NoSuchKey(Key=key) from None
            try:
                obj = await self._load(loc, info)
            except errors.PreconditionFailed:
                # Overwritten between our HEAD and the read of its tail: look again.
                if attempt == 2:
                    raise errors.ServiceUnavailable("The object keeps changing; try again.") from None
                continue
            if self._objects.ttl > 0:
                self._objects.put((bucket, key), obj)
            return obj
        raise AssertionError("unreachable")

    async def _load(self, loc: Location, info: ObjectInfo) -> StoredObject:
        meta = dict(info.metadata)
        if META_FORMAT not in meta:
            user = {k: unquote(v) for k, v in meta.items()}
            return StoredObject(
                loc,
                info.size,
                info.etag,
                info.last_modified,
                info.content_type,
                user,
                {},
                info.etag,
                backend_metadata=meta,
            )
        tail_len = int(meta[META_TAIL]) if meta.get(META_TAIL, "").isdigit() else 0
        if tail_len <= TRAILER_SIZE or tail_len > info.size:
            _, trailer = await self.backend.get_bytes(
                loc.bucket, loc.key, -TRAILER_SIZE, None, if_match=info.etag
            )
            tail_len = tail_length(trailer)
        _, tail = await self.backend.get_bytes(loc.bucket, loc.key, -tail_len, None, if_match=info.etag)
        manifest, ctx = await self._cpu("read", decode_tail, tail, self.keyring)
        return StoredObject.written(loc, info, manifest, ctx, meta)

    def read(self, obj: StoredObject, first: int, last: int) -> AsyncIterator[bytes | memoryview]:
        """The original bytes first..last (inclusive) of a resolved object, streamed.

        ObjectChanged when the object was overwritten since it was resolved: resolve it again.
        """
        if obj.manifest is None or obj.ctx is None:
            return self._read_passthrough(obj, first, last)
        loc, etag = obj.loc, obj.backend_etag

        async def fetch(start: int, end: int) -> bytes:
            try:
                _, data = await self.backend.get_bytes(loc.bucket, loc.key, start, end - 1, if_match=etag)
            except errors.PreconditionFailed:
                raise ObjectChanged(f"{loc.bucket}/{loc.key} changed while it was read") from None
            if len(data) != end - start:
                raise errors.InternalError("short read from the backend")
            return data

        return self.reader.read(obj.manifest, obj.ctx, fetch, first, last)

    async def _read_passthrough(self, obj: StoredObject, first: int, last: int) -> AsyncIterator[bytes]:
        if obj.size == 0:
            return
        try:
            reader = await self.backend.get(
                obj.loc.bucket, obj.loc.key, first, last, if_match=obj.backend_etag
            )
        except errors.PreconditionFailed:
            raise ObjectChanged(f"{obj.loc.bucket}/{obj.loc.key} changed while it was read") from None
        try:
            async for piece in reader:
                yield piece
        finally:
            await reader.close()

    # -- writing ---------------------------------------------------------------------------------

    async def _encode(
        self,
        ctx: ObjectContext,
        settings: TransformSettings,
        segment_no: int,
        payload: AsyncIterable[bytes | memoryview],
        *,
        object_start: bool = True,
    ) -> AsyncIterator[bytes | SegmentInfo]:
        """Transform a payload stream into stored chunks; the last item yielded is the SegmentInfo.

        object_start: the payload is the start of the object (PutObject, part 1), so the `auto`
        compression probe looks for a Kafka batch at its first byte rather than anywhere near its start.
        """
        encoder = SegmentEncoder(ctx, settings, segment_no, object_start=object_start)
        pending = bytearray()
        original = stored = 0
        async for piece in payload:
            pending += piece
            if len(pending) >= FEED_SIZE:
                batch, pending = bytes(pending), bytearray()
                original += len(batch)
                for chunk in await self._cpu("store", encoder.feed, batch):
                    stored += len(chunk)
                    yield chunk
        if pending:
            original += len(pending)
            for chunk in await self._cpu("store", encoder.feed, bytes(pending)):
                stored += len(chunk)
                yield chunk
        for chunk in await self._cpu("store", encoder.finish):
            stored += len(chunk)
            yield chunk
        if self.metrics is not None:
            self.metrics.transform_original_bytes.inc(original)
            self.metrics.transform_stored_bytes.inc(stored)
        yield encoder.info

    async def put(
        self,
        bucket: str,
        key: str,
        payload: AsyncIterable[bytes],
        *,
        content_type: str | None,
        metadata: Mapping[str, str],
        headers: Mapping[str, str],
        size_hint: int | None = None,
        etag: str | None = None,
    ) -> StoredObject:
        """Store a whole object from a payload stream (PutObject). Nothing is visible unless it completes.

        `etag` keeps a given ETag instead of the payload's MD5 (migrating an object keeps the ETag its
        clients already saw).
        """
        loc = self.ns.object(bucket, key)
        settings = self.settings
        ctx = await self._cpu("store", ObjectContext.new, settings, self.keyring)
        result: dict[str, Any] = {}

        async def stored() -> AsyncIterator[bytes]:
            async for item in self._encode(ctx, settings, 1, payload):
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
            tail = await self._cpu("store", encode_tail, manifest, ctx)
            result["manifest"], result["tail"] = manifest, len(tail)
            yield tail

        # Small objects are buffered whole so their backend metadata can carry size and ETag; larger
        # ones stream, and the size/ETag are found in their tail (HEAD then costs one ranged GET).
        buffered, stream = await _buffer_head(stored(), min(self.part_size, SMALL_OBJECT))
        if stream is None:
            manifest = result["manifest"]
            meta = manifest.backend_metadata(result["tail"])
            info = await self.backend.put(
                loc.bucket, loc.key, buffered, metadata=meta, content_type=content_type
            )
        else:
            meta = {META_FORMAT: "1"}
            if size_hint is not None:
                meta[META_SIZE] = str(size_hint)
            info = await self.backend.put(
                loc.bucket, loc.key, _chain(buffered, stream), metadata=meta, content_type=content_type
            )
            manifest = result["manifest"]
        self.invalidate(bucket, key)
        return StoredObject.written(loc, info, manifest, ctx, meta)

    async def delete(self, bucket: str, key: str) -> None:
        loc = self.ns.object(bucket, key)
        self.invalidate(bucket, key)
        await self.backend.delete(loc.bucket, loc.key)

    async def delete_many(self, bucket: str, keys: Sequence[str]) -> list[tuple[str, str, str]]:
        for key in keys:
            self.invalidate(bucket, key)
        root = self.ns.root(bucket)
        failures = await self.backend.delete_many(root.bucket, [root.key + k for k in keys])
        return [(k[len(root.key) :], code, msg) for k, code, msg in failures]

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
        dst = self.ns.object(bucket, key)
        if src.manifest is None or src.ctx is None:
            meta = {k: _encode_meta_value(v) for k, v in metadata.items()} if replace else None
            info = await self.backend.copy(
                src.loc.bucket,
                src.loc.key,
                dst.bucket,
                dst.key,
                metadata=meta,
                content_type=content_type if replace else None,
            )
            self.invalidate(bucket, key)
            return await self.resolve(bucket, key) if info is None else await self._load(dst, info)
        manifest, ctx = src.manifest, src.ctx
        if replace:
            manifest = manifest.replace(
                content_type=content_type, metadata=dict(metadata), headers=dict(headers)
            )
        tail = await self._cpu("store", encode_tail, manifest, ctx)
        pieces = [Piece(src.loc, 0, manifest.data_size - 1, src.backend_etag)] if manifest.data_size else []
        info = await self.assemble(
            dst,
            pieces,
            tail,
            manifest.backend_metadata(len(tail)),
            manifest.content_type,
        )
        self.invalidate(bucket, key)
        return StoredObject.written(dst, info, manifest, ctx, manifest.backend_metadata(len(tail)))

    async def assemble(
        self,
        dst: Location,
        pieces: Sequence[Piece],
        tail: bytes,
        metadata: Mapping[str, str],
        content_type: str | None,
    ) -> ObjectInfo:
        """Build one backend object from byte ranges of others plus a tail, server-side where possible.

        Ranges of at least the backend's minimum part size become UploadPartCopy parts; smaller ones are
        gathered (bounded by the part size) and uploaded, so compressed parts that shrank below the
        minimum never cause EntityTooSmall. The tail always ends the last part.
        """
        min_part = getattr(self.backend, "min_part_size", MIN_PART_SIZE)
        upload_id = await self.backend.create_multipart(
            dst.bucket, dst.key, metadata=metadata, content_type=content_type
        )
        parts: list[tuple[int, str]] = []
        total = sum(p.last - p.first + 1 for p in pieces) + len(tail)
        # Gathered parts only a little above the minimum keep memory low; a big object needs bigger ones
        # to stay within S3's 10,000 parts.
        gather = min(self.part_size, max(min_part, -(-total // (MAX_PARTS - 100))))

        async def upload(data: bytearray) -> None:
            etag = await self.backend.upload_part(dst.bucket, dst.key, upload_id, len(parts) + 1, data)
            parts.append((len(parts) + 1, etag))

        try:
            spool = bytearray()
            for piece in pieces:
                if len(spool) >= min_part:
                    await upload(spool)
                    spool = bytearray()
                size = piece.last - piece.first + 1
                if not spool and size >= min_part:
                    etag = await self.backend.upload_part_copy(
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
            return await self.backend.complete_multipart(dst.bucket, dst.key, upload_id, parts)
        except BaseException:
            await _quietly(self.backend.abort_multipart(dst.bucket, dst.key, upload_id))
            raise

    # -- multipart uploads -----------------------------------------------------------------------

    def _upload_loc(self, bucket: str, upload_id: str, name: str = "") -> Location:
        return self.ns.internal(bucket, f"mpu/{upload_id}/{name}")

    async def create_upload(
        self,
        bucket: str,
        key: str,
        *,
        content_type: str | None,
        metadata: Mapping[str, str],
        headers: Mapping[str, str],
    ) -> str:
        await self.head_bucket(bucket)
        ctx = await self._cpu("store", ObjectContext.new, self.settings, self.keyring)
        upload_id = secrets.token_urlsafe(24)
        state = UploadState(
            upload_id,
            key,
            ctx.to_state(),
            self.settings,
            content_type,
            dict(metadata),
            dict(headers),
            datetime.now(UTC),
        )
        loc = self._upload_loc(bucket, upload_id, "state")
        await self.backend.put(
            loc.bucket, loc.key, state.to_bytes(), metadata={"tsproxy-key": _encode_meta_value(key)}
        )
        self._uploads.put(upload_id, state)
        return upload_id

    async def _upload_state(self, bucket: str, key: str | None, upload_id: str) -> UploadState:
        state = self._uploads.get(upload_id)
        if state is None:
            if not upload_id or "/" in upload_id or len(upload_id) > 128:
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
        self, bucket: str, key: str, upload_id: str, part_no: int, payload: AsyncIterable[bytes | memoryview]
    ) -> PartRecord:
        """Transform one client part as its own segment and keep it until the upload completes."""
        if not 1 <= part_no <= MAX_PARTS:
            raise errors.InvalidArgument(
                "Part number must be an integer between 1 and 10000, inclusive", ArgumentName="partNumber"
            )
        state = await self._upload_state(bucket, key, upload_id)
        ctx = await self._cpu("store", ObjectContext.from_state, state.ctx_state, self.keyring)
        # A resent part goes to a fresh data object; the .info written after it switches over atomically.
        data_loc = self._upload_loc(bucket, upload_id, f"{part_no:05d}-{secrets.token_hex(8)}")
        result: dict[str, SegmentInfo] = {}

        async def stored() -> AsyncIterator[bytes]:
            async for item in self._encode(ctx, state.settings, part_no, payload, object_start=part_no == 1):
                if isinstance(item, SegmentInfo):
                    result["segment"] = item
                else:
                    yield item

        info = await self.backend.put(data_loc.bucket, data_loc.key, stored())
        seg = result["segment"]
        record = PartRecord(part_no, seg.md5.hex(), seg.original_size, data_loc.key, seg, info.last_modified)
        info_loc = self._upload_loc(bucket, upload_id, f"{part_no:05d}.info")
        try:
            await self.backend.put(info_loc.bucket, info_loc.key, record.to_bytes())
        except BaseException:
            await _quietly(self.backend.delete(data_loc.bucket, data_loc.key))
            raise
        return record

    async def list_parts(self, bucket: str, key: str, upload_id: str) -> tuple[UploadState, list[PartRecord]]:
        state = await self._upload_state(bucket, key, upload_id)
        prefix = self._upload_loc(bucket, upload_id)
        infos: list[ObjectInfo] = []
        token: str | None = None
        while True:
            page = await self.backend.list(prefix.bucket, prefix=prefix.key, token=token, max_keys=1000)
            infos += [o for o in page.objects if o.key.endswith(".info")]
            if not page.is_truncated:
                break
            token = page.next_token

        async def load(o: ObjectInfo) -> PartRecord:
            _, data = await self.backend.get_bytes(prefix.bucket, o.key)
            return PartRecord.from_bytes(data, o.last_modified)

        records = await _bounded_gather(16, infos, load)
        return state, sorted(records, key=lambda r: r.part_no)

    async def complete_upload(
        self, bucket: str, key: str, upload_id: str, parts: Sequence[tuple[int, str]]
    ) -> StoredObject:
        """Build the final object from the listed parts, in order; the upload's state is removed after."""
        if not parts:
            raise errors.MalformedXML()
        state, records = await self.list_parts(bucket, key, upload_id)
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
        etag = hashlib.md5(b"".join(bytes.fromhex(r.etag) for r in chosen)).hexdigest() + f"-{len(chosen)}"
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
        tail = await self._cpu("store", encode_tail, manifest, ctx)
        root = self.ns.root(bucket)
        pieces = [
            Piece(Location(root.bucket, r.data_key), 0, r.segment.stored_size - 1)
            for r in chosen
            if r.segment.stored_size
        ]
        dst = self.ns.object(bucket, key)
        meta = manifest.backend_metadata(len(tail))
        info = await self.assemble(dst, pieces, tail, meta, state.content_type)
        self.invalidate(bucket, key)
        await _quietly(self._drop_upload(bucket, upload_id))
        return StoredObject.written(dst, info, manifest, ctx, meta)

    async def abort_upload(self, bucket: str, key: str, upload_id: str) -> None:
        await self._upload_state(bucket, key, upload_id)
        await self._drop_upload(bucket, upload_id)

    async def _drop_upload(self, bucket: str, upload_id: str) -> None:
        self._uploads.pop(upload_id)
        prefix = self._upload_loc(bucket, upload_id)
        while True:
            page = await self.backend.list(prefix.bucket, prefix=prefix.key, max_keys=1000)
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
            page = await self.backend.list(loc_bucket, prefix=root, delimiter="/", token=token, max_keys=1000)
            ids += [p[len(root) :].rstrip("/") for p in page.common_prefixes]
            if not page.is_truncated:
                break
            token = page.next_token

        async def load(upload_id: str) -> UploadState | None:
            try:
                return await self._upload_state(bucket, None, upload_id)
            except errors.NoSuchUpload:
                return None

        states = [s for s in await _bounded_gather(16, ids, load) if s is not None]
        return sorted((s for s in states if s.key.startswith(prefix)), key=lambda s: (s.key, s.initiated))

    async def rewrap(self, bucket: str, key: str) -> bool:
        """Wrap the object's data key with the active KEK, rewriting only its tail (server-side copy of the
        data where the backend's part rules allow). Returns False when there was nothing to do."""
        if self.keyring is None:
            raise errors.InvalidRequest("rewrap needs a key ring")
        obj = await self.resolve(bucket, key)
        if obj.manifest is None or obj.ctx is None or not obj.manifest.encrypted:
            return False
        if obj.manifest.kek_id == self.keyring.active_id:
            return False
        manifest, ctx = await self._cpu("store", rewrap_manifest, obj.manifest, obj.ctx, self.keyring)
        tail = await self._cpu("store", encode_tail, manifest, ctx)
        pieces = [Piece(obj.loc, 0, manifest.data_size - 1, obj.backend_etag)] if manifest.data_size else []
        await self.assemble(
            obj.loc, pieces, tail, manifest.backend_metadata(len(tail)), manifest.content_type
        )
        self.invalidate(bucket, key)
        return True

    # -- listing ---------------------------------------------------------------------------------

    async def list_objects(
        self,
        bucket: str,
        *,
        prefix: str = "",
        delimiter: str | None = None,
        start_after: str | None = None,
        token: str | None = None,
        max_keys: int = 1000,
    ) -> ListedPage:
        """A listing in the client's terms: internal objects hidden, sizes and ETags of the original bytes."""
        await self.head_bucket(bucket) if self.ns.mapped else None
        root = self.ns.root(bucket)
        page: ListPage = await self.backend.list(
            root.bucket,
            prefix=root.key + prefix,
            delimiter=delimiter,
            start_after=(root.key + start_after) if start_after else None,
            token=token,
            max_keys=max_keys,
        )
        visible = [(o, self.ns.client_key(bucket, o.key)) for o in page.objects]
        entries = [(o, k) for o, k in visible if k is not None]
        summaries = await _bounded_gather(
            16, [o for o, _ in entries], lambda o: self._summary(root.bucket, o)
        )
        objects = [
            ListedObject(k, size, etag, o.last_modified)
            for (o, k), (size, etag) in zip(entries, summaries, strict=True)
        ]
        prefixes = []
        for p in page.common_prefixes:
            client = self.ns.client_key(bucket, p)
            if client is not None:
                prefixes.append(client)
        return ListedPage(objects, prefixes, page.is_truncated, page.next_token)

    async def _summary(self, backend_bucket: str, listed: ObjectInfo) -> tuple[int, str]:
        cache_key = (backend_bucket, listed.key, listed.etag)
        hit = self._summaries.get(cache_key)
        if hit is not None:
            return hit
        meta = listed.metadata
        if not meta:
            try:
                head = await self.backend.head(backend_bucket, listed.key)
            except errors.NoSuchKey:
                return listed.size, listed.etag  # deleted since the listing; report what was listed
            meta = head.metadata
            listed = head
        if META_FORMAT not in meta:
            summary = (listed.size, listed.etag)
        elif META_SIZE in meta and META_ETAG in meta:
            summary = (int(meta[META_SIZE]), meta[META_ETAG])
        else:
            obj = await self._load(Location(backend_bucket, listed.key), listed)
            summary = (obj.size, obj.etag)
        self._summaries.put(cache_key, summary)
        return summary


@dataclass(frozen=True)
class Piece:
    """An inclusive byte range of a backend object, to become part of an assembled object."""

    loc: Location
    first: int
    last: int
    etag: str | None = None  # the source version the range must come from (None: any)


async def _buffer_head(stream: AsyncIterator[bytes], limit: int) -> tuple[bytes, AsyncIterator[bytes] | None]:
    """Read up to `limit` bytes; return (bytes, None) if the stream ended, else (head, rest of stream)."""
    buf = bytearray()
    async for piece in stream:
        buf += piece
        if len(buf) >= limit:
            return bytes(buf), stream
    return bytes(buf), None


async def _chain(head: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if head:
        yield head
    async for piece in rest:
        yield piece


async def _quietly(aw: Awaitable[Any]) -> None:
    try:
        await aw
    except Exception:  # cleanup must never hide the error that caused it
        log.warning("cleanup failed", exc_info=True)
