"""The size catalog over real backends: instances that never coordinate, flushes, compaction, damage."""

from __future__ import annotations

import asyncio

import pytest

from tsproxy.format.catalog import CatalogRecord
from tsproxy.service.catalog import SizeCatalog
from tsproxy.store.base import Backend

PREFIX = ".tsproxy/catalog/"


def _catalog(backend: Backend, bucket: str, **kwargs: object) -> SizeCatalog:
    options: dict = {"refresh_interval": 0.0, **kwargs}
    return SizeCatalog(backend, lambda _: (bucket, PREFIX), **options)


def _record(i: int, etag: str = "") -> CatalogRecord:
    return CatalogRecord(
        f"seg/{i:05d}.log", etag or f"{i:032x}", 1000 + i, 4000 + i, f"c{i}", 1_700_000_000_000
    )


async def _stored_catalogs(backend: Backend, bucket: str) -> list[str]:
    page = await backend.list(bucket, prefix=PREFIX)
    return [o.key for o in page.objects]


async def test_many_writers_lose_no_record_through_compactions(backend: Backend, bucket: str) -> None:
    writers = [_catalog(backend, bucket) for _ in range(4)]
    expected = []
    for round_no in range(6):
        for w, writer in enumerate(writers):
            for i in range(5):
                record = _record(round_no * 100 + w * 10 + i)
                writer.wrote("b", record)
                expected.append(record)
        await asyncio.gather(*(w.flush() for w in writers))
        # Every writer compacts at once when there are many objects: the worst case for lost records.
        compactors = [_catalog(backend, bucket, compact_above=4) for _ in range(3)]
        await asyncio.gather(*(c.refresh("b") for c in compactors))
        await asyncio.gather(*(c.settle() for c in compactors))  # compactions run in the background
    assert len(await _stored_catalogs(backend, bucket)) <= 8
    fresh = await _catalog(backend, bucket).refresh("b")
    for r in expected:
        assert fresh.lookup(r.key, r.backend_etag, r.stored_size) == r


async def test_deletes_retire_records_in_other_instances(backend: Backend, bucket: str) -> None:
    a, b = _catalog(backend, bucket), _catalog(backend, bucket)
    a.wrote("b", _record(1))
    await a.flush()
    b.deleted("b", _record(1).key)
    await b.flush()
    fresh = await _catalog(backend, bucket).refresh("b")
    r = _record(1)
    assert fresh.lookup(r.key, r.backend_etag, r.stored_size) is None


async def test_flush_waits_for_the_interval_or_the_record_count(backend: Backend, bucket: str) -> None:
    writer = _catalog(backend, bucket, flush_interval=30.0, flush_records=3)
    writer.start()
    try:
        writer.wrote("b", _record(1))
        await asyncio.sleep(0.3)
        assert await _stored_catalogs(backend, bucket) == []
        writer.wrote("b", _record(2))
        writer.wrote("b", _record(3))
        for _ in range(50):
            if await _stored_catalogs(backend, bucket):
                break
            await asyncio.sleep(0.1)
        assert len(await _stored_catalogs(backend, bucket)) == 1
    finally:
        await writer.close()


async def test_a_damaged_catalog_object_is_skipped_not_fatal(backend: Backend, bucket: str) -> None:
    writer = _catalog(backend, bucket)
    writer.wrote("b", _record(7))
    await writer.flush()
    await backend.put(bucket, PREFIX + "0000000000000-garbage-00000001", b"not a catalog at all")
    events: list[str] = []
    fresh = await _catalog(backend, bucket, on_event=events.append).refresh("b")
    r = _record(7)
    assert fresh.lookup(r.key, r.backend_etag, r.stored_size) == r
    assert events == ["damaged"]


async def test_refresh_is_rate_limited(backend: Backend, bucket: str) -> None:
    reader = _catalog(backend, bucket, refresh_interval=3600.0)
    await reader.refresh("b")
    writer = _catalog(backend, bucket)
    writer.wrote("b", _record(9))
    await writer.flush()
    r = _record(9)
    assert (await reader.refresh("b")).lookup(r.key, r.backend_etag, r.stored_size) is None


@pytest.mark.parametrize("count", [0, 1])
async def test_close_flushes_what_is_pending(backend: Backend, bucket: str, count: int) -> None:
    writer = _catalog(backend, bucket, flush_interval=3600.0)
    writer.start()
    for i in range(count):
        writer.wrote("b", _record(i))
    await writer.close()
    assert len(await _stored_catalogs(backend, bucket)) == count


async def test_a_writer_that_never_lists_still_bounds_its_catalog_objects(
    backend: Backend, bucket: str
) -> None:
    """A busy writer flushes often; after `compact_above` flushes of its own it folds the catalog."""
    events: list[str] = []
    writer = _catalog(backend, bucket, flush_interval=0.05, flush_records=1, compact_above=3)
    writer.on_event = events.append
    writer.start()
    expected = []
    try:
        for i in range(12):
            record = _record(i)
            writer.wrote("b", record)
            expected.append(record)
            for _ in range(100):  # each record is flushed as its own object
                if events.count("flush") > i:
                    break
                await asyncio.sleep(0.02)
        for _ in range(100):
            if len(await _stored_catalogs(backend, bucket)) <= 4:
                break
            await asyncio.sleep(0.05)
        await writer.settle()
    finally:
        await writer.close()
    assert events.count("flush") == 12 and events.count("compaction") >= 2
    assert len(await _stored_catalogs(backend, bucket)) <= 4  # 12 flushes, folded on the way
    fresh = await _catalog(backend, bucket).refresh("b")
    for r in expected:
        assert fresh.lookup(r.key, r.backend_etag, r.stored_size) == r


async def test_a_listing_s_later_pages_do_not_refresh_a_recent_index(backend: Backend, bucket: str) -> None:
    reader = _catalog(backend, bucket, refresh_interval=0.0, page_refresh_interval=3600.0)
    await reader.refresh("b")
    writer = _catalog(backend, bucket)
    writer.wrote("b", _record(5))
    await writer.flush()
    r = _record(5)
    later_page = await reader.refresh("b", max_age=reader.page_refresh_interval)
    assert later_page.lookup(r.key, r.backend_etag, r.stored_size) is None  # listed by a HEAD instead
    first_page = await reader.refresh("b")
    assert first_page.lookup(r.key, r.backend_etag, r.stored_size) == r
