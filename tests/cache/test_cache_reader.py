"""ChunkReader over real stored objects (tsproxy.format) and an in-process fetch that counts its calls."""

from __future__ import annotations

import asyncio
import itertools
import random
import tempfile
import threading
import tracemalloc
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from cache_helpers import KIB, MIB, CountingFetch, StoredObject, make_object, random_data, text_data
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tsproxy import errors
from tsproxy.cache import reader as reader_module
from tsproxy.cache.chunks import ChunkCache, ChunkKey
from tsproxy.cache.reader import ChunkReader, version_id
from tsproxy.format import KeyRing
from tsproxy.format.stages import ZstdStage
from tsproxy.format.zstdframes import Frame
from tsproxy.metrics import Metrics
from tsproxy.pool import PriorityPool


async def read_all(
    reader: ChunkReader, obj: StoredObject, fetch: CountingFetch, first: int, last: int
) -> bytes:
    return b"".join([piece async for piece in reader.read(obj.manifest, obj.ctx, fetch, first, last)])


def chunk_key(obj: StoredObject, i: int) -> ChunkKey:
    ref = obj.manifest.index.chunk(i)
    return ChunkKey(version_id(obj.manifest), ref.segment_no, ref.chunk_no)


async def settle(reader: ChunkReader) -> None:
    """Let background downloads finish (they are tasks of the reader)."""
    while reader._tasks:
        await asyncio.gather(*list(reader._tasks), return_exceptions=True)


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the event loop until condition holds; fail if it never does."""
    for _ in range(60_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never held")


def value_files(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.val"))


# -- every byte range ----------------------------------------------------------------------------------

_RING = KeyRing.new(key_id="reader-hypothesis")
OBJECTS = [
    # plain, small chunks, odd size
    make_object(random_data(700 * KIB + 13, seed=1), chunk_size=64 * KIB),
    # encrypted and compressed, three segments (a multipart upload), short last chunks in each
    make_object(
        text_data(900 * KIB + 7, seed=2),
        chunk_size=64 * KIB,
        compression="on",
        ring=_RING,
        segment_sizes=[300 * KIB + 1, 64 * KIB, 536 * KIB + 6],
    ),
    # encrypted, compression auto on a mix: some chunks stored raw, some compressed
    make_object(
        random_data(200 * KIB, seed=3) + text_data(300 * KIB, seed=4),
        chunk_size=64 * KIB,
        compression="auto",
        ring=_RING,
    ),
    # a one-byte object
    make_object(b"x", chunk_size=64 * KIB, ring=_RING),
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(0, len(OBJECTS) - 1),
    start=st.floats(0, 1),
    length=st.integers(1, 400 * KIB),
    cached=st.booleans(),
    second=st.floats(0, 1),
)
def test_every_range_equals_the_original(
    which: int, start: float, length: int, cached: bool, second: float
) -> None:
    obj = OBJECTS[which]
    size = len(obj.data)
    first = min(size - 1, int(start * size))
    last = min(size - 1, first + length - 1)
    other = min(size - 1, int(second * size))

    async def scenario(directory: str) -> None:
        with ThreadPoolExecutor(2) as pool:
            cache = ChunkCache(directory, 4 * MIB, executor=pool) if cached else None
            reader = ChunkReader(cache, pool, prefetch_bytes=256 * KIB, max_request_bytes=128 * KIB,
                                 max_gap_bytes=64 * KIB)  # fmt: skip
            fetch = CountingFetch(obj)
            try:
                assert await read_all(reader, obj, fetch, first, last) == obj.data[first : last + 1]
                # again (warm, or joining what the first read left in flight), then a second range
                assert await read_all(reader, obj, fetch, first, last) == obj.data[first : last + 1]
                assert await read_all(reader, obj, fetch, other, size - 1) == obj.data[other:]
            finally:
                await reader.close()
                if cache is not None:
                    cache.close()

    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(scenario(directory))


async def test_out_of_range_is_invalid_range(executor: ThreadPoolExecutor) -> None:
    obj = OBJECTS[0]
    reader = ChunkReader(None, executor)
    for first, last in [(0, len(obj.data)), (-1, 3), (5, 4)]:
        with pytest.raises(errors.InvalidRange):
            await read_all(reader, obj, CountingFetch(obj), first, last)


# -- the cache -----------------------------------------------------------------------------------------


async def test_warm_reads_make_no_backend_requests(cache: ChunkCache, executor: ThreadPoolExecutor) -> None:
    obj = make_object(random_data(3 * MIB), chunk_size=256 * KIB)
    reader = ChunkReader(cache, executor)
    fetch = CountingFetch(obj)
    assert await read_all(reader, obj, fetch, 0, len(obj.data) - 1) == obj.data
    await settle(reader)
    cold = len(fetch.calls)
    assert cold >= 1
    for first, last in [(0, len(obj.data) - 1), (100, 200), (MIB - 1, 2 * MIB + 1)]:
        assert await read_all(reader, obj, fetch, first, last) == obj.data[first : last + 1]
    assert len(fetch.calls) == cold
    await reader.close()


async def test_a_restart_keeps_the_cache(
    cache_dir: Path, io_executor: ThreadPoolExecutor, executor: ThreadPoolExecutor, ring: KeyRing
) -> None:
    obj = make_object(text_data(2 * MIB), chunk_size=256 * KIB, compression="on", ring=ring)
    first_cache = ChunkCache(cache_dir, 64 * MIB, executor=io_executor)
    reader = ChunkReader(first_cache, executor)
    fetch = CountingFetch(obj)
    assert await read_all(reader, obj, fetch, 0, len(obj.data) - 1) == obj.data
    await settle(reader)
    await reader.close()
    first_cache.close()
    # A new process: a new cache on the same directory, a new reader.
    second_cache = ChunkCache(cache_dir, 64 * MIB, executor=io_executor)
    reader = ChunkReader(second_cache, executor)
    again = CountingFetch(obj)
    assert await read_all(reader, obj, again, 0, len(obj.data) - 1) == obj.data
    assert again.calls == []
    await reader.close()
    second_cache.close()


async def test_an_overwrite_or_delete_never_serves_stale_bytes(
    cache: ChunkCache, executor: ThreadPoolExecutor, ring: KeyRing
) -> None:
    reader = ChunkReader(cache, executor)
    size = MIB
    old = make_object(random_data(size, seed=10), chunk_size=64 * KIB, ring=ring)
    fetch_old = CountingFetch(old)
    assert await read_all(reader, old, fetch_old, 0, size - 1) == old.data
    await settle(reader)
    # The same key is overwritten: same size and chunk layout, other bytes, a new object version.
    new = make_object(random_data(size, seed=11), chunk_size=64 * KIB, ring=ring)
    assert new.manifest.object_id != old.manifest.object_id
    fetch_new = CountingFetch(new)
    assert await read_all(reader, new, fetch_new, 0, size - 1) == new.data
    assert fetch_new.bytes_fetched == len(new.stored)  # nothing came from the old version's entries
    # Deleted, then written again with the very same bytes: still a new version, fetched afresh.
    again = make_object(old.data, chunk_size=64 * KIB, ring=ring)
    fetch_again = CountingFetch(again)
    assert await read_all(reader, again, fetch_again, 0, size - 1) == old.data
    assert fetch_again.bytes_fetched == len(again.stored)
    await reader.close()


@pytest.mark.parametrize("encrypted", [True, False])
async def test_the_disk_cache_holds_the_stored_chunks_as_fetched(
    cache: ChunkCache, cache_dir: Path, executor: ThreadPoolExecutor, ring: KeyRing, encrypted: bool
) -> None:
    # Nothing on the cache disk that the store does not hold: each entry carries one stored chunk,
    # byte for byte (sealed under the object's DEK when encrypted, compressed when it shrank), never
    # the plaintext; and a read from those entries alone gives the original bytes back.
    obj = make_object(
        text_data(MIB - 5, seed=8), chunk_size=256 * KIB, compression="on", ring=ring if encrypted else None
    )
    reader = ChunkReader(cache, executor, memory_bytes=0)
    fetch = CountingFetch(obj)
    assert await read_all(reader, obj, fetch, 0, len(obj.data) - 1) == obj.data
    await settle(reader)
    index = obj.manifest.index
    assert len(index) == 4
    for i in range(len(index)):
        ref = index.chunk(i)
        entry = await cache.get(chunk_key(obj, i))
        assert entry is not None
        assert bytes(entry) == bytes(obj.stored[ref.stored_offset : ref.stored_offset + ref.stored_len])
        assert len(entry) < ref.original_len  # compressed: the cache holds what the store holds
    on_disk = b"".join(p.read_bytes() for p in value_files(cache_dir))
    assert obj.data[: 64 * KIB] not in on_disk and b'"offset": ' not in on_disk
    calls = len(fetch.calls)
    assert await read_all(reader, obj, fetch, 100, len(obj.data) - 1) == obj.data[100:]
    assert len(fetch.calls) == calls
    await reader.close()


async def test_a_forward_readers_chunks_skip_the_page_cache_and_a_seeks_do_not(
    cache_dir: Path, io_executor: ThreadPoolExecutor, executor: ThreadPoolExecutor, ring: KeyRing
) -> None:
    # cache_direct_io = auto: the chunks of a read from an object's start (a forward reader, which holds
    # them in memory while it needs them) are written with O_DIRECT, padded to 4 KiB blocks; those of a
    # read in the middle of another object (a seek: the next seeks come back to them) are not.
    cache = ChunkCache(cache_dir, 64 << 20, executor=io_executor, direct_io="auto")
    try:
        forward = make_object(text_data(MIB, seed=21), chunk_size=256 * KIB, compression="on", ring=ring)
        seek = make_object(text_data(MIB, seed=22), chunk_size=256 * KIB, compression="on", ring=ring)
        reader = ChunkReader(cache, executor, memory_bytes=0, prefetch_bytes=0)
        assert await read_all(reader, forward, CountingFetch(forward), 0, MIB - 1) == forward.data
        await settle(reader)
        if cache._cache.disk.direct is None:
            pytest.skip("this file system refuses O_DIRECT")
        forward_files = set(value_files(cache_dir))
        assert len(forward_files) == 4
        assert all(p.stat().st_size % 4096 == 0 for p in forward_files)
        start = 300 * KIB
        got = await read_all(reader, seek, CountingFetch(seek), start, start + 10 * KIB)
        assert got == seek.data[start : start + 10 * KIB + 1]
        await settle(reader)
        (seek_file,) = set(value_files(cache_dir)) - forward_files
        ref = seek.manifest.index.chunk(1)
        assert seek_file.stat().st_size == 9 + ref.stored_len  # header and payload, no padding
        await reader.close()
    finally:
        cache.close()


async def test_an_entry_that_does_not_decode_is_a_stale_miss(
    cache: ChunkCache, executor: ThreadPoolExecutor, ring: KeyRing
) -> None:
    # The key binds the stored version, so an entry whose bytes are not that version's chunk cannot
    # arise from the cache itself; if one did (another object's chunk, another version's), the
    # decoder's check stops it: the reader drops it as stale (not disk damage) and fetches the chunk.
    obj = make_object(random_data(512 * KIB, seed=12), chunk_size=128 * KIB, ring=ring)
    other = make_object(random_data(512 * KIB, seed=12), chunk_size=128 * KIB, ring=ring)
    ref = other.manifest.index.chunk(1)
    metrics = Metrics()
    reader = ChunkReader(cache, executor, memory_bytes=0, metrics=metrics)
    await cache.put(
        chunk_key(obj, 1), bytes(other.stored[ref.stored_offset : ref.stored_offset + ref.stored_len])
    )
    fetch = CountingFetch(obj)
    assert await read_all(reader, obj, fetch, 130 * KIB, 140 * KIB) == obj.data[130 * KIB : 140 * KIB + 1]
    assert len(fetch.calls) == 1  # the chunk came from the backend after all
    assert cache.corrupt == 0 and metrics.cache_corrupt._value.get() == 0
    await settle(reader)
    entry = await cache.get(chunk_key(obj, 1))  # replaced by the chunk as the store holds it
    own = obj.manifest.index.chunk(1)
    assert entry is not None
    assert bytes(entry) == bytes(obj.stored[own.stored_offset : own.stored_offset + own.stored_len])
    await reader.close()


@pytest.mark.parametrize("damage", ["flip", "truncate"])
async def test_a_corrupt_entry_is_refetched(
    cache: ChunkCache, cache_dir: Path, executor: ThreadPoolExecutor, damage: str
) -> None:
    obj = make_object(random_data(256 * KIB), chunk_size=64 * KIB)
    reader = ChunkReader(cache, executor, memory_bytes=0)  # every repeat goes to the disk cache
    fetch = CountingFetch(obj)
    assert await read_all(reader, obj, fetch, 70 * KIB, 80 * KIB) == obj.data[70 * KIB : 80 * KIB + 1]
    await settle(reader)
    (path,) = value_files(cache_dir)  # only chunk 1 was needed
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[-1] ^= 0x80
    else:
        del raw[len(raw) // 2 :]
    path.write_bytes(raw)
    calls = len(fetch.calls)
    assert await read_all(reader, obj, fetch, 64 * KIB, 128 * KIB - 1) == obj.data[64 * KIB : 128 * KIB]
    assert len(fetch.calls) == calls + 1
    assert cache.corrupt == 1
    await settle(reader)
    # The refetched chunk went back into the cache, good this time.
    assert await read_all(reader, obj, fetch, 64 * KIB, 65 * KIB) == obj.data[64 * KIB : 65 * KIB + 1]
    assert len(fetch.calls) == calls + 1
    await reader.close()


async def test_eviction_keeps_the_bound_while_reading(
    io_executor: ThreadPoolExecutor, executor: ThreadPoolExecutor, tmp_path: Path
) -> None:
    limit = 2 * MIB
    cache = ChunkCache(tmp_path / "small", limit, executor=io_executor)
    obj = make_object(random_data(8 * MIB), chunk_size=256 * KIB)
    reader = ChunkReader(cache, executor, prefetch_bytes=MIB)
    fetch = CountingFetch(obj)
    for first in range(0, len(obj.data), 512 * KIB):
        assert (
            await read_all(reader, obj, fetch, first, first + 512 * KIB - 1)
            == obj.data[first : first + 512 * KIB]
        )
        await settle(reader)
        assert cache.size_bytes() <= limit
        assert sum(p.stat().st_size for p in value_files(tmp_path / "small")) <= limit
    assert cache.evictions > 0
    await reader.close()
    cache.close()


async def test_repeats_are_served_from_memory(
    cache: ChunkCache, cache_dir: Path, executor: ThreadPoolExecutor
) -> None:
    obj = make_object(random_data(4 * MIB), chunk_size=4 * MIB)
    reader = ChunkReader(cache, executor, memory_bytes=8 * MIB)
    fetch = CountingFetch(obj)
    assert await read_all(reader, obj, fetch, 0, MIB - 1) == obj.data[:MIB]
    await settle(reader)
    for path in value_files(cache_dir):
        path.unlink()  # the disk copy is gone; the next 1 MiB reads of the chunk do not need it
    for first in range(MIB, 4 * MIB, MIB):
        assert await read_all(reader, obj, fetch, first, first + MIB - 1) == obj.data[first : first + MIB]
    assert len(fetch.calls) == 1
    assert cache.corrupt == 0
    # Without the memory tier the same reads go to the disk, find nothing and fetch again.
    cold = ChunkReader(cache, executor, memory_bytes=0)
    assert await read_all(cold, obj, fetch, MIB, 2 * MIB - 1) == obj.data[MIB : 2 * MIB]
    assert len(fetch.calls) == 2
    await reader.close()
    await cold.close()


async def test_a_warm_forward_reader_finds_the_next_chunk_in_memory(
    cache: ChunkCache, executor: ThreadPoolExecutor
) -> None:
    obj = make_object(random_data(2 * MIB), chunk_size=256 * KIB)
    warmer = ChunkReader(cache, executor, memory_bytes=0)
    fetch = CountingFetch(obj)
    assert await read_all(warmer, obj, fetch, 0, 2 * MIB - 1) == obj.data  # every chunk on disk
    await settle(warmer)
    await warmer.close()
    calls = len(fetch.calls)

    reader = ChunkReader(cache, executor, memory_bytes=8 * MIB)
    step = 100 * KIB
    assert await read_all(reader, obj, fetch, 0, step - 1) == obj.data[:step]
    await settle(reader)
    assert chunk_key(obj, 1) not in reader._hot  # one read is no direction yet
    assert await read_all(reader, obj, fetch, step, 2 * step - 1) == obj.data[step : 2 * step]
    await settle(reader)
    # Moving forward: the next chunk came from the disk cache into memory before being asked for.
    assert chunk_key(obj, 1) in reader._hot and chunk_key(obj, 2) not in reader._hot
    assert len(fetch.calls) == calls  # and nothing from the backend
    await reader.close()


async def test_a_chunk_evicted_while_promoted_is_fetched_again(
    cache: ChunkCache, executor: ThreadPoolExecutor
) -> None:
    obj = make_object(random_data(1 * MIB), chunk_size=256 * KIB)
    fetch = CountingFetch(obj)
    reader = ChunkReader(cache, executor, memory_bytes=8 * MIB, prefetch_bytes=0)
    assert await read_all(reader, obj, fetch, 0, MIB - 1) == obj.data
    await settle(reader)
    reader._hot.clear()
    cache._delete_sync(chunk_key(obj, 1).to_bytes())  # the promote of chunk 1 will find nothing on disk
    calls = len(fetch.calls)
    # Two forward reads in chunk 0, then across into chunk 1: correct bytes, chunk 1 fetched once.
    assert await read_all(reader, obj, fetch, 0, 99) == obj.data[:100]
    assert await read_all(reader, obj, fetch, 100, 300 * KIB) == obj.data[100 : 300 * KIB + 1]
    await settle(reader)
    assert len(fetch.calls) == calls + 1
    assert not reader._promoting
    await reader.close()


# -- sharing and coalescing ----------------------------------------------------------------------------


@pytest.mark.parametrize("use_cache", [True, False])
async def test_concurrent_readers_share_one_fetch_per_chunk(
    cache: ChunkCache, executor: ThreadPoolExecutor, ring: KeyRing, use_cache: bool
) -> None:
    obj = make_object(random_data(2 * MIB), chunk_size=128 * KIB, ring=ring)
    metrics = Metrics()
    reader = ChunkReader(cache if use_cache else None, executor, prefetch_bytes=MIB, metrics=metrics)
    gate = asyncio.Event()
    fetch = CountingFetch(obj, gate=gate)
    first, last = 100 * KIB, MIB + 5
    readers = [asyncio.create_task(read_all(reader, obj, fetch, first, last)) for _ in range(8)]
    await until(lambda: reader.joins >= 7)  # all queued up on the one download, held at the gate
    gate.set()
    assert await asyncio.gather(*readers) == [obj.data[first : last + 1]] * 8
    await settle(reader)
    # Each stored byte of the range went over the wire once, whatever the number of readers.
    span = obj.manifest.index.span(first, last)
    assert sorted(fetch.calls)[0][0] == span.stored_start
    covered = sorted(fetch.calls)
    for (_, end), (start, _) in itertools.pairwise(covered):
        assert end == start  # back to back, never overlapping
    assert covered[-1][1] == span.stored_end
    assert reader.joins > 0
    assert metrics.singleflight_joins._value.get() == reader.joins
    await reader.close()


async def test_a_missing_run_is_one_request(executor: ThreadPoolExecutor) -> None:
    obj = make_object(random_data(4 * MIB), chunk_size=256 * KIB)
    reader = ChunkReader(None, executor, prefetch_bytes=0)
    fetch = CountingFetch(obj)
    # 1 MiB crossing chunk boundaries: five chunks, one GET.
    first = 3 * 256 * KIB - 100
    assert await read_all(reader, obj, fetch, first, first + MIB - 1) == obj.data[first : first + MIB]
    assert len(fetch.calls) == 1
    await reader.close()


async def test_cold_sequential_scan_fetches_big_windows(
    cache: ChunkCache, executor: ThreadPoolExecutor, ring: KeyRing
) -> None:
    # Kafka catching up: 1 MiB fetches one after another over a 64 MiB segment of 4 MiB chunks.
    obj = make_object(random_data(64 * MIB), chunk_size=4 * MIB, ring=ring)
    reader = ChunkReader(cache, executor, prefetch_bytes=16 * MIB)
    fetch = CountingFetch(obj)
    for first in range(0, 64 * MIB, MIB):
        assert await read_all(reader, obj, fetch, first, first + MIB - 1) == obj.data[first : first + MIB]
    await settle(reader)
    assert len(fetch.calls) / 64 <= 0.1
    assert fetch.bytes_fetched == len(obj.stored)  # every chunk exactly once
    assert reader.policy.issued > 0 and reader.policy.used == reader.policy.issued
    await reader.close()


async def test_chunk_at_a_time_reads_are_prefetched(cache: ChunkCache, executor: ThreadPoolExecutor) -> None:
    # The Aiven plugin: one ranged GET per 4 MiB chunk, each starting where the last ended.
    obj = make_object(random_data(64 * MIB), chunk_size=4 * MIB)
    reader = ChunkReader(cache, executor, prefetch_bytes=16 * MIB)
    fetch = CountingFetch(obj)
    for first in range(0, 64 * MIB, 4 * MIB):
        assert (
            await read_all(reader, obj, fetch, first, first + 4 * MIB - 1)
            == obj.data[first : first + 4 * MIB]
        )
    await settle(reader)
    # 16 chunk reads cost at most half as many backend GETs, each stored byte fetched once. How far
    # prefetch ramps up before the reader catches it depends on timing (a loaded machine gets 7 GETs,
    # an idle one 5 or 6); benchmarks/fetch.py measures the GETs per MiB.
    assert len(fetch.calls) <= 8
    assert fetch.bytes_fetched == len(obj.stored)
    await reader.close()


async def test_long_reads_dropped_early_are_continued(
    cache: ChunkCache, executor: ThreadPoolExecutor
) -> None:
    # Kafka's other way: a GET from a position to the end, about 1 MiB consumed, the stream closed.
    obj = make_object(random_data(64 * MIB), chunk_size=4 * MIB)
    reader = ChunkReader(cache, executor, prefetch_bytes=16 * MIB)
    fetch = CountingFetch(obj)
    position = 0
    while position < len(obj.data):
        got = bytearray()
        stream = reader.read(obj.manifest, obj.ctx, fetch, position, len(obj.data) - 1)
        async for piece in stream:
            got += piece
            if len(got) >= MIB:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        take = min(MIB, len(got))
        assert bytes(got[:take]) == obj.data[position : position + take]
        position += take
    await settle(reader)
    assert len(fetch.calls) / 64 <= 0.1
    await reader.close()


async def test_prefetch_stops_at_the_object_end(cache: ChunkCache, executor: ThreadPoolExecutor) -> None:
    obj = make_object(random_data(10 * MIB + 5), chunk_size=MIB)
    reader = ChunkReader(cache, executor, prefetch_bytes=16 * MIB)
    fetch = CountingFetch(obj)
    for first in range(0, len(obj.data), MIB // 2):
        last = min(len(obj.data), first + MIB // 2) - 1
        assert await read_all(reader, obj, fetch, first, last) == obj.data[first : last + 1]
    await settle(reader)
    assert max(end for _, end in fetch.calls) == len(obj.stored)
    assert fetch.bytes_fetched == len(obj.stored)
    assert reader.policy.issued <= len(obj.manifest.index)
    # Reading the end again fetches nothing and schedules nothing.
    calls = len(fetch.calls)
    assert await read_all(reader, obj, fetch, len(obj.data) - 10, len(obj.data) - 1) == obj.data[-10:]
    await settle(reader)
    assert len(fetch.calls) == calls
    await reader.close()


async def test_random_reads_do_not_prefetch_past_their_range(
    cache: ChunkCache, executor: ThreadPoolExecutor
) -> None:
    obj = make_object(random_data(32 * MIB), chunk_size=MIB)
    reader = ChunkReader(cache, executor, prefetch_bytes=16 * MIB)
    fetch = CountingFetch(obj)
    for first in (20 * MIB, 3 * MIB, 27 * MIB, 11 * MIB):
        assert await read_all(reader, obj, fetch, first, first + 1000) == obj.data[first : first + 1001]
    await settle(reader)
    assert fetch.bytes_fetched == 4 * obj.manifest.index.chunk(0).stored_len
    await reader.close()


# -- failures ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("encrypted", [True, False])
async def test_tampered_stored_data_is_an_integrity_error(
    cache: ChunkCache, executor: ThreadPoolExecutor, ring: KeyRing, encrypted: bool
) -> None:
    obj = make_object(random_data(MIB), chunk_size=128 * KIB, ring=ring if encrypted else None)
    bad = 3
    ref = obj.manifest.index.chunk(bad)
    obj.stored[ref.stored_offset + 10] ^= 0x01
    reader = ChunkReader(cache, executor)
    fetch = CountingFetch(obj)
    got = bytearray()
    with pytest.raises(errors.IntegrityError):
        async for piece in reader.read(obj.manifest, obj.ctx, fetch, 0, len(obj.data) - 1):
            got += piece
    assert bytes(got) == obj.data[: ref.original_offset]  # good bytes up to the bad chunk, then the error
    await settle(reader)
    # deleted; its neighbours are fine
    assert await cache.contains_many([chunk_key(obj, bad), chunk_key(obj, bad + 1)]) == [False, True]
    # Every reader of the bad chunk gets the error, every time; the others are served.
    results = await asyncio.gather(
        *(read_all(reader, obj, fetch, ref.original_offset, ref.original_offset + 5) for _ in range(4)),
        return_exceptions=True,
    )
    assert all(isinstance(r, errors.IntegrityError) for r in results)
    assert await read_all(reader, obj, fetch, 0, 1000) == obj.data[:1001]
    await reader.close()


async def test_a_fetch_error_reaches_every_waiter_and_is_not_remembered(
    cache: ChunkCache, executor: ThreadPoolExecutor
) -> None:
    obj = make_object(random_data(MIB), chunk_size=128 * KIB)
    reader = ChunkReader(cache, executor)
    gate = asyncio.Event()
    fetch = CountingFetch(obj, gate=gate, fail=errors.ServiceUnavailable("backend down"))
    readers = [asyncio.create_task(read_all(reader, obj, fetch, 0, 300 * KIB)) for _ in range(5)]
    await until(lambda: reader.joins >= 4)
    gate.set()
    results = await asyncio.gather(*readers, return_exceptions=True)
    assert all(isinstance(r, errors.ServiceUnavailable) for r in results)
    await settle(reader)
    fetch.fail = None
    assert await read_all(reader, obj, fetch, 0, 300 * KIB) == obj.data[: 300 * KIB + 1]
    await reader.close()


async def test_a_short_backend_answer_is_an_error(executor: ThreadPoolExecutor) -> None:
    obj = make_object(random_data(MIB), chunk_size=128 * KIB)

    async def short(start: int, end: int) -> AsyncIterator[bytes]:
        yield bytes(obj.stored[start : end - 1])

    reader = ChunkReader(None, executor)
    with pytest.raises(errors.IntegrityError):
        async for _ in reader.read(obj.manifest, obj.ctx, short, 0, 1000):
            pass
    await reader.close()


async def test_an_answer_longer_than_asked_is_an_error(executor: ThreadPoolExecutor) -> None:
    obj = make_object(random_data(MIB), chunk_size=128 * KIB)

    async def long(start: int, end: int) -> AsyncIterator[bytes]:
        yield bytes(obj.stored[start:end]) + b"x"

    reader = ChunkReader(None, executor)
    with pytest.raises(errors.IntegrityError):
        async for _ in reader.read(obj.manifest, obj.ctx, long, 0, 1000):
            pass
    await reader.close()


async def test_a_chunk_is_served_while_the_rest_of_its_request_is_still_arriving(
    executor: ThreadPoolExecutor,
) -> None:
    """One GET brings several chunks; the first one reaches the reader before the answer has ended."""
    obj = make_object(random_data(MIB), chunk_size=128 * KIB)
    rest = asyncio.Event()
    calls: list[tuple[int, int]] = []

    async def held_back(start: int, end: int) -> AsyncIterator[bytes]:
        calls.append((start, end))
        first_end = obj.manifest.index.chunk(0).stored_len + 10
        yield bytes(obj.stored[start:first_end])  # the first chunk and a little of the second
        await rest.wait()
        yield bytes(obj.stored[first_end:end])

    reader = ChunkReader(None, executor, prefetch_bytes=0)
    pieces = reader.read(obj.manifest, obj.ctx, held_back, 0, 512 * KIB - 1)
    first = await asyncio.wait_for(anext(pieces), timeout=30)
    assert bytes(first) == obj.data[: 128 * KIB]
    assert len(calls) == 1 and calls[0][1] > obj.manifest.index.chunk(1).stored_offset  # one GET
    rest.set()
    got = bytes(first) + b"".join([bytes(p) async for p in pieces])
    assert got == obj.data[: 512 * KIB]
    await reader.close()


async def test_a_reader_hanging_up_does_not_fail_the_others(
    cache: ChunkCache, executor: ThreadPoolExecutor
) -> None:
    obj = make_object(random_data(2 * MIB), chunk_size=256 * KIB)
    reader = ChunkReader(cache, executor, prefetch_bytes=0)  # only the read's own chunks are fetched
    gate = asyncio.Event()
    fetch = CountingFetch(obj, gate=gate)
    leaver = asyncio.create_task(read_all(reader, obj, fetch, 0, MIB))
    await until(lambda: bool(fetch.calls))
    stayer = asyncio.create_task(read_all(reader, obj, fetch, 0, MIB))
    await until(lambda: reader.joins >= 1)
    leaver.cancel()  # the first reader, whose request started the download, goes away
    await until(leaver.done)
    gate.set()
    assert await stayer == obj.data[: MIB + 1]
    with pytest.raises(asyncio.CancelledError):
        await leaver
    await settle(reader)
    assert fetch.bytes_fetched == obj.manifest.index.span(0, MIB).stored_end  # downloaded once
    await reader.close()


async def test_close_cancels_downloads(cache: ChunkCache, executor: ThreadPoolExecutor) -> None:
    obj = make_object(random_data(8 * MIB), chunk_size=MIB)
    reader = ChunkReader(cache, executor)
    gate = asyncio.Event()  # never opened: downloads hang until cancelled
    fetch = CountingFetch(obj, gate=gate)
    pending = asyncio.create_task(read_all(reader, obj, fetch, 0, len(obj.data) - 1))
    await until(lambda: len(fetch.calls) >= 2)  # the first chunks, and the window ahead of them
    await reader.close()
    assert not reader._tasks
    with pytest.raises(errors.ServiceUnavailable):
        await pending
    with pytest.raises(errors.ServiceUnavailable):
        await read_all(reader, obj, fetch, 0, 10)


# -- resources and metrics -----------------------------------------------------------------------------


async def test_memory_stays_within_a_window(executor: ThreadPoolExecutor) -> None:
    # One long read of a 64 MiB object without a disk cache, consumed slowly: memory is a window or two
    # of chunks, never the whole range.
    obj = make_object(random_data(64 * MIB), chunk_size=MIB)
    reader = ChunkReader(
        None, executor, prefetch_bytes=8 * MIB, max_request_bytes=8 * MIB, memory_bytes=4 * MIB
    )
    fetch = CountingFetch(obj)
    tracemalloc.start()
    try:
        total = 0
        async for piece in reader.read(obj.manifest, obj.ctx, fetch, 0, len(obj.data) - 1):
            assert piece == obj.data[total : total + len(piece)]
            total += len(piece)
            await asyncio.sleep(0.001)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == len(obj.data)
    assert peak < 40 * MIB
    await reader.close()


async def test_metrics(cache: ChunkCache, executor: ThreadPoolExecutor, ring: KeyRing) -> None:
    obj = make_object(text_data(2 * MIB), chunk_size=256 * KIB, compression="on", ring=ring)
    metrics = Metrics()
    reader = ChunkReader(cache, executor, prefetch_bytes=MIB, metrics=metrics)
    fetch = CountingFetch(obj)
    for first in range(0, 2 * MIB, 256 * KIB):
        await read_all(reader, obj, fetch, first, first + 256 * KIB - 1)
    await settle(reader)
    await read_all(reader, obj, fetch, 0, 2 * MIB - 1)

    def value(counter: object, *labels: str) -> float:
        return counter.labels(*labels)._value.get()  # type: ignore[attr-defined]

    chunks = len(obj.manifest.index)
    assert value(metrics.cache_requests, "hit") + value(metrics.cache_requests, "miss") == 2 * chunks
    assert value(metrics.cache_requests, "hit") >= chunks
    assert value(metrics.cache_bytes, "hit") + value(metrics.cache_bytes, "miss") == 2 * len(obj.data)
    assert value(metrics.transform_cpu_seconds, "read") > 0
    assert value(metrics.prefetch_chunks, "issued") == reader.policy.issued > 0
    assert value(metrics.prefetch_chunks, "used") == reader.policy.used
    await reader.close()
    assert value(metrics.prefetch_chunks, "wasted") == reader.policy.issued - reader.policy.used


# -- many readers at once ------------------------------------------------------------------------------


async def test_many_concurrent_random_readers_with_a_small_cache(
    tmp_path: Path, io_executor: ThreadPoolExecutor, executor: ThreadPoolExecutor, ring: KeyRing
) -> None:
    objs = [
        make_object(random_data(3 * MIB, seed=s), chunk_size=128 * KIB, ring=ring, compression="auto")
        for s in range(3)
    ]
    cache = ChunkCache(
        tmp_path / "c", MIB, executor=io_executor
    )  # far smaller than the data: constant eviction
    reader = ChunkReader(cache, executor, prefetch_bytes=512 * KIB, max_request_bytes=256 * KIB)
    fetches = [CountingFetch(o, delay=0.001) for o in objs]
    rnd = random.Random(7)

    async def client(n: int) -> None:
        for _ in range(15):
            k = rnd.randrange(len(objs))
            size = len(objs[k].data)
            first = rnd.randrange(size)
            last = min(size - 1, first + rnd.randrange(1, 700 * KIB))
            assert await read_all(reader, objs[k], fetches[k], first, last) == objs[k].data[first : last + 1]

    await asyncio.gather(*(client(n) for n in range(12)))
    await settle(reader)
    assert cache.size_bytes() <= MIB
    await reader.close()
    cache.close()


@pytest.mark.parametrize("first", [3 * MIB + 512 * KIB, 2 * MIB])
async def test_a_read_crossing_a_chunk_boundary_is_one_get(
    cache: ChunkCache, executor: ThreadPoolExecutor, first: int
) -> None:
    # A 1 MiB fetch, or a chunk-size read of a plugin, that starts inside a chunk and ends in the next:
    # both chunks come in one ranged GET, not the second one a round trip after the first.
    obj = make_object(random_data(12 * MIB), chunk_size=4 * MIB)
    reader = ChunkReader(cache, executor)
    fetch = CountingFetch(obj)
    last = first + (MIB if first % MIB else 4 * MIB) - 1
    assert await read_all(reader, obj, fetch, first, last) == obj.data[first : last + 1]
    await settle(reader)
    assert len(fetch.calls) == 1
    refs = [obj.manifest.index.chunk(i) for i in (0, 1)]
    assert fetch.calls[0] == (refs[0].stored_offset, refs[1].stored_offset + refs[1].stored_len)
    await reader.close()


def count_inflated(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the zstd frames inflated from now on, in order."""
    inflated: list[int] = []
    real_inflate = ZstdStage._inflate

    def counting(self: ZstdStage, payload: bytes | memoryview, frame: Frame) -> bytes:
        inflated.append(frame.content_size)
        return real_inflate(self, payload, frame)

    monkeypatch.setattr(ZstdStage, "_inflate", counting)
    return inflated


async def test_a_seek_inflates_only_what_it_reads_and_keeps_no_partial_chunk(
    cache: ChunkCache, executor: ThreadPoolExecutor, ring: KeyRing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that is not a forward scan needs part of a 4 MiB chunk (stored as four 1 MiB zstd frames):
    only the frames holding it are inflated; the chunk is cached on disk as fetched but not held in
    memory half decoded, and another reader of the same download gets its own part right."""
    obj = make_object(text_data(8 * MIB), chunk_size=4 * MIB, compression="on", ring=ring, frame_size=MIB)
    assert obj.manifest.version == 2
    inflated = count_inflated(monkeypatch)
    reader = ChunkReader(cache, executor, prefetch_bytes=0)
    gate = asyncio.Event()
    fetch = CountingFetch(obj, gate=gate)
    first = 4 * MIB + 1_500_000  # inside chunk 1's second frame
    seek = asyncio.create_task(read_all(reader, obj, fetch, first, first + 300_000 - 1))
    await until(lambda: bool(fetch.calls))
    # Before the seek's start, so not a continuation of it: another seek, which joins the same GET.
    other = asyncio.create_task(read_all(reader, obj, fetch, 4 * MIB + 100, 4 * MIB + 1099))
    await until(lambda: reader.joins >= 1)
    gate.set()
    assert await seek == obj.data[first : first + 300_000]
    assert await other == obj.data[4 * MIB + 100 : 4 * MIB + 1100]
    assert len(fetch.calls) == 1
    assert sum(inflated) == 2 * MIB  # the seek's frame, then the other reader's first frame
    await settle(reader)
    assert chunk_key(obj, 1) not in reader._hot
    assert await cache.contains_many([chunk_key(obj, 1)]) == [True]
    # A forward reader of the same chunk gets it whole, from the disk cache, and keeps it in memory.
    inflated.clear()
    assert await read_all(reader, obj, fetch, 4 * MIB, 5 * MIB - 1) == obj.data[4 * MIB : 5 * MIB]
    assert await read_all(reader, obj, fetch, 5 * MIB, 6 * MIB - 1) == obj.data[5 * MIB : 6 * MIB]
    assert len(fetch.calls) == 1 and chunk_key(obj, 1) in reader._hot
    await reader.close()


async def test_a_seek_across_a_chunk_boundary_inflates_only_its_frames_of_both(
    cache: ChunkCache, executor: ThreadPoolExecutor, ring: KeyRing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer's 1 MiB fetch from a random batch start ends in the next chunk: both chunks come in one
    GET, and of each only the frames the fetch covers are inflated (a frame of each, not the whole of the
    second chunk); a forward reader of the second chunk later still gets it whole."""
    obj = make_object(text_data(12 * MIB), chunk_size=4 * MIB, compression="on", ring=ring, frame_size=MIB)
    inflated = count_inflated(monkeypatch)
    reader = ChunkReader(cache, executor, prefetch_bytes=0)
    fetch = CountingFetch(obj)
    first = 8 * MIB - 300_000  # chunk 1's last frame, then chunk 2's first
    assert await read_all(reader, obj, fetch, first, first + MIB - 1) == obj.data[first : first + MIB]
    assert len(fetch.calls) == 1
    assert inflated == [MIB, MIB]
    await settle(reader)
    assert chunk_key(obj, 2) not in reader._hot
    assert await cache.contains_many([chunk_key(obj, 1), chunk_key(obj, 2)]) == [True, True]
    inflated.clear()
    got = await read_all(reader, obj, fetch, 8 * MIB, 9 * MIB - 1)
    assert got == obj.data[8 * MIB : 9 * MIB] and len(fetch.calls) == 1
    await reader.close()


async def test_the_frames_of_a_seek_inflate_on_two_threads_at_once(
    ring: KeyRing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1 MiB fetch inside a chunk needs two 1 MiB frames: they inflate on two executor threads at the
    same time (the barrier holds each until the other is there too, and breaks if they come one after
    the other), and the bytes are right. With one thread the second frame waits its turn, no deadlock."""
    obj = make_object(text_data(8 * MIB), chunk_size=4 * MIB, compression="on", ring=ring, frame_size=MIB)
    first = 4 * MIB + 700_000  # chunk 1's first frame, then its second
    real_inflate = ZstdStage._inflate
    barrier = threading.Barrier(2, timeout=30)
    threads: set[int] = set()

    def meeting(self: ZstdStage, payload: bytes | memoryview, frame: Frame) -> bytes:
        threads.add(threading.get_ident())
        barrier.wait()
        return real_inflate(self, payload, frame)

    monkeypatch.setattr(ZstdStage, "_inflate", meeting)
    with ThreadPoolExecutor(2) as pool:
        reader = ChunkReader(None, pool, prefetch_bytes=0)
        got = await read_all(reader, obj, CountingFetch(obj), first, first + MIB - 1)
        assert got == obj.data[first : first + MIB]
        assert len(threads) == 2
        await reader.close()
    monkeypatch.setattr(ZstdStage, "_inflate", real_inflate)
    inflated = count_inflated(monkeypatch)
    with ThreadPoolExecutor(1) as pool:
        reader = ChunkReader(None, pool, prefetch_bytes=0)
        got = await read_all(reader, obj, CountingFetch(obj), first, first + MIB - 1)
        assert got == obj.data[first : first + MIB] and inflated == [MIB, MIB]
        await reader.close()


async def test_seeks_into_a_chunk_decode_its_stored_bytes_from_memory(
    executor: ThreadPoolExecutor, ring: KeyRing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A seek keeps the chunk's stored bytes (not its plaintext) in memory: the next seek into the same
    chunk is decoded from them, with no request and, again, only the frames it needs inflated."""
    obj = make_object(text_data(8 * MIB), chunk_size=4 * MIB, compression="on", ring=ring, frame_size=MIB)
    inflated = count_inflated(monkeypatch)
    reader = ChunkReader(None, executor, prefetch_bytes=0)  # no disk cache: memory or the backend
    fetch = CountingFetch(obj)
    # Each before the one before it: seeks, none continuing another (which would read the chunk whole).
    seeks = [(4 * MIB + 3 * MIB + 5, 10), (4 * MIB + 2_500_000, 200_000), (4 * MIB + 100, 1000)]
    for first, length in seeks:
        inflated.clear()
        assert (
            await read_all(reader, obj, fetch, first, first + length - 1) == obj.data[first : first + length]
        )
        assert sum(inflated) == MIB, (first, inflated)  # one frame each
    assert len(fetch.calls) == 1
    assert chunk_key(obj, 1) not in reader._hot  # no plaintext kept for a seek
    # The stored bytes are counted against memory_bytes like plaintexts, and go first when least used.
    small = ChunkReader(
        None,
        executor,
        prefetch_bytes=0,
        memory_bytes=max(obj.manifest.index.chunk(i).stored_len for i in (0, 1)),
    )
    fetch = CountingFetch(obj)
    for first in (4 * MIB + 10, 10, 4 * MIB + 20):
        assert await read_all(small, obj, fetch, first, first + 99) == obj.data[first : first + 100]
    assert len(fetch.calls) == 3
    assert small._hot.size_bytes <= small._hot.max_bytes
    await reader.close()
    await small.close()


@pytest.mark.parametrize(("gap", "reads_ahead"), [(0, True), (2 * MIB, False)])
async def test_a_read_just_past_a_whole_read_is_a_seek_not_a_continuation(
    cache: ChunkCache, executor: ThreadPoolExecutor, gap: int, reads_ahead: bool
) -> None:
    """Consumers seeking at random: a 1 MiB read that starts 2 MiB past where a whole read ended does not
    continue it (no read-ahead past its end); one that starts where it ended does."""
    obj = make_object(random_data(40 * MIB), chunk_size=4 * MIB)
    reader = ChunkReader(cache, executor, prefetch_bytes=8 * MIB)
    fetch = CountingFetch(obj)
    first = 4 * MIB + 100
    assert await read_all(reader, obj, fetch, first, first + MIB - 1) == obj.data[first : first + MIB]
    await settle(reader)
    fetch.calls.clear()
    second = first + MIB + gap
    got = await read_all(reader, obj, fetch, second, second + MIB - 1)
    assert got == obj.data[second : second + MIB]
    await settle(reader)
    index = obj.manifest.index
    own = index.span(second, second + MIB - 1)
    beyond = [c for c in fetch.calls if c[1] > own.stored_end]
    assert bool(beyond) is reads_ahead, fetch.calls
    await reader.close()


@pytest.mark.parametrize("first", [0, 4 * MIB])
async def test_a_read_from_the_first_byte_reads_ahead(
    cache: ChunkCache, executor: ThreadPoolExecutor, first: int
) -> None:
    """A read from byte 0 is taken for the start of a forward scan: the chunks after it are fetched into
    the cache while the read is served. A first read from anywhere else fetches only its own chunk."""
    obj = make_object(random_data(24 * MIB), chunk_size=4 * MIB)
    reader = ChunkReader(cache, executor, prefetch_bytes=8 * MIB)
    fetch = CountingFetch(obj)
    got = await read_all(reader, obj, fetch, first, first + 4 * MIB - 1)
    assert got == obj.data[first : first + 4 * MIB]
    await settle(reader)
    index = obj.manifest.index
    own = index.span(first, first + 4 * MIB - 1).stored_end
    if first == 0:
        assert fetch.bytes_fetched > own
        assert [await cache.contains_many([chunk_key(obj, i)]) for i in (1, 2)] == [[True], [True]]
    else:
        assert fetch.calls == [(index.chunk(1).stored_offset, own)]
    await reader.close()


class _RecordingPool(PriorityPool):
    """A PriorityPool of one thread that records the chunks it decodes, in the order it runs them, each
    with whether it was queued as urgent."""

    def __init__(self) -> None:
        super().__init__(1)
        self.queued = 0
        self.ran: list[tuple[int, bool]] = []  # (original offset of the chunk, urgent)

    def _noting(
        self, urgent: bool, fn: Callable[..., object], args: tuple[object, ...]
    ) -> Callable[..., object]:
        ref = next((a for a in args if hasattr(a, "original_offset")), None)
        if ref is None:
            return fn
        self.queued += 1

        def noted(*a: object, **k: object) -> object:
            self.ran.append((ref.original_offset, urgent))  # type: ignore[attr-defined]
            return fn(*a, **k)

        return noted

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        return super().submit(self._noting(False, fn, args), *args, **kwargs)

    def submit_urgent(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        return super().submit_urgent(self._noting(True, fn, args), *args, **kwargs)


@dataclass
class _FirstRead:
    """A forward reader's first read under way (see _first_read_with_the_window_in_first)."""

    pool: _RecordingPool
    obj: StoredObject
    reader: ChunkReader
    counting: CountingFetch
    window_in: asyncio.Event
    task: asyncio.Task[bytes]

    async def close(self) -> None:
        await self.reader.close()
        self.pool.shutdown()


async def _first_read_with_the_window_in_first(
    cache: ChunkCache, own_in: asyncio.Event | None = None
) -> _FirstRead:
    """A forward reader's first read on a one-thread pool, its window's bytes all in before any of its
    own chunk's: the own chunk's GET waits for the window's to end, then for `own_in` when given. The
    read's task has not run yet when this returns."""
    obj = make_object(text_data(20 * MIB), chunk_size=4 * MIB, compression="on")
    pool = _RecordingPool()
    reader = ChunkReader(cache, pool, prefetch_bytes=16 * MIB)
    counting = CountingFetch(obj)
    window_in = asyncio.Event()

    async def fetch(start: int, end: int) -> AsyncIterator[bytes]:
        if start == 0:
            await window_in.wait()
            if own_in is not None:
                await own_in.wait()
        async for piece in counting(start, end):
            yield piece
        if start != 0:
            window_in.set()

    task = asyncio.ensure_future(read_all(reader, obj, fetch, 0, MIB - 1))  # type: ignore[arg-type]
    return _FirstRead(pool, obj, reader, counting, window_in, task)


def _urgent_first(ran: list[tuple[int, bool]]) -> int:
    """How many of the decodes run first are the reader's own chunk's (chunk 0, urgent): at least one,
    and none of them after other work."""
    n = next((i for i, r in enumerate(ran) if r != (0, True)), len(ran))
    assert n >= 1 and (0, True) not in ran[n:]
    return n


async def test_the_chunk_a_reader_waits_for_decodes_ahead_of_prefetched_ones(
    cache: ChunkCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forward reader's first GET: its own chunk is decoded as urgent work and the chunks prefetched
    beside it are not, so on a busy pool (its one thread held until every chunk is in) the reader's
    chunk is decoded first although its bytes came in after all the others'. (The window's decodes
    do not wait for the reader's chunk here: that is the next test's; this is the pool's order.)"""
    monkeypatch.setattr(reader_module, "OWN_FIRST_WAIT", 0)
    run = await _first_read_with_the_window_in_first(cache)
    hold = threading.Event()
    run.pool.submit(hold.wait, 10)  # before the read's task has run: it decodes nothing yet
    try:
        await until(lambda: run.pool.queued == 5)  # every chunk in, its decode queued
        hold.set()
        assert await run.task == run.obj.data[:MIB]
        await settle(run.reader)
        assert run.counting.calls[0][0] != 0 and run.counting.calls[1][0] == 0
        # The reader's chunk first: only the part it asks for (its frames may go as several pieces of
        # work); then, behind the window, the whole chunk for the reads after it.
        first = _urgent_first(run.pool.ran)
        assert run.pool.ran[first:] == [(n * 4 * MIB, False) for n in range(1, 5)] + [(0, False)]
    finally:
        hold.set()
        await run.close()


async def test_a_readers_own_chunk_decodes_before_its_window(
    cache: ChunkCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunks of a window fetched beside a reader's own chunk wait for its decode before theirs: on
    an idle pool they would start the moment their bytes are in, and a decode already running is not
    overtaken by urgent work (on two cores, two of them held a first read back by 10-20 ms)."""
    monkeypatch.setattr(reader_module, "OWN_FIRST_WAIT", 30.0)  # far more than the test needs
    run = await _first_read_with_the_window_in_first(cache)
    try:
        assert await asyncio.wait_for(run.task, timeout=60) == run.obj.data[:MIB]
        await settle(run.reader)
        first = _urgent_first(run.pool.ran)
        assert sorted(run.pool.ran[first:]) == [(n * 4 * MIB, False) for n in range(5)]
    finally:
        await run.close()


async def test_a_window_waits_for_the_readers_chunk_only_so_long(
    cache: ChunkCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's chunk whose bytes are slow to come does not hold the window back for longer than
    OWN_FIRST_WAIT: the window's chunks decode and land in the cache while it is still on its way."""
    monkeypatch.setattr(reader_module, "OWN_FIRST_WAIT", 0.05)
    own_in = asyncio.Event()
    run = await _first_read_with_the_window_in_first(cache, own_in)
    try:
        await asyncio.wait_for(run.window_in.wait(), timeout=60)
        await until(lambda: len(run.pool.ran) == 4)
        assert all(not urgent for _, urgent in run.pool.ran)
        assert not run.task.done()
        own_in.set()
        assert await asyncio.wait_for(run.task, timeout=60) == run.obj.data[:MIB]
        assert run.pool.ran[4] == (0, True)
    finally:
        own_in.set()
        await run.close()
