"""A cold read from an object's first byte: its head is fetched beside its tail (one round trip, not
two), served only when it is of the version the tail was read from, and a small object's tail read
serves the whole read. Over each backend, every read checked against what was written."""

from __future__ import annotations

import asyncio
import gc
import os
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tsproxy.cache.chunks import ChunkCache, ChunkKey
from tsproxy.cache.reader import ChunkReader, version_id
from tsproxy.format import KeyRing, TransformSettings
from tsproxy.format.context import TAG_SIZE
from tsproxy.service import ObjectService
from tsproxy.service import reads as reads_module
from tsproxy.store.base import MIB, Backend

KIB = 1024
CHUNK = 256 * KIB


@dataclass
class Get:
    first: int | None
    last: int | None
    if_match: str | None
    started: int  # the order GETs were sent in
    answered: int | None = None  # the order their answers' headers came back in


class Recording:
    """A backend that notes every GET: its range, whether it was pinned to a version, and when it went
    out and came back relative to the others. `before_suffix`, when set, is awaited before a suffix GET
    goes out; `after_head` after the head GET (from byte 0, not pinned) has its answer's headers."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.gets: list[Get] = []
        self._events = 0
        self.before_suffix: Callable[[], Awaitable[None]] | None = None
        self.after_head: Callable[[], Awaitable[None]] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _tick(self) -> int:
        self._events += 1
        return self._events

    async def get(self, bucket: str, key: str, first: int | None = None, last: int | None = None,
                  *, if_match: str | None = None) -> Any:  # fmt: skip
        if first is not None and first < 0 and self.before_suffix is not None:
            await self.before_suffix()
        noted = Get(first, last, if_match, self._tick())
        self.gets.append(noted)
        reader = await self.inner.get(bucket, key, first, last, if_match=if_match)
        noted.answered = self._tick()
        if first == 0 and if_match is None and self.after_head is not None:
            await self.after_head()
        return reader

    async def get_bytes(self, bucket: str, key: str, first: int | None = None, last: int | None = None,
                        *, if_match: str | None = None) -> Any:  # fmt: skip
        async with await self.get(bucket, key, first, last, if_match=if_match) as reader:
            return reader.info, await reader.read()


def service(backend: Any, ring: KeyRing, pool: ThreadPoolExecutor) -> ObjectService:
    # compression off: every chunk stored CHUNK + TAG_SIZE bytes, so the head's reach is exact
    cfg = TransformSettings(chunk_size=CHUNK, compression="off")
    return ObjectService(backend, ring, cfg, ChunkReader(None, pool), pool)


async def put(svc: ObjectService, bucket: str, key: str, data: bytes) -> None:
    async def body() -> Any:
        yield data

    await svc.put(bucket, key, body(), content_type=None, metadata={}, headers={})


async def read(
    svc: ObjectService, bucket: str, key: str, first: int, last: int, head_for: int | None
) -> bytes:
    obj = await svc.resolve(bucket, key, head_for=head_for)
    return b"".join([bytes(p) async for p in svc.read(obj, first, last)])


async def test_a_read_from_the_first_byte_fetches_the_head_beside_the_tail(
    backend: Backend, bucket: str, ring: KeyRing, pool: ThreadPoolExecutor
) -> None:
    data = os.urandom(3 * MIB + 5)
    await put(service(backend, ring, pool), bucket, "seg.log", data)
    seen = Recording(backend)
    got = await read(service(seen, ring, pool), bucket, "seg.log", 0, MIB - 1, head_for=MIB)
    assert got == data[:MIB]
    # The tail and the head went out before either came back: one round trip. The head reaches as far as
    # the chunks of the first MiB can be stored, and nothing more was asked for.
    suffix, head = seen.gets
    assert suffix.first == -(64 * KIB) and head.first == 0 and head.if_match is None
    assert head.last == 4 * (CHUNK + TAG_SIZE) - 1
    assert head.started < (suffix.answered or 0) and suffix.started < (head.answered or 0)


async def test_what_the_head_does_not_hold_goes_out_pinned_at_its_end(
    backend: Backend, bucket: str, ring: KeyRing, pool: ThreadPoolExecutor
) -> None:
    data = os.urandom(6 * MIB + 5)
    await put(service(backend, ring, pool), bucket, "seg.log", data)
    seen = Recording(backend)
    assert (
        await read(service(seen, ring, pool), bucket, "seg.log", 0, len(data) - 1, head_for=1 << 62) == data
    )
    head_end = 16 * (CHUNK + TAG_SIZE)  # a read to the end: as far as the engine's first GET reaches
    assert seen.gets[1].first == 0 and seen.gets[1].last == head_end - 1
    pinned = seen.gets[2:]
    assert pinned and all(g.if_match is not None for g in pinned)
    assert min(g.first or 0 for g in pinned) == head_end  # nothing the head holds is asked for again


async def test_a_head_of_another_version_is_never_served(
    backend: Backend, bucket: str, ring: KeyRing, pool: ThreadPoolExecutor
) -> None:
    """The object is replaced after the head GET got its answer and before the tail is read: the tail
    names the new version, so the head's bytes (the old one's) are dropped and the chunks fetched again."""
    old, new = os.urandom(2 * MIB), os.urandom(2 * MIB)
    writer = service(backend, ring, pool)
    await put(writer, bucket, "seg.log", old)
    seen = Recording(backend)
    replaced = asyncio.Event()

    async def replace() -> None:
        seen.after_head = None
        await put(writer, bucket, "seg.log", new)
        replaced.set()

    async def wait_for_replace() -> None:
        await asyncio.wait_for(replaced.wait(), timeout=30)

    seen.after_head, seen.before_suffix = replace, wait_for_replace
    got = await read(service(seen, ring, pool), bucket, "seg.log", 0, MIB - 1, head_for=MIB)
    assert got == new[:MIB]
    pinned = [g for g in seen.gets if g.if_match is not None]
    assert pinned and pinned[0].first == 0  # the chunks came from the version the tail named


async def test_a_small_object_is_read_whole_with_its_tail(
    backend: Backend, bucket: str, ring: KeyRing, pool: ThreadPoolExecutor
) -> None:
    data = os.urandom(10 * KIB)
    await put(service(backend, ring, pool), bucket, "small", data)
    for head_for, first, last in ((None, 0, len(data) - 1), (100, 0, 99), (None, 5000, 6000)):
        seen = Recording(backend)
        assert (
            await read(service(seen, ring, pool), bucket, "small", first, last, head_for)
            == data[first : last + 1]
        )
        assert len(seen.gets) == 1  # the suffix GET held all of it


async def test_a_passthrough_object_is_served_from_the_head(
    backend: Backend, bucket: str, ring: KeyRing, pool: ThreadPoolExecutor
) -> None:
    data = os.urandom(6 * MIB)
    await backend.put(bucket, "plain", data)
    seen = Recording(backend)
    assert await read(service(seen, ring, pool), bucket, "plain", 0, len(data) - 1, head_for=1 << 62) == data
    # The head held the first bytes; the rest came pinned, from where it ended.
    rest = [g for g in seen.gets if g.if_match is not None]
    assert [g.first for g in rest] == [16 * (CHUNK + TAG_SIZE)]


async def test_heads_held_at_once_are_bounded(
    backend: Backend, bucket: str, ring: KeyRing, pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However many reads from byte 0 start at once, at most MAX_HEADS heads are held (fetching, or
    held by a read); a read beyond that resolves without one, and reads the same bytes."""
    monkeypatch.setattr(reads_module, "MAX_HEADS", 1)
    data = os.urandom(2 * MIB)
    writer = service(backend, ring, pool)
    for key in ("a", "b", "c"):
        await put(writer, bucket, key, data)
    svc = service(backend, ring, pool)
    first = await svc.resolve(bucket, "a", head_for=MIB)
    second = await svc.resolve(bucket, "b", head_for=MIB)
    assert first.head is not None and second.head is None
    assert b"".join([bytes(p) async for p in svc.read(second, 0, MIB - 1)]) == data[:MIB]
    assert b"".join([bytes(p) async for p in svc.read(first, 0, MIB - 1)]) == data[:MIB]
    held = weakref.ref(first.head)
    del first
    for _ in range(500):  # the read's downloads end just after its last byte
        gc.collect()
        if held() is None:
            break
        await asyncio.sleep(0.01)
    assert held() is None
    third = await svc.resolve(bucket, "c", head_for=MIB)
    assert third.head is not None  # the first read's head was let go
    assert b"".join([bytes(p) async for p in svc.read(third, 0, MIB - 1)]) == data[:MIB]


async def _cached_reader(directory: Path, pool: ThreadPoolExecutor) -> tuple[ChunkCache, ChunkReader]:
    cache = await asyncio.get_running_loop().run_in_executor(
        None, lambda: ChunkCache(directory, 64 << 20, executor=pool)
    )
    return cache, ChunkReader(cache, pool, prefetch_bytes=0)


async def _expired(svc: ObjectService, bucket: str, key: str) -> None:
    """Wait until the resolution of (bucket, key) is past its metadata_ttl (a microsecond here)."""
    for _ in range(1000):
        if svc.core.resolved.get((bucket, key)) is None:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the resolution did not expire")


@pytest.mark.parametrize("held", [True, False], ids=["chunks-cached", "chunks-forgotten"])
async def test_a_read_again_past_the_ttl_fetches_no_head_for_chunks_the_cache_holds(
    backend: Backend, bucket: str, ring: KeyRing, pool: ThreadPoolExecutor, tmp_path: Path, held: bool
) -> None:
    """A consumer reading a segment from its start again (or on past metadata_ttl): the object is
    resolved again (its tail), but when the cache holds the chunks the read needs of the version resolved
    before, its head is not downloaded beside the tail only to be thrown away. When the cache no longer
    holds them, the head goes out beside the tail as on a first read."""
    data = os.urandom(3 * MIB + 5)
    cache, reader = await _cached_reader(tmp_path / "cache", pool)
    seen = Recording(backend)
    cfg = TransformSettings(chunk_size=CHUNK, compression="off")
    svc = ObjectService(seen, ring, cfg, reader, pool, metadata_ttl=1e-6)
    try:
        await put(svc, bucket, "seg.log", data)
        assert await read(svc, bucket, "seg.log", 0, len(data) - 1, head_for=len(data)) == data
        obj = svc.core.resolved.stale((bucket, "seg.log"), 60)
        assert obj is not None and obj[0].manifest is not None
        manifest = obj[0].manifest
        version, index = version_id(manifest), manifest.index
        keys = [ChunkKey(version, r.segment_no, r.chunk_no) for r in map(index.chunk, range(len(index)))]
        for _ in range(500):  # the chunks land in the disk cache from its writer thread
            if all(await cache.contains_many(keys)):
                break
            await asyncio.sleep(0.01)
        assert all(await cache.contains_many(keys))
        assert await reader.holds(manifest, 0, MIB - 1)
        if not held:
            await reader.forget(manifest)
            assert not await reader.holds(manifest, 0, MIB - 1)
        await _expired(svc, bucket, "seg.log")
        seen.gets.clear()
        assert await read(svc, bucket, "seg.log", 0, MIB - 1, head_for=MIB) == data[:MIB]
        suffix = seen.gets[0]
        assert suffix.first == -(64 * KIB)
        if held:
            assert len(seen.gets) == 1  # the tail, and not a byte of the chunks
        else:
            head = seen.gets[1]
            assert head.first == 0 and head.if_match is None
            assert head.last == 4 * (CHUNK + TAG_SIZE) - 1
            assert all(g.if_match is not None for g in seen.gets[2:])
    finally:
        await reader.close()
        await asyncio.get_running_loop().run_in_executor(None, cache.close)
