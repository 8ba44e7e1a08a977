"""The shared core every part of the object service holds (backend, key ring, settings, CPU pool, the
resolved objects), and small helpers the parts share."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import Executor
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from tsproxy import errors
from tsproxy.cache.reader import ChunkReader
from tsproxy.format import (
    KeyRing,
    TransformSettings,
)
from tsproxy.format.catalog import CatalogRecord, HeadFacts
from tsproxy.metrics import Metrics
from tsproxy.service.catalog import SizeCatalog
from tsproxy.service.namespace import Namespace
from tsproxy.service.records import StoredObject
from tsproxy.service.uploads.layout import Layout
from tsproxy.store.base import STORE_UNAVAILABLE, Backend, ObjectInfo, buckets_of

log = logging.getLogger("tsproxy.service")

# Objects whose stored form fits in this are buffered whole, so that their backend metadata can carry
# the size and ETag (HEAD and listings then need no extra GET).
SMALL_OBJECT = 8 << 20

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


class TtlCache(Generic[K, V]):
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
            return None  # kept (within max_entries) for `stale`
        self._data.move_to_end(key)
        return value

    def stale(self, key: K, bound: float) -> tuple[V, float] | None:
        """An entry past its expiry by at most `bound` seconds, with how far past (0 if it has not
        expired): what may be served while the source it should be checked against cannot answer."""
        item = self._data.get(key)
        if item is None:
            return None
        expires, value = item
        age = max(time.monotonic() - expires, 0.0) if self.ttl else 0.0
        return (value, age) if age <= bound else None

    def put(self, key: K, value: V) -> None:
        self._data[key] = (time.monotonic() + self.ttl, value)
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)

    def pop(self, key: K) -> None:
        self._data.pop(key, None)

    def pop_where(self, chosen: Callable[[K], bool]) -> None:
        for key in [k for k in self._data if chosen(k)]:
            del self._data[key]

    def clear(self) -> None:
        self._data.clear()


class BytesLru(TtlCache[K, bytes]):
    """A TtlCache of byte strings bounded in bytes too: the newest stays even when it alone is over."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        super().__init__(max_entries, 0)
        self.max_bytes = max_bytes

    def put(self, key: K, value: bytes) -> None:
        super().put(key, value)
        while len(self._data) > 1 and sum(len(v) for _, v in self._data.values()) > self.max_bytes:
            self._data.popitem(last=False)


def encode_meta_value(value: str) -> str:
    # Backend user metadata must be ASCII; percent-encode anything else (and '%' itself).
    return quote(value, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")


async def bounded_gather(limit: int, items: Sequence[T], fn: Callable[[T], Awaitable[Any]]) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(item: T) -> Any:
        async with sem:
            return await fn(item)

    return await asyncio.gather(*(one(i) for i in items))


class ServiceCore:
    """What every part of the object service holds: the backend, the key ring (replaced on a reload),
    the transform settings, the chunk reader, the CPU pool, the namespace and its layout, the size
    catalog and the resolved objects; and what any part may do with them."""

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
        stale_if_error: float = 0.0,
        catalog: SizeCatalog | None = None,
    ) -> None:
        self.backend = backend
        self.keyring = keyring
        self.settings = settings
        self.reader = reader
        self.executor = executor
        self.ns = namespace or Namespace()
        self.layout = Layout(self.ns)
        self.metrics = metrics
        self.part_size = part_size
        # (bucket, key) -> resolved object; revalidated after metadata_ttl. Local writes invalidate at once.
        self.resolved: TtlCache[tuple[str, str], StoredObject] = TtlCache(4096, metadata_ttl)
        # How long past metadata_ttl a resolved object is still served while the store is unavailable.
        self.stale_if_error = stale_if_error
        # What this instance writes, for listings by any instance (None: every listing HEADs instead).
        self.catalog = catalog
        # Client buckets of a mapped namespace found to exist (their marker), asked again after
        # metadata_ttl: object requests check their bucket without a backend request each.
        self.buckets_seen: TtlCache[str, bool] = TtlCache(4096, metadata_ttl)

    def replace_keyring(self, keyring: KeyRing) -> None:
        """Use another key ring from now on (after a reload).

        New objects are wrapped under its active KEK. Objects resolved under the old ring are resolved
        again, so a key removed from the ring stops reading at once rather than after metadata_ttl.
        """
        self.keyring = keyring
        self.resolved.clear()

    async def cpu(self, direction: str, fn: Callable[..., T], *args: Any) -> T:
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
        self.resolved.pop((bucket, key))

    def cataloged(self, bucket: str, key: str, info: ObjectInfo, obj: StoredObject) -> StoredObject:
        """Note a completed write in the size catalog (listings then need no HEAD for it); returns `obj`."""
        if self.catalog is not None and not obj.passthrough:
            modified_ms = int(info.last_modified.timestamp() * 1000)
            head = HeadFacts.of(obj.content_type, obj.metadata, obj.headers)
            record = CatalogRecord(key, info.etag, info.size, obj.size, obj.etag, modified_ms, head)
            self.catalog.wrote(bucket, record)
        return obj

    def uncataloged(self, bucket: str, keys: Sequence[str]) -> None:
        """Note deletes through tsproxy, so the keys' records are retired for every instance."""
        if self.catalog is not None:
            for key in keys:
                self.catalog.deleted(bucket, key)

    async def head_bucket(self, bucket: str) -> None:
        """NoSuchBucket unless the client bucket exists, asked of the backend now."""
        if not self.ns.mapped:
            await buckets_of(self.backend).head_bucket(bucket)
            return
        marker = self.layout.bucket_marker(bucket)  # NoSuchBucket for a name no bucket can have
        try:
            await self.backend.head(marker.bucket, marker.key)
        except errors.NoSuchKey:
            self.buckets_seen.pop(bucket)
            raise errors.NoSuchBucket(BucketName=bucket) from None
        self.bucket_exists(bucket)

    async def check_bucket(self, bucket: str) -> None:
        """NoSuchBucket unless the client bucket exists, for a request on its objects.

        In a mapped namespace a bucket is its marker, and a prefix without one is no bucket: its
        existence is asked at most once per metadata_ttl (a bucket deleted through another instance may
        take objects that long). While the store cannot answer, a bucket seen before is believed for as
        long as objects resolved before are served (stale_if_error), so that cached reads go on.
        Otherwise the backend's own bucket answers at the request itself.
        """
        if not self.ns.mapped or self.buckets_seen.get(bucket):
            return
        try:
            await self.head_bucket(bucket)
        except STORE_UNAVAILABLE:
            bound = self.stale_if_error
            if bound <= 0 or self.buckets_seen.stale(bucket, bound) is None:
                raise

    def bucket_exists(self, bucket: str) -> None:
        """Note a client bucket of a mapped namespace found or made."""
        if self.buckets_seen.ttl > 0:  # (a TtlCache without a ttl keeps its entries for good)
            self.buckets_seen.put(bucket, True)

    def bucket_gone(self, bucket: str) -> None:
        self.buckets_seen.pop(bucket)


async def buffer_head(stream: AsyncIterator[bytes], limit: int) -> tuple[bytes, AsyncIterator[bytes] | None]:
    """Read up to `limit` bytes; return (bytes, None) if the stream ended, else (head, rest of stream).

    The pieces are joined once, at the end: a buffer grown piece by piece is copied as it grows and
    once more into bytes.
    """
    pieces: list[bytes] = []
    held = 0
    async for piece in stream:
        pieces.append(piece)
        held += len(piece)
        if held >= limit:
            return _joined(pieces), stream
    return _joined(pieces), None


def _joined(pieces: list[bytes]) -> bytes:
    head = pieces[0] if len(pieces) == 1 and type(pieces[0]) is bytes else b"".join(pieces)
    pieces.clear()  # the pieces go now, not when the caller's frame does
    return head


async def chain(head: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if head:
        yield head
    async for piece in rest:
        yield piece


async def quietly(aw: Awaitable[Any]) -> None:
    try:
        await aw
    except Exception:  # cleanup must never hide the error that caused it
        log.warning("cleanup failed", exc_info=True)
