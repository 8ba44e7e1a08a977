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
from typing import Any

import pytest

from tsproxy.cache.reader import ChunkReader
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
