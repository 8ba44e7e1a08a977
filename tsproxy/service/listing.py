"""Listings in the client's terms: internal objects hidden, sizes and ETags of the original bytes."""

from __future__ import annotations

from tsproxy import errors
from tsproxy.format.manifest import META_ETAG, META_FORMAT, META_SIZE
from tsproxy.s3.limits import MAX_LIST_KEYS
from tsproxy.service.core import (
    bounded_gather,
)
from tsproxy.service.namespace import Location
from tsproxy.service.reads import ReadOps
from tsproxy.service.records import (
    ListedObject,
    ListedPage,
)
from tsproxy.store.base import ListPage, ObjectInfo


class ListingOps(ReadOps):
    """List a bucket's objects."""

    # -- listing ---------------------------------------------------------------------------------

    async def list_objects(
        self,
        bucket: str,
        *,
        prefix: str = "",
        delimiter: str | None = None,
        start_after: str | None = None,
        token: str | None = None,
        max_keys: int = MAX_LIST_KEYS,
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
        summaries = await bounded_gather(16, [o for o, _ in entries], lambda o: self._summary(root.bucket, o))
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
