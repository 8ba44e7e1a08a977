"""The size catalog in the backend: each instance appends what it writes, every listing reads them all.

See format/catalog.py for the records and why a listing may trust one (only when the backend's own
listing agrees on the ETag and the stored size). Here is the I/O around it:

- writes and deletes are buffered per client bucket and flushed as one small immutable catalog object
  every `flush_interval` seconds or `flush_records` records, whichever comes first; a crash loses at most
  that window, and the objects it covers fall back to a HEAD;
- a listing's first page `refresh`es the bucket's index: one LIST of the catalog prefix, then a GET of
  each catalog object not loaded yet (at most once per `refresh_interval`); its later pages use the
  index as it is unless it is older than `page_refresh_interval`, so a long paged listing pays for the
  catalog once, not every few seconds. An object written meanwhile by another instance is only listed
  by a HEAD, never wrongly;
- when a refresh finds more than `compact_above` catalog objects, the instance writes everything it has
  loaded as one object and deletes the ones it merged, in the background (the listing does not wait).
  A writer that never lists does the same after every `compact_above` flushes of its own, so a busy
  writer leaves a bounded number of catalog objects for a fresh instance to read. Instances never
  coordinate: an object written by another instance meanwhile is not among those deleted, and two
  compactions at once only leave two merged objects, which the next compaction folds together. No
  record is lost either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tsproxy import errors
from tsproxy.format.catalog import (
    CatalogIndex,
    CatalogRecord,
    catalog_object_name,
    decode_catalog,
    encode_catalog,
    tombstone,
)
from tsproxy.store.base import Backend, list_everything

log = logging.getLogger("tsproxy.catalog")

# A tombstone is kept through compactions this long: records written before the delete but flushed
# after it (at most a flush interval late, or a retried flush) still meet it.
TOMBSTONE_KEEP_MS = 3600 * 1000
# A flush that keeps failing must not hold records forever: past this, the oldest go (they fall back to
# a HEAD when listed).
MAX_PENDING = 100_000
LOAD_CONCURRENCY = 8  # catalog objects fetched at once by a refresh


@dataclass
class _Bucket:
    index: CatalogIndex = field(default_factory=CatalogIndex)
    pending: list[CatalogRecord] = field(default_factory=list)
    refreshed_at: float = float("-inf")
    flushes: int = 0  # catalog objects this instance wrote since it last compacted the bucket
    compacting: asyncio.Task[None] | None = None
    failing: bool = False  # the last flush failed (logged once until one succeeds)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class SizeCatalog:
    """The catalogs of every client bucket this instance has written to or listed.

    `where(bucket)` names the backend bucket and the key prefix of a client bucket's catalog objects (in
    the reserved namespace). `backend` needs only the core object-store calls: put, get_bytes, list and
    delete.
    """

    def __init__(
        self,
        backend: Backend,
        where: Callable[[str], tuple[str, str]],
        *,
        flush_interval: float = 5.0,
        flush_records: int = 1000,
        refresh_interval: float = 2.0,
        page_refresh_interval: float = 60.0,
        compact_above: int = 16,
        clock: Callable[[], float] = time.time,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.backend = backend
        self.where = where
        self.instance = secrets.token_hex(6)
        self.flush_interval = flush_interval
        self.flush_records = flush_records
        self.refresh_interval = refresh_interval
        self.page_refresh_interval = page_refresh_interval
        self.compact_above = compact_above
        self.clock = clock
        self.on_event = on_event or (lambda _: None)
        self._buckets: dict[str, _Bucket] = {}
        self._loading: dict[str, asyncio.Task[None]] = {}  # background loads (load_soon), by bucket
        self._sequence = 0
        self._flusher: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def _bucket(self, bucket: str) -> _Bucket:
        state = self._buckets.get(bucket)
        if state is None:
            state = self._buckets[bucket] = _Bucket()
        return state

    # -- what this instance writes -------------------------------------------------------------------

    def wrote(self, bucket: str, record: CatalogRecord) -> None:
        """Note a completed write (the object is visible in the backend as `record` says)."""
        self._note(bucket, record)

    def deleted(self, bucket: str, key: str) -> None:
        """Note a delete through tsproxy, so the key's records are retired everywhere."""
        self._note(bucket, tombstone(key, int(self.clock() * 1000)))

    def _note(self, bucket: str, record: CatalogRecord) -> None:
        state = self._bucket(bucket)
        state.index.add([record])
        state.pending.append(record)
        if len(state.pending) > MAX_PENDING:
            del state.pending[: len(state.pending) - MAX_PENDING]
        if len(state.pending) >= self.flush_records:
            self._wake.set()

    def forget(self, bucket: str) -> None:
        """Drop what is kept of a bucket that is being deleted, so no flush writes into it again."""
        state = self._buckets.pop(bucket, None)
        if state is not None and state.compacting is not None:
            state.compacting.cancel()

    def start(self) -> None:
        """Flush in the background from now on."""
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    async def close(self) -> None:
        """Stop the background flush and compactions, and flush what is pending once more."""
        # Collected with gather, not `await task` under suppress(CancelledError): that would also swallow
        # a cancellation of close() itself (a stop's time limit), and the stop would wait on regardless.
        tasks = [t for t in (self._flusher, *self._loading.values()) if t is not None]
        tasks += [s.compacting for s in self._buckets.values() if s.compacting is not None]
        self._flusher = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.flush()

    async def _flush_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.flush_interval)
            self._wake.clear()
            await self.flush()
            for bucket, state in list(self._buckets.items()):
                if state.flushes >= self.compact_above:
                    # Our own objects pile up: look at the whole catalog (which compacts it when needed).
                    with contextlib.suppress(Exception):  # logged where it failed; retried next time
                        await self.refresh(bucket, max_age=0.0)
                    state.flushes = 0

    async def flush(self) -> None:
        """Write each bucket's pending records as one catalog object; on failure keep them for next time."""
        for bucket, state in list(self._buckets.items()):
            if not state.pending:
                continue
            batch, state.pending = state.pending, []
            try:
                name = await self._put(bucket, batch)
            except errors.NoSuchBucket:
                self._buckets.pop(bucket, None)  # deleted meanwhile: its records have nothing to describe
                continue
            except asyncio.CancelledError:
                # A stop cancels the background flush: keep the batch for close()'s own flush (records
                # written twice are harmless, records dropped are HEADs for every instance after).
                state.pending[:0] = batch
                raise
            except Exception as e:  # the backend may be down: keep the records and try again later
                state.pending[:0] = batch
                self.on_event("flush_error")
                if not state.failing:  # once per outage, not every flush interval
                    log.warning(
                        "catalog flush failed; records kept until the store answers",
                        extra={"fields": {"bucket": bucket, "error": str(e)}},
                    )
                state.failing = True
                continue
            if state.failing:
                log.info("catalog flush recovered", extra={"fields": {"bucket": bucket}})
            state.failing = False
            state.index.loaded.add(name)
            state.flushes += 1
            self.on_event("flush")

    async def _put(self, bucket: str, records: list[CatalogRecord]) -> str:
        backend_bucket, prefix = self.where(bucket)
        self._sequence += 1
        name = catalog_object_name(int(self.clock() * 1000), self.instance, self._sequence)
        await self.backend.put(backend_bucket, prefix + name, encode_catalog(records))
        return name

    # -- what listings read --------------------------------------------------------------------------

    async def refresh(self, bucket: str, *, max_age: float | None = None) -> CatalogIndex:
        """The bucket's index with every catalog object in the backend merged in.

        Not again when the last refresh is younger than `max_age` seconds (by default
        `refresh_interval`): a listing's later pages pass `page_refresh_interval`.
        """
        state = self._bucket(bucket)
        async with state.lock:
            if self.clock() - state.refreshed_at < (self.refresh_interval if max_age is None else max_age):
                return state.index
            backend_bucket, prefix = self.where(bucket)
            names = await self._list_names(backend_bucket, prefix)
            new = [name for name in names if name not in state.index.loaded]
            sem = asyncio.Semaphore(LOAD_CONCURRENCY)

            async def load(name: str) -> bytes | None:
                async with sem:
                    try:
                        _, data = await self.backend.get_bytes(backend_bucket, prefix + name)
                    except errors.NoSuchKey:
                        return None  # compacted away by another instance since our LIST: its merge has them
                    return data

            # Fetched at once, merged in name (time) order, so a tombstone meets the records before it.
            for name, data in zip(new, await asyncio.gather(*(load(n) for n in new)), strict=True):
                if data is None:
                    continue
                try:
                    state.index.add(decode_catalog(data))
                except errors.IntegrityError as e:
                    self.on_event("damaged")
                    log.warning(
                        "catalog object damaged", extra={"fields": {"key": prefix + name, "error": str(e)}}
                    )
                state.index.loaded.add(name)
            state.refreshed_at = self.clock()
            if len(names) > self.compact_above and state.compacting is None:
                state.flushes = 0
                state.compacting = asyncio.get_running_loop().create_task(self._compact(bucket, state, names))
            return state.index

    def load_soon(self, bucket: str) -> None:
        """Load the bucket's catalog in the background (a HEAD found none loaded), once at a time."""
        if bucket in self._buckets or bucket in self._loading:
            return

        async def load() -> None:
            try:
                await self.refresh(bucket)
            except Exception as e:  # only a saving missed: the next listing loads it
                log.debug("size catalog load failed", extra={"fields": {"bucket": bucket, "error": str(e)}})
            finally:
                self._loading.pop(bucket, None)

        self._loading[bucket] = asyncio.get_running_loop().create_task(load())

    def cached(self, bucket: str) -> CatalogIndex | None:
        """The index as loaded so far, without touching the backend (for a HEAD); None if there is none."""
        state = self._buckets.get(bucket)
        return state.index if state is not None else None

    async def _list_names(self, backend_bucket: str, prefix: str) -> list[str]:
        return [o.key[len(prefix) :] for o in await list_everything(self.backend, backend_bucket, prefix)]

    async def settle(self) -> None:
        """Wait for the compactions under way (close() cancels them instead)."""
        compactions = [s.compacting for s in self._buckets.values() if s.compacting is not None]
        if compactions:
            # wait, not gather: a cancelled settle() must not cancel them. They log their own failures.
            await asyncio.wait(compactions)

    async def _compact(self, bucket: str, state: _Bucket, merged: list[str]) -> None:
        """Write what the index holds as one object, then delete the `merged` ones it came from."""
        try:
            since = int(self.clock() * 1000) - TOMBSTONE_KEEP_MS
            records = [*state.index.records(), *state.index.tombstones(since)]
            try:
                name = await self._put(bucket, records)
            except Exception as e:
                log.warning(
                    "catalog compaction failed", extra={"fields": {"bucket": bucket, "error": str(e)}}
                )
                return
            state.index.loaded.add(name)
            backend_bucket, prefix = self.where(bucket)
            try:
                failed = await self.backend.delete_many(backend_bucket, [prefix + n for n in merged])
            except Exception as e:  # the merged object holds them all: the next compaction retries
                log.warning("catalog compaction left objects behind", extra={"fields": {"error": str(e)}})
                return
            state.index.loaded.difference_update(merged)
            self.on_event("compaction")
            if failed:
                log.warning(
                    "catalog compaction left objects behind", extra={"fields": {"count": len(failed)}}
                )
        finally:
            state.compacting = None
