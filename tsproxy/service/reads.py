"""Reading objects: resolve a key to a stored object (HEAD and its tail), stream its original bytes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import unquote

from tsproxy import errors
from tsproxy.format import decode_tail
from tsproxy.format.manifest import META_FORMAT
from tsproxy.format.tail import TAIL_GUESS, find_tail, first_read, metadata_guess
from tsproxy.service.core import (
    ServiceCore,
)
from tsproxy.service.namespace import Location
from tsproxy.service.records import (
    ObjectChanged,
    StoredObject,
)
from tsproxy.store.base import ObjectInfo


class ReadOps(ServiceCore):
    """Resolve and read objects."""

    tail_guess = TAIL_GUESS  # bytes of an object's end read to resolve it (its tail, usually whole)

    # -- reading ---------------------------------------------------------------------------------

    async def resolve(self, bucket: str, key: str) -> StoredObject:
        """The object at (bucket, key) as the client sees it: NoSuchKey / NoSuchBucket when absent.

        One backend request in the usual case: a suffix GET of `tail_guess` bytes answers with the
        object's size (its Content-Range), ETag and metadata, and holds the tail of any ordinary
        tsproxy object; only a longer tail takes one more GET, pinned to that ETag.
        """
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
                info, end = await self._suffix(loc)
            except (errors.NoSuchKey, errors.NoSuchBucket):
                # Under a mapped namespace the backend's bucket is not the client's: ask about the
                # client's (and a HEAD's 404 has no body to tell a missing key from a missing bucket).
                await self.head_bucket(bucket)
                raise errors.NoSuchKey(Key=key) from None
            try:
                obj = await self._load(loc, info, end)
            except errors.PreconditionFailed:
                # Overwritten between our first read and the next: look again.
                if attempt == 2:
                    raise errors.ServiceUnavailable("The object keeps changing; try again.") from None
                continue
            if self._objects.ttl > 0:
                self._objects.put((bucket, key), obj)
            return obj
        raise AssertionError("unreachable")

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
        if index is None or key not in index or self._objects.get((bucket, key)) is not None:
            obj = await self.resolve(bucket, key)
            if index is None and self.catalog is not None:
                self.catalog.load_soon(bucket)  # the bucket exists: later HEADs may skip the tail
            return obj
        loc = self.ns.object(bucket, key)
        try:
            info = await self.backend.head(loc.bucket, loc.key)
        except (errors.NoSuchKey, errors.NoSuchBucket):
            await self.head_bucket(bucket)
            raise errors.NoSuchKey(Key=key) from None
        record = index.lookup(key, info.etag, info.size)
        if record is None or record.head is None or META_FORMAT not in info.metadata:
            if self.metrics is not None:
                self.metrics.catalog_lookups.labels("miss").inc()
            try:
                return await self._load(loc, info)  # the tail of the version just seen
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

    async def _suffix(self, loc: Location) -> tuple[ObjectInfo, bytes | None]:
        """The object's info and its last `tail_guess` bytes (all of it when smaller), in one GET.

        An empty object has no suffix to serve (stores answer InvalidRange): HEAD it instead.
        """
        try:
            return await self.backend.get_bytes(loc.bucket, loc.key, -first_read(self.tail_guess), None)
        except errors.InvalidRange:
            return await self.backend.head(loc.bucket, loc.key), None

    async def _load(self, loc: Location, info: ObjectInfo, end: bytes | None = None) -> StoredObject:
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
        manifest, ctx = await self._cpu("read", decode_tail, end, self.keyring)
        return StoredObject.written(loc, info, manifest, ctx, meta)

    def read(self, obj: StoredObject, first: int, last: int) -> AsyncIterator[bytes | memoryview]:
        """The original bytes first..last (inclusive) of a resolved object, streamed.

        ObjectChanged when the object was overwritten since it was resolved: resolve it again.
        """
        if obj.head_only:
            raise errors.InternalError("an object described for a HEAD was read from")
        if obj.manifest is None or obj.ctx is None:
            return self._read_passthrough(obj, first, last)
        loc, etag = obj.loc, obj.backend_etag

        async def fetch(start: int, end: int) -> AsyncIterator[bytes]:
            # Streamed: the reader decodes each chunk as soon as its bytes are in.
            try:
                reader = await self.backend.get(loc.bucket, loc.key, start, end - 1, if_match=etag)
            except errors.PreconditionFailed:
                raise ObjectChanged(f"{loc.bucket}/{loc.key} changed while it was read") from None
            try:
                async for piece in reader:
                    yield piece
            finally:
                await reader.close()

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
