"""A deleted object leaves no chunk in this instance's caches: DeleteObject and DeleteObjects drop the
cached chunks of the version they delete (and its resolution), whether that version is still resolved in
memory or only its chunks are left on disk (after a restart). Chunk keys name versions, not keys, so the
checks read the cache's database for the version ids, as the broker deletion test does."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tsproxy.cache.chunks import ChunkCache, ChunkKey
from tsproxy.cache.hot import Sealed
from tsproxy.cache.reader import ChunkReader, version_id
from tsproxy.format import KeyRing, TransformSettings
from tsproxy.service import ObjectService
from tsproxy.store.base import Backend

CHUNK = 64 * 1024
SIZE = 5 * CHUNK + 1000  # six chunks


class Instance:
    """One tsproxy's object service over `backend`, with its disk cache in `directory`."""

    def __init__(self, backend: Backend, ring: KeyRing, pool: ThreadPoolExecutor, directory: Path,
                 metadata_ttl: float) -> None:  # fmt: skip
        self.cache = ChunkCache(directory, 64 << 20, executor=pool)
        self.reader = ChunkReader(self.cache, pool, prefetch_bytes=0)
        settings = TransformSettings(chunk_size=CHUNK)
        self.svc = ObjectService(backend, ring, settings, self.reader, pool, metadata_ttl=metadata_ttl)
        self.db = directory / "cache.db"

    async def put(self, bucket: str, key: str, data: bytes) -> None:
        async def body() -> AsyncIterator[bytes]:
            yield data

        await self.svc.put(bucket, key, body(), content_type=None, metadata={}, headers={})

    async def read(self, bucket: str, key: str) -> bytes:
        obj = await self.svc.resolve(bucket, key)
        return b"".join([bytes(p) async for p in self.svc.read(obj, 0, obj.size - 1)])

    async def version(self, bucket: str, key: str) -> bytes:
        obj = await self.svc.resolve(bucket, key)
        assert obj.manifest is not None
        self.svc.invalidate(bucket, key)
        return version_id(obj.manifest)

    def cached(self) -> dict[bytes, int]:
        """Entries in the cache's database, by version id."""
        with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10) as conn:
            keys = [bytes(row[0]) for row in conn.execute("SELECT key FROM Cache")]
        out: dict[bytes, int] = {}
        for key in keys:
            out[key[:16]] = out.get(key[:16], 0) + 1
        return out

    def entry_files(self) -> int:
        return sum(1 for p in self.db.parent.rglob("*.val"))

    async def close(self) -> None:
        await self.reader.close()
        await asyncio.get_running_loop().run_in_executor(None, self.cache.close)


async def _filled(instance: Instance, bucket: str, keys: list[str]) -> dict[str, bytes]:
    """Each key written and read whole (its six chunks cached); its version id."""
    versions = {}
    for key in keys:
        data = os.urandom(SIZE)
        await instance.put(bucket, key, data)
        assert await instance.read(bucket, key) == data
        versions[key] = await instance.version(bucket, key)
    for _ in range(200):  # puts land in the cache's writer thread
        if all(instance.cached().get(v) == 6 for v in versions.values()):
            break
        await asyncio.sleep(0.02)
    assert all(instance.cached().get(v) == 6 for v in versions.values())
    return versions


@pytest.mark.parametrize("metadata_ttl", [60.0, 0.0], ids=["resolved-in-memory", "looked-up"])
async def test_delete_object_drops_its_cached_chunks(
    backend: Backend, bucket: str, ring: KeyRing, pool: ThreadPoolExecutor, tmp_path: Path,
    metadata_ttl: float,
) -> None:  # fmt: skip
    instance = Instance(backend, ring, pool, tmp_path / "cache", metadata_ttl)
    try:
        versions = await _filled(instance, bucket, ["gone", "kept"])
        files = instance.entry_files()
        obj = await instance.svc.resolve(bucket, "gone")
        assert [p async for p in instance.svc.read(obj, CHUNK + 10, CHUNK + 20)]  # a seek: held in memory
        if not metadata_ttl:
            instance.svc.invalidate(bucket, "gone")
        hot = instance.reader._hot
        in_memory = [ChunkKey(versions["gone"], 1, i) for i in range(6)]  # a PutObject is segment 1
        assert any(key in hot or Sealed(key) in hot for key in in_memory)
        await instance.svc.delete(bucket, "gone")
        cached = instance.cached()
        assert versions["gone"] not in cached
        assert cached[versions["kept"]] == 6  # another object's chunks stay
        assert instance.entry_files() == files - 6  # the entry files went with their rows
        assert not any(key in hot or Sealed(key) in hot for key in in_memory)
    finally:
        await instance.close()


async def test_delete_objects_after_a_restart_drops_the_chunks_of_every_deleted_key(
    backend: Backend, bucket: str, ring: KeyRing, pool: ThreadPoolExecutor, tmp_path: Path
) -> None:
    first = Instance(backend, ring, pool, tmp_path / "cache", 5.0)
    try:
        versions = await _filled(first, bucket, ["a.log", "a.indexes", "b.log"])
    finally:
        await first.close()
    # A restart: the chunks are on disk, no resolution is in memory.
    again = Instance(backend, ring, pool, tmp_path / "cache", 5.0)
    try:
        failures = await again.svc.delete_many(bucket, ["a.log", "a.indexes", "never-written"])
        assert failures == []
        cached = again.cached()
        assert versions["a.log"] not in cached and versions["a.indexes"] not in cached
        assert cached[versions["b.log"]] == 6
        assert await again.read(bucket, "b.log")  # still served
    finally:
        await again.close()
