"""Reading objects: resolve a key to a stored object (HEAD and its tail), stream its original bytes."""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import AsyncIterator
from urllib.parse import unquote

from tsproxy import errors
from tsproxy.cache.reader import FOREGROUND_BYTES
from tsproxy.format import decode_tail
from tsproxy.format.context import TAG_SIZE
from tsproxy.format.manifest import META_FORMAT
from tsproxy.format.tail import TAIL_GUESS, find_tail, first_read, metadata_guess
from tsproxy.service.core import (
    ServiceCore,
)
from tsproxy.service.namespace import Location
from tsproxy.service.prefix import HeadRanges, StoredHead
from tsproxy.service.records import (
    ObjectChanged,
    StoredObject,
)
from tsproxy.store.base import STORE_UNAVAILABLE, ObjectInfo, VersionRanges, aclose

# Heads (see service.prefix) held at once, fetching or read from (a few MiB each): a read that finds
# this many goes without, so their memory stays bounded whatever the number of clients.
MAX_HEADS = 8


class Reads:
    """Resolve and read objects (the read half of the objects part)."""

    tail_guess = TAIL_GUESS  # bytes of an object's end read to resolve it (its tail, usually whole)

    def __init__(self, core: ServiceCore) -> None:
        self.core = core
        self.backend = core.backend
        self.ns = core.ns
        self.metrics = core.metrics
        self.catalog = core.catalog
        self.resolved = core.resolved
        self._heads: list[weakref.ref[StoredHead]] = []  # heads fetched, while anything holds them

    async def resolve(self, bucket: str, key: str, *, head_for: int | None = None) -> StoredObject:
        """The object at (bucket, key) as the client sees it: NoSuchKey / NoSuchBucket when absent.

        One backend request in the usual case: a suffix GET of `tail_guess` bytes answers with the
        object's size (its Content-Range), ETag and metadata, and holds the tail of any ordinary
        tsproxy object; only a longer tail takes one more GET, pinned to that ETag.

        `head_for`: the read to come asks for the object's first `head_for` bytes. When the object is
        not resolved yet and that is more than its tail read holds, its first chunks are fetched at the
        same time as its tail, and the object returned holds them for that read (`StoredObject.head`).
        """
        cached = self.resolved.get((bucket, key))
        if cached is not None:
            if self.metrics is not None:
                self.metrics.manifest_cache.labels("hit").inc()
            return cached
        if self.metrics is not None:
            self.metrics.manifest_cache.labels("miss").inc()
        loc = self.ns.object(bucket, key)
        reach = self._head_reach(head_for)
        head = None
        if reach is not None and not await self._start_held(bucket, key, reach):
            head = self._fetch_head(loc, reach)
        try:
            obj = await self._resolve(bucket, key, loc, head)
        except BaseException:
            if head is not None:
                await head.close()
            raise
        if obj.head is not head and head is not None:
            await head.close()  # the tail read held all of it
        return obj

    def _head_reach(self, head_for: int | None) -> int | None:
        """How many of an object's first original bytes its head is for, for a read of its first
        `head_for`: as many as the read engine's first request brings in. None when there is no head to
        fetch: not a read from the start, or one this short of a small object, which the tail read holds."""
        if head_for is None or head_for <= self.tail_guess:
            return None
        return min(head_for, FOREGROUND_BYTES)

    async def _start_held(self, bucket: str, key: str, reach: int) -> bool:
        """Whether the read engine holds the chunks of the first `reach` bytes of the version of the
        object resolved before (its resolution now past metadata_ttl): a consumer reading a segment
        again, or on past the TTL. Its head is then not fetched: the read would take the chunks from the
        cache, and the head's bytes would be a download for nothing. Should the object have changed
        meanwhile, the new version's chunks are fetched by the read engine instead, one round trip
        later."""
        kept = self.resolved.stale((bucket, key), math.inf)
        manifest = kept[0].manifest if kept is not None else None
        if manifest is None or manifest.size == 0:
            return False
        return await self.core.reader.holds(manifest, 0, min(reach, manifest.size) - 1)

    def _fetch_head(self, loc: Location, reach: int) -> StoredHead | None:
        """Start the GET of the stored bytes of an object's first `reach` original bytes (in the chunk
        size new objects are written with, each chunk stored at most TAG_SIZE longer); None when MAX_HEADS
        are held already."""
        self._heads = [h for h in self._heads if h() is not None]
        if len(self._heads) >= MAX_HEADS:
            return None
        chunk = self.core.settings.chunk_size
        chunks = -(-reach // chunk)
        head = StoredHead.fetch(self.backend, loc.bucket, loc.key, chunks * (chunk + TAG_SIZE))
        self._heads.append(weakref.ref(head))
        return head

    async def _resolve(self, bucket: str, key: str, loc: Location, head: StoredHead | None) -> StoredObject:
        for attempt in range(3):
            try:
                info, end = await self._suffix(loc)
            except STORE_UNAVAILABLE:
                # The store cannot say whether the object changed (an outage, a server error, or its
                # refusal of our credentials): an object resolved before is served as it was, within a
                # bound. A SlowDown is the store answering, and is passed on instead.
                kept = self._stale(bucket, key)
                if kept is None:
                    raise
                return kept
            except (errors.NoSuchKey, errors.NoSuchBucket):
                # Under a mapped namespace the backend's bucket is not the client's: ask about the
                # client's (and a HEAD's 404 has no body to tell a missing key from a missing bucket).
                await self.core.head_bucket(bucket)
                raise errors.NoSuchKey(Key=key) from None
            # Found: under a mapped namespace, an object is there only in a bucket that was created
            # (asked after the object, so that a read costs its own requests first and this one at most
            # once per metadata_ttl).
            await self.core.check_bucket(bucket)
            try:
                obj = await self.load(loc, info, end)
            except errors.PreconditionFailed:
                # Overwritten between our first read and the next: look again.
                if attempt == 2:
                    raise errors.ServiceUnavailable("The object keeps changing; try again.") from None
                continue
            if self.resolved.ttl > 0:
                self.resolved.put((bucket, key), obj)
            if end is not None and len(end) >= info.size and info.size > 0:
                head = StoredHead.held(info.etag, end[len(end) - info.size :])  # the whole object
            return obj if head is None else dataclasses.replace(obj, head=head)
        raise AssertionError("unreachable")

    def _stale(self, bucket: str, key: str) -> StoredObject | None:
        bound = self.core.stale_if_error
        kept = self.resolved.stale((bucket, key), bound) if bound > 0 else None
        if kept is None:
            return None
        obj, age = kept
        if self.metrics is not None:
            self.metrics.manifest_stale_served.inc()
            self.metrics.manifest_stale_seconds.observe(age)
        return obj

    async def resolve_for_head(self, bucket: str, key: str) -> StoredObject:
        """What a HEAD shows of (bucket, key), without reading the object's tail when that can be helped.

        The first HEAD in a bucket whose catalog this instance has not loaded yet starts loading it in
        the background. When this instance's size catalog has a record of the key, a backend HEAD (no
        body) is checked against it as a listing checks its entries, on backend ETag and stored size; a
        match answers with the record's original size, client ETag and HEAD facts. Anything else is
        `resolve`'s answer: the cached object, a suffix GET, or the tail of the version the backend HEAD
        saw. The result of a match can't be read from (`head_only`) and is not kept for GETs.
        """
        index = self.catalog.cached(bucket) if self.catalog is not None else None
        if index is None or key not in index or self.resolved.get((bucket, key)) is not None:
            obj = await self.resolve(bucket, key)
            if index is None and self.catalog is not None:
                self.catalog.load_soon(bucket)  # the bucket exists: later HEADs may skip the tail
            return obj
        loc = self.ns.object(bucket, key)
        try:
            info = await self.backend.head(loc.bucket, loc.key)
        except (errors.NoSuchKey, errors.NoSuchBucket):
            await self.core.head_bucket(bucket)
            raise errors.NoSuchKey(Key=key) from None
        await self.core.check_bucket(bucket)
        record = index.lookup(key, info.etag, info.size)
        if record is None or record.head is None or META_FORMAT not in info.metadata:
            if self.metrics is not None:
                self.metrics.catalog_lookups.labels("miss").inc()
            try:
                return await self.load(loc, info)  # the tail of the version just seen
            except errors.PreconditionFailed:
                return await self.resolve(bucket, key)  # overwritten since: start over
        if self.metrics is not None:
            self.metrics.catalog_lookups.labels("hit").inc()
        facts = record.head
        return StoredObject(
            loc,
            record.original_size,
            record.client_etag,
            info.last_modified,
            facts.content_type,
            dict(facts.metadata),
            dict(facts.headers),
            info.etag,
            backend_metadata=dict(info.metadata),
            head_only=True,
        )

    async def stored_at(self, loc: Location) -> StoredObject | None:
        """What the store holds at `loc` now, read as `resolve` reads it (one GET, as a rule) but
        neither kept nor counted as a resolution; None when nothing is there."""
        try:
            info, end = await self._suffix(loc)
        except (errors.NoSuchKey, errors.NoSuchBucket):
            return None
        return await self.load(loc, info, end)

    async def _suffix(self, loc: Location) -> tuple[ObjectInfo, bytes | None]:
        """The object's info and its last `tail_guess` bytes (all of it when smaller), in one GET.

        An empty object has no suffix to serve (stores answer InvalidRange): HEAD it instead.
        """
        try:
            return await self.backend.get_bytes(loc.bucket, loc.key, -first_read(self.tail_guess), None)
        except errors.InvalidRange:
            return await self.backend.head(loc.bucket, loc.key), None

    async def load(self, loc: Location, info: ObjectInfo, end: bytes | None = None) -> StoredObject:
        """The object `info` describes; `end`, when given, is a suffix of it read with `info`."""
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
        if end is None:
            # One GET when the metadata names the tail's length; else the trailer, then the tail it names.
            want = first_read(metadata_guess(meta, info.size))
            _, end = await self.backend.get_bytes(loc.bucket, loc.key, -want, None, if_match=info.etag)
        search = find_tail(end, info.size)
        if search.read_next:
            _, end = await self.backend.get_bytes(
                loc.bucket, loc.key, -search.read_next, None, if_match=info.etag
            )
        # decode_tail says what is wrong with an end that holds no tail.
        manifest, ctx = await self.core.cpu("read", decode_tail, end, self.core.keyring)
        return StoredObject.written(loc, info, manifest, ctx, meta)

    def read(self, obj: StoredObject, first: int, last: int) -> AsyncIterator[bytes | memoryview]:
        """The original bytes first..last (inclusive) of a resolved object, streamed.

        ObjectChanged when the object was overwritten since it was resolved: resolve it again.
        """
        if obj.head_only:
            raise errors.InternalError("an object described for a HEAD was read from")
        if obj.manifest is None or obj.ctx is None:
            return _changed_is_gone(obj.loc, self._read_passthrough(obj, first, last))
        # The read engine fetches the stored chunks it lacks from this version of the object.
        fetch = self._ranges(obj)
        return _changed_is_gone(obj.loc, self.core.reader.read(obj.manifest, obj.ctx, fetch, first, last))

    def _ranges(self, obj: StoredObject) -> VersionRanges | HeadRanges:
        ranges = VersionRanges(self.backend, obj.loc.bucket, obj.loc.key, obj.backend_etag)
        return ranges if obj.head is None else HeadRanges(ranges, obj.head)

    async def _read_passthrough(
        self, obj: StoredObject, first: int, last: int
    ) -> AsyncIterator[bytes | memoryview]:
        if obj.size == 0:
            return
        pieces = self._ranges(obj)(first, last + 1)
        try:
            async for piece in pieces:
                yield piece
        finally:
            await aclose(pieces)


async def _changed_is_gone(
    loc: Location, pieces: AsyncIterator[bytes | memoryview]
) -> AsyncIterator[bytes | memoryview]:
    """`pieces`, with the version they are read from found replaced (a pinned GET's PreconditionFailed)
    said as ObjectChanged."""
    try:
        async for piece in pieces:
            yield piece
    except errors.PreconditionFailed:
        raise ObjectChanged(f"{loc.bucket}/{loc.key} changed while it was read") from None
    finally:
        await aclose(pieces)
