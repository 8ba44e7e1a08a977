"""Listings in the client's terms: internal objects hidden, sizes and ETags of the original bytes."""

from __future__ import annotations

import asyncio
import logging

from tsproxy import errors
from tsproxy.format.catalog import CatalogIndex
from tsproxy.format.manifest import META_ETAG, META_FORMAT, META_SIZE
from tsproxy.s3.limits import MAX_LIST_KEYS
from tsproxy.service import paging
from tsproxy.service.core import ServiceCore, TtlCache, bounded_gather
from tsproxy.service.namespace import (
    ESCAPED,
    RESERVED_START,
    Location,
    prefix_reachable,
    shares_reserved_start,
    stored_as_is,
)
from tsproxy.service.reads import Reads
from tsproxy.service.records import (
    ListedObject,
    ListedPage,
)
from tsproxy.store.base import ListPage, ObjectInfo, list_everything

log = logging.getLogger("tsproxy.service")

# Backend requests a page may add to fill itself past hidden names. The reserved range takes one; more are
# for names no client key maps to (written directly into the backend). A page still short after them is
# truncated with fewer keys, as S3 allows.
MAX_REFILLS = 4
# Past every backend name in the reserved range (internal state and escaped keys alike).
RESERVED_END = RESERVED_START + paging.PAST_PREFIX
# Names read on either side of the reserved range to tell whether a common prefix holds a client key.
PROBE_KEYS = 10


class Listing:
    """List a bucket's objects (with Buckets, the listing part)."""

    def __init__(self, core: ServiceCore, reads: Reads) -> None:
        self.core = core
        self.reads = reads
        self.backend = core.backend
        self.ns = core.ns
        self.metrics = core.metrics
        self.catalog = core.catalog
        # (backend bucket, key, backend etag) -> (size, etag): listing summaries never go stale by key.
        self._summaries: TtlCache[tuple[str, str, str], tuple[int, str]] = TtlCache(100_000, 0)

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
        """A listing in the client's terms: internal objects hidden, sizes and ETags of the original bytes.

        Keys stored as they are come from the backend's listing of the same prefix, in its order and
        with its continuation tokens. Escaped keys (see namespace) live elsewhere in the backend, so a
        listing looks there too and merges them in client order; when there are none, which is the
        usual case, later pages never look again and the backend's tokens pass through.
        """
        await self.core.check_bucket(bucket)
        root = self.ns.root(bucket)
        cursor = paging.parse_token(token)
        after = paging.later(start_after, cursor.after)
        list_plain = not cursor.plain_done
        # The page, the escaped keys and the catalog are fetched at once: one round trip, not three.
        page, escaped, index = await asyncio.gather(
            self._plain_page(
                root,
                prefix,
                delimiter,
                start_after if not cursor.backend_token else None,
                cursor.backend_token,
                max_keys,
            )
            if list_plain
            else _no_page(),
            self._escaped(bucket, prefix, after) if cursor.merged is not False else _nothing(),
            self._catalog_index(bucket, first_page=token is None),
        )
        # Keys stored as they are; escaped ones are in `escaped`, internal ones hidden.
        names = [(o.key[len(root.key) :], o) for o in page.objects if o.key.startswith(root.key)]
        plain = paging.Page(
            [(name, o) for name, o in names if stored_as_is(name)],
            [p[len(root.key) :] for p in page.common_prefixes if prefix_reachable(p[len(root.key) :])],
            page.is_truncated,
            _horizon(page, len(root.key)),
            page.next_token,
        )
        if (not escaped and cursor.merged is None) or cursor.merged is False:
            chosen, prefixes = plain.objects, plain.prefixes
            truncated, next_token = page.is_truncated, paging.plain_token(page.next_token)
        else:
            merged = paging.merge(
                plain if list_plain else None, escaped, prefix, delimiter, max_keys, cursor.after
            )
            chosen, prefixes, truncated, next_token = (
                merged.objects,
                merged.prefixes,
                merged.truncated,
                merged.token,
            )
        objects = await self._listed(root.bucket, chosen, index)
        return ListedPage(objects, prefixes, truncated, next_token if truncated else None)

    async def _plain_page(
        self,
        root: Location,
        prefix: str,
        delimiter: str | None,
        start_after: str | None,
        token: str | None,
        max_keys: int,
    ) -> ListPage:
        """The backend's page of the plain range, refilled past what a listing hides.

        tsproxy's own state and escaped keys sit in the middle of the backend's order (`.tsproxy` sorts
        after `-` and before digits and letters), and a client must not see them. A page they shortened
        would come back truncated with fewer than `max_keys` entries: legal in S3, but not what a client
        of a real store sees, and a size catalog flushed between two requests would make pages
        short at random. So a short truncated page goes on with the backend's next page, sized to what is
        missing, and skips the whole reserved range in one request when it reached it.
        """
        page = await self.backend.list(
            root.bucket,
            prefix=root.key + prefix,
            delimiter=delimiter,
            start_after=root.key + start_after if start_after else None,
            token=token,
            max_keys=max_keys,
        )
        shown = _shown(page, len(root.key))
        for _ in range(MAX_REFILLS):
            if not page.is_truncated or shown >= max_keys:
                break
            last = _horizon(page, len(root.key)) or ""
            past_reserved = last.startswith(RESERVED_START) and paging.sorts_after(RESERVED_END, last)
            more = await self.backend.list(
                root.bucket,
                prefix=root.key + prefix,
                delimiter=delimiter,
                start_after=root.key + RESERVED_END if past_reserved else None,
                token=None if past_reserved else page.next_token,
                max_keys=max_keys - shown,
            )
            shown += _shown(more, len(root.key))
            page = ListPage(
                page.objects + more.objects,
                page.common_prefixes + more.common_prefixes,
                more.is_truncated,
                more.next_token,
            )
        return await self._without_phantoms(root, page)

    async def _without_phantoms(self, root: Location, page: ListPage) -> ListPage:
        """The page less the common prefixes that tsproxy's own names alone made.

        A delimiter found in `.tsproxy` (`t`, `s`, `.`, ...) makes the backend roll the reserved range up
        into a start of it (`.t`), which client keys (`.txt`) may share: each such prefix is shown only
        when a key stored as it is lies under it, on either side of the reserved range. Other delimiters
        (`/` above all) make no such prefix and cost nothing here.
        """
        doubtful = [p for p in page.common_prefixes if shares_reserved_start(p[len(root.key) :])]
        if not doubtful:
            return page
        held = await asyncio.gather(*(self._holds_client_keys(root, p) for p in doubtful))
        phantoms = {p for p, client in zip(doubtful, held, strict=True) if not client}
        shown = [p for p in page.common_prefixes if p not in phantoms]
        return ListPage(page.objects, shown, page.is_truncated, page.next_token)

    async def _holds_client_keys(self, root: Location, rolled: str) -> bool:
        """Whether a key stored as it is lies under the backend's common prefix `rolled` (which shares
        the start of the reserved range): among its first names, or its first past that range."""
        for start_after in (None, root.key + RESERVED_END):
            page = await self.backend.list(
                root.bucket, prefix=rolled, start_after=start_after, max_keys=PROBE_KEYS
            )
            if any(stored_as_is(o.key[len(root.key) :]) for o in page.objects):
                return True
        return False

    async def _escaped(self, bucket: str, prefix: str, after: str | None) -> list[tuple[str, ObjectInfo]]:
        """Escaped objects whose client key starts with `prefix` and sorts after `after`, by client key."""
        home = self.ns.root(bucket)
        found: list[tuple[str, ObjectInfo]] = []
        for o in await list_everything(self.backend, home.bucket, home.key + ESCAPED):
            key = self.ns.client_key(bucket, o.key)
            if key is None or not key.startswith(prefix):
                continue
            if after is None or paging.sorts_after(key, after):
                found.append((key, o))
        found.sort(key=lambda item: paging.order(item[0]))
        return found

    async def _listed(
        self,
        backend_bucket: str,
        entries: list[tuple[str, ObjectInfo]],
        index: CatalogIndex | None,
    ) -> list[ListedObject]:
        """Listed objects with their original sizes and ETags: from the catalog, else by a HEAD."""
        summaries: list[tuple[int, str] | None] = [None] * len(entries)
        unknown = []
        for i, (k, o) in enumerate(entries):
            summary = index.summary(k, o.etag, o.size) if index is not None else None
            if summary is not None:
                summaries[i] = summary
            else:
                unknown.append(i)
        if self.metrics is not None and index is not None:
            self.metrics.catalog_lookups.labels("hit").inc(len(entries) - len(unknown))
            self.metrics.catalog_lookups.labels("miss").inc(len(unknown))
        found = await bounded_gather(16, unknown, lambda i: self._summary(backend_bucket, entries[i][1]))
        for i, summary in zip(unknown, found, strict=True):
            summaries[i] = summary
        objects = []
        for (k, o), summary in zip(entries, summaries, strict=True):
            assert summary is not None
            objects.append(ListedObject(k, summary[0], summary[1], o.last_modified))
        return objects

    async def _catalog_index(self, bucket: str, *, first_page: bool) -> CatalogIndex | None:
        """The bucket's size catalog, refreshed (rate-limited); None without one or when it can't be read.

        A listing's later pages take the index as the first page left it, unless it is old: what was
        written since only costs a HEAD. A catalog that can't be read costs nothing but speed: every
        entry then falls back to a HEAD.
        """
        if self.catalog is None:
            return None
        try:
            max_age = None if first_page else self.catalog.page_refresh_interval
            return await self.catalog.refresh(bucket, max_age=max_age)
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
            obj = await self.reads.load(Location(backend_bucket, listed.key), listed)
            summary = (obj.size, obj.etag)
        self._summaries.put(cache_key, summary)
        return summary


async def _nothing() -> list[tuple[str, ObjectInfo]]:
    return []


async def _no_page() -> ListPage:
    return ListPage([], [], False, None)


def _shown(page: ListPage, root_len: int) -> int:
    """How many of a backend page's entries a client sees (keys and prefixes stored as they are)."""
    return sum(stored_as_is(o.key[root_len:]) for o in page.objects) + sum(
        prefix_reachable(p[root_len:]) for p in page.common_prefixes
    )


def _horizon(page: ListPage, root_len: int) -> str | None:
    """The last backend name (below the root) a truncated page reached: merged entries wait past it."""
    names = [o.key[root_len:] for o in page.objects] + [p[root_len:] for p in page.common_prefixes]
    return max(names, key=paging.order) if names else None
