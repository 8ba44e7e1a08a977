"""Listings in the client's terms: internal objects hidden, sizes and ETags of the original bytes."""

from __future__ import annotations

import asyncio
import logging

from tsproxy import errors
from tsproxy.format.catalog import CatalogIndex
from tsproxy.format.manifest import META_ETAG, META_FORMAT, META_SIZE
from tsproxy.service.core import (
    bounded_gather,
)
from tsproxy.service.namespace import Location
from tsproxy.service.reads import ReadOps
from tsproxy.service.records import (
    ListedObject,
    ListedPage,
)
from tsproxy.store.base import ObjectInfo

log = logging.getLogger("tsproxy.service")


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
        max_keys: int = 1000,
    ) -> ListedPage:
        """A listing in the client's terms: internal objects hidden, sizes and ETags of the original bytes."""
        await self.head_bucket(bucket) if self.ns.mapped else None
        root = self.ns.root(bucket)
        # The page and the catalog are fetched at once: a fresh instance pays one round trip, not three.
        page, index = await asyncio.gather(
            self.backend.list(
                root.bucket,
                prefix=root.key + prefix,
                delimiter=delimiter,
                start_after=(root.key + start_after) if start_after else None,
                token=token,
                max_keys=max_keys,
            ),
            self._catalog_index(bucket),
        )
        visible = [(o, self.ns.client_key(bucket, o.key)) for o in page.objects]
        entries = [(o, k) for o, k in visible if k is not None]
        summaries: list[tuple[int, str] | None] = [None] * len(entries)
        unknown = []
        for i, (o, k) in enumerate(entries):
            record = index.lookup(k, o.etag, o.size) if index is not None else None
            if record is not None:
                summaries[i] = (record.original_size, record.client_etag)
            else:
                unknown.append(i)
        if self.metrics is not None and index is not None:
            self.metrics.catalog_lookups.labels("hit").inc(len(entries) - len(unknown))
            self.metrics.catalog_lookups.labels("miss").inc(len(unknown))
        found = await bounded_gather(16, unknown, lambda i: self._summary(root.bucket, entries[i][0]))
        for i, summary in zip(unknown, found, strict=True):
            summaries[i] = summary
        objects = []
        for (o, k), summary in zip(entries, summaries, strict=True):
            assert summary is not None
            objects.append(ListedObject(k, summary[0], summary[1], o.last_modified))
        prefixes = []
        for p in page.common_prefixes:
            client = self.ns.client_key(bucket, p)
            if client is not None:
                prefixes.append(client)
        return ListedPage(objects, prefixes, page.is_truncated, page.next_token)

    async def _catalog_index(self, bucket: str) -> CatalogIndex | None:
        """The bucket's size catalog, refreshed (rate-limited); None without one or when it can't be read.

        A catalog that can't be read costs nothing but speed: every entry then falls back to a HEAD.
        """
        if self.catalog is None:
            return None
        try:
            return await self.catalog.refresh(bucket)
        except errors.S3Error as e:
            log.warning("size catalog unavailable", extra={"fields": {"bucket": bucket, "error": str(e)}})
            return None

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
