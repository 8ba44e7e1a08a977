"""ChunkCache: persistence, self-checking entries, older layouts, the size bound and LRU eviction."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import stat
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from awscrt.checksums import crc32c

from tsproxy.cache.chunks import ChunkCache, ChunkKey
from tsproxy.metrics import Metrics

KIB = 1024
MIB = 1024 * KIB
OID_A = bytes(range(16))
OID_B = bytes(range(1, 17))


def key(chunk_no: int, object_id: bytes = OID_A, segment_no: int = 1) -> ChunkKey:
    return ChunkKey(object_id, segment_no, chunk_no)


def payload(n: int, size: int = 256 * KIB) -> bytes:
    return (n.to_bytes(4, "big") * (size // 4 + 1))[:size]


def value_files(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.val"))


def entry_dirs(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.is_dir()]


def only_value_file(directory: Path) -> Path:
    files = value_files(directory)
    assert len(files) == 1
    return files[0]


async def test_put_get_and_miss(cache: ChunkCache) -> None:
    assert await cache.get(key(0)) is None
    await cache.put(key(0), payload(0))
    assert bytes(await cache.get(key(0)) or b"") == payload(0)
    assert await cache.contains_many([key(0), key(1)]) == [True, False]
    assert cache.size_bytes() >= len(payload(0))


async def test_keys_separate_objects_segments_and_chunks(cache: ChunkCache) -> None:
    keys = [key(0), key(1), key(0, OID_B), key(0, segment_no=2)]
    for n, k in enumerate(keys):
        await cache.put(k, payload(n))
    for n, k in enumerate(keys):
        assert bytes(await cache.get(k) or b"") == payload(n)


async def test_small_and_empty_payloads(cache: ChunkCache) -> None:
    await cache.put(key(0), b"x")
    await cache.put(key(1), b"")
    assert bytes(await cache.get(key(0)) or b"?") == b"x"
    got = await cache.get(key(1))
    assert got is not None and bytes(got) == b""


async def test_restart_keeps_entries(cache_dir: Path, io_executor: ThreadPoolExecutor) -> None:
    first = ChunkCache(cache_dir, 64 << 20, executor=io_executor)
    await first.put(key(0), payload(0))
    first.close()
    second = ChunkCache(cache_dir, 64 << 20, executor=io_executor)
    try:
        assert bytes(await second.get(key(0)) or b"") == payload(0)
        assert second.size_bytes() >= len(payload(0))
    finally:
        second.close()


@pytest.mark.parametrize("where", ["header", "payload"])
async def test_flipped_byte_is_deleted_counted_and_a_miss(
    cache_dir: Path, io_executor: ThreadPoolExecutor, where: str
) -> None:
    metrics = Metrics()
    c = ChunkCache(cache_dir, 64 << 20, executor=io_executor, metrics=metrics)
    try:
        await c.put(key(0), payload(0))
        path = only_value_file(cache_dir)
        raw = bytearray(path.read_bytes())
        raw[3 if where == "header" else len(raw) // 2] ^= 0x01  # the length, or the chunk's bytes
        path.write_bytes(raw)
        assert await c.get(key(0)) is None
        assert c.corrupt == 1
        assert metrics.cache_corrupt._value.get() == 1
        assert await c.contains_many([key(0)]) == [False]  # deleted, so the next read refetches and re-puts
        assert value_files(cache_dir) == []
    finally:
        c.close()


@pytest.mark.parametrize("keep", [0, 1, 8, 256 * KIB])
async def test_truncated_entry_is_a_miss(cache: ChunkCache, cache_dir: Path, keep: int) -> None:
    await cache.put(key(0), payload(0))
    path = only_value_file(cache_dir)
    with path.open("r+b") as f:
        f.truncate(keep)
    assert await cache.get(key(0)) is None
    assert cache.corrupt == 1


async def test_vanished_file_is_a_miss(cache: ChunkCache, cache_dir: Path) -> None:
    await cache.put(key(0), payload(0))
    only_value_file(cache_dir).unlink()
    assert await cache.get(key(0)) is None
    await cache.put(key(0), payload(1))  # the stale row is replaced cleanly
    assert bytes(await cache.get(key(0)) or b"") == payload(1)


async def test_entries_swapped_between_keys_are_refused(cache: ChunkCache, cache_dir: Path) -> None:
    # The checksum covers the key, so a value file that ends up under another key is not served.
    await cache.put(key(0), payload(0))
    first = set(value_files(cache_dir))
    await cache.put(key(1), payload(1))
    (second,) = set(value_files(cache_dir)) - first
    (one,) = first
    a, b = one.read_bytes(), second.read_bytes()
    one.write_bytes(b)
    second.write_bytes(a)
    assert await cache.get(key(0)) is None
    assert await cache.get(key(1)) is None
    assert cache.corrupt == 2


def older_entry(kind: int, disk_key: bytes, data: bytes) -> bytes:
    """An entry as a release before stored-chunk caching wrote it: a decoded chunk, CRC32C or sealed."""
    if kind == 1:
        return struct.pack(">BII", 1, len(data), crc32c(data, crc32c(disk_key))) + data
    return bytes((3,)) + os.urandom(4 + 12) + os.urandom(len(data) + 16)  # key tag, nonce, sealed


@pytest.mark.parametrize("kind", [1, 3])
async def test_an_entry_of_an_older_layout_is_a_miss_not_corruption(
    cache: ChunkCache, cache_dir: Path, kind: int
) -> None:
    metrics = Metrics()
    cache._metrics = metrics
    await cache.put(key(0), payload(0))
    path = only_value_file(cache_dir)
    # An intact entry of the older layout under the same key: its payload is a decoded chunk, which
    # must never be handed to a reader as stored bytes.
    path.write_bytes(older_entry(kind, key(0).to_bytes(), payload(0)))
    assert await cache.get(key(0)) is None
    assert await cache.contains_many([key(0)]) == [False]  # deleted, so it does not hold space
    assert cache.corrupt == 0 and metrics.cache_corrupt._value.get() == 0
    await cache.put(key(0), payload(1))
    assert bytes(await cache.get(key(0)) or b"") == payload(1)


async def test_an_unknown_kind_is_damage(cache: ChunkCache, cache_dir: Path) -> None:
    await cache.put(key(0), payload(0))
    path = only_value_file(cache_dir)
    raw = bytearray(path.read_bytes())
    raw[0] = 9
    path.write_bytes(raw)
    assert await cache.get(key(0)) is None
    assert cache.corrupt == 1


async def test_discard_stale_deletes_without_counting(cache: ChunkCache) -> None:
    await cache.put(key(0), payload(0))
    await cache.discard_stale(key(0))
    assert await cache.contains_many([key(0)]) == [False]
    assert await cache.get(key(0)) is None
    assert cache.corrupt == 0


def test_bad_arguments(cache_dir: Path) -> None:
    with pytest.raises(ValueError):
        ChunkCache(cache_dir, 0)


async def test_eviction_keeps_the_size_bound(cache_dir: Path, io_executor: ThreadPoolExecutor) -> None:
    metrics = Metrics()
    limit = 2 << 20
    c = ChunkCache(cache_dir, limit, executor=io_executor, metrics=metrics)
    try:
        for n in range(40):  # 10 MiB through a 2 MiB cache
            await c.put(key(n), payload(n))
            assert c.size_bytes() <= limit
            assert sum(p.stat().st_size for p in value_files(cache_dir)) <= limit
        assert c.evictions >= 40 - limit // (256 * KIB)
        assert metrics.cache_evictions._value.get() == c.evictions
        assert metrics.cache_size._value.get() == c.size_bytes()
        # The newest entries survive, the oldest went first.
        assert bytes(await c.get(key(39)) or b"") == payload(39)
        assert await c.get(key(0)) is None
    finally:
        c.close()


async def test_entry_directories_are_made_at_open_one_level_and_kept_when_emptied(
    cache_dir: Path, io_executor: ThreadPoolExecutor
) -> None:
    # All 256 are there before the first put, so no put makes a directory; 40 entries through a cache
    # that holds a few empty some by evictions, and they stay.
    c = ChunkCache(cache_dir, 1 << 20, executor=io_executor)
    try:
        made = {d.name for d in entry_dirs(cache_dir)}
        assert made == {f"{n:02x}" for n in range(256)}
        inodes = {d.name: d.stat().st_ino for d in entry_dirs(cache_dir)}
        for n in range(40):
            await c.put(key(n), payload(n))
        files = value_files(cache_dir)
        assert files and all(len(p.relative_to(cache_dir).parts) == 2 for p in files)
        assert {d.name: d.stat().st_ino for d in entry_dirs(cache_dir)} == inodes  # none made again
        for n in range(40 - len(files), 40):
            assert bytes(await c.get(key(n)) or b"") == payload(n)
    finally:
        c.close()


async def test_an_entry_directory_removed_by_hand_is_made_again(
    cache_dir: Path, io_executor: ThreadPoolExecutor
) -> None:
    c = ChunkCache(cache_dir, 64 << 20, executor=io_executor)
    try:
        for d in entry_dirs(cache_dir):
            d.rmdir()  # all empty: the cache is new
        await c.put(key(0), payload(0))
        assert bytes(await c.get(key(0)) or b"") == payload(0)
        assert only_value_file(cache_dir).parent.stat().st_mode & 0o777 == 0o700
    finally:
        c.close()


async def test_an_entry_of_the_two_level_layout_is_read_and_its_directories_removed_with_it(
    cache_dir: Path, io_executor: ThreadPoolExecutor
) -> None:
    c = ChunkCache(cache_dir, 64 << 20, executor=io_executor)
    try:
        await c.put(key(0), payload(0))
        entry = only_value_file(cache_dir)
    finally:
        c.close()
    # Where releases before put it: two levels of directories, recorded so in the database.
    old = cache_dir / "ab" / "cd" / entry.name
    old.parent.mkdir(parents=True)
    entry.rename(old)
    with sqlite3.connect(cache_dir / "cache.db") as db:
        db.execute("UPDATE Cache SET filename = ?", (os.path.join("ab", "cd", entry.name),))
    c = ChunkCache(cache_dir, 64 << 20, executor=io_executor)
    try:
        assert bytes(await c.get(key(0)) or b"") == payload(0)
        await c.discard_stale(key(0))
        assert not old.exists() and not (cache_dir / "ab").exists()
        assert await c.get(key(0)) is None
    finally:
        c.close()


async def test_eviction_is_least_recently_used(cache_dir: Path, io_executor: ThreadPoolExecutor) -> None:
    c = ChunkCache(cache_dir, 2 << 20, executor=io_executor)
    try:
        for n in range(4):
            await c.put(key(n), payload(n))
        await c.get(key(0))  # chunk 0 is now the most recently used
        for n in range(4, 12):
            await c.put(key(n), payload(n))
            await c.get(key(0))
        assert await c.get(key(0)) is not None
        assert await c.get(key(1)) is None
        assert c.evictions > 0
    finally:
        c.close()


async def test_restart_with_a_smaller_limit_shrinks(cache_dir: Path, io_executor: ThreadPoolExecutor) -> None:
    c = ChunkCache(cache_dir, 16 << 20, executor=io_executor)
    for n in range(16):
        await c.put(key(n), payload(n))
    c.close()
    small = ChunkCache(cache_dir, 1 << 20, executor=io_executor)
    try:
        assert small.size_bytes() <= 1 << 20
        assert small.evictions > 0
    finally:
        small.close()


def _modes(directory: Path) -> dict[str, int]:
    return {
        str(p.relative_to(directory)): stat.S_IMODE(p.stat().st_mode)
        for p in [directory, *directory.rglob("*")]
    }


async def test_files_are_private_whatever_the_umask(cache_dir: Path, io_executor: ThreadPoolExecutor) -> None:
    old = os.umask(0)
    try:
        c = ChunkCache(cache_dir, 64 << 20, executor=io_executor)
        for n in range(4):
            await c.put(key(n), payload(n))
        modes = _modes(cache_dir)
        c.close()
    finally:
        os.umask(old)
    assert {"cache.db", "cache.db-wal", "cache.db-shm"} <= set(modes)
    assert len(value_files(cache_dir)) == 4
    for name, mode in modes.items():
        assert mode == (0o700 if (cache_dir / name).is_dir() else 0o600), (name, oct(mode))


def _widen(directory: Path) -> None:
    for path in [directory, *directory.rglob("*")]:
        # SQLite's -wal and -shm files go when the last connection to the database closes: a cache
        # thread's may close while this walks the directory.
        with contextlib.suppress(FileNotFoundError):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)


def _damage_pages(db: Path) -> None:
    """Keep SQLite's 100-byte header, overwrite every page after it."""
    with open(db, "r+b") as f:
        f.seek(100)
        f.write(b"\xff" * (db.stat().st_size - 100))


async def test_an_older_cache_with_wide_modes_is_tightened(
    cache_dir: Path, io_executor: ThreadPoolExecutor
) -> None:
    c = ChunkCache(cache_dir, 64 << 20, executor=io_executor)
    await c.put(key(0), payload(0))
    c.close()
    _widen(cache_dir)
    again = ChunkCache(cache_dir, 64 << 20, executor=io_executor)
    try:
        assert bytes(await again.get(key(0)) or b"") == payload(0)  # kept, only its modes changed
        assert set(_modes(cache_dir).values()) == {0o700, 0o600}
    finally:
        again.close()


@pytest.mark.parametrize("damage", ["garbage", "truncated page"])
async def test_a_damaged_database_is_moved_aside(
    cache_dir: Path, io_executor: ThreadPoolExecutor, damage: str
) -> None:
    c = ChunkCache(cache_dir, 64 << 20, executor=io_executor)
    for n in range(3):
        await c.put(key(n), payload(n))
    c.close()
    db = cache_dir / "cache.db"
    if damage == "garbage":
        db.write_bytes(os.urandom(db.stat().st_size))
    else:  # opens, then fails the quick check
        _damage_pages(db)
    metrics = Metrics()
    again = ChunkCache(cache_dir, 64 << 20, executor=io_executor, metrics=metrics)
    try:
        assert len(again) == 0 and value_files(cache_dir) == []
        assert metrics.cache_resets.labels("damaged")._value.get() == 1
        await again.put(key(0), payload(0))
        assert bytes(await again.get(key(0)) or b"") == payload(0)
    finally:
        again.close()
    (aside,) = cache_dir.parent.glob("chunks.damaged-*")
    kept = {p.name for p in aside.iterdir()}  # the database to look at; no chunk files
    assert "cache.db" in kept and kept <= {"cache.db", "cache.db-wal", "cache.db-shm"}
    # A healthy cache opens as it is: nothing moved, nothing counted.
    metrics = Metrics()
    third = ChunkCache(cache_dir, 64 << 20, executor=io_executor, metrics=metrics)
    try:
        assert len(third) == 1 and metrics.cache_resets.labels("damaged")._value.get() == 0
    finally:
        third.close()


async def test_lookups_never_wait_behind_puts(cache: ChunkCache) -> None:
    # Puts run one at a time in the cache's writer thread: however many are queued (here all held
    # up, as behind slow disk writes), a lookup on a cold read's path still gets a thread at once.
    await cache.put(key(0), payload(0))
    cache._write_lock.acquire()
    try:
        puts = [asyncio.ensure_future(cache.put(key(n), payload(n))) for n in range(1, 9)]
        await asyncio.sleep(0.05)
        got = await asyncio.wait_for(cache.get(key(0)), 30)  # a guard against a hang, not a timing
        assert got == payload(0)
        assert not any(p.done() for p in puts)
    finally:
        cache._write_lock.release()
    await asyncio.gather(*puts)
    for n in range(9):
        assert await cache.get(key(n)) == payload(n)


# -- O_DIRECT entry files ------------------------------------------------------------------------------

ENTRY_HEADER = 9  # kind, payload length, CRC32C


def writes_direct(c: ChunkCache) -> bool:
    """Whether the cache writes its entries with O_DIRECT (the test directory's file system allows it)."""
    return c._cache.disk.direct is not None


@pytest.fixture
def direct_cache(cache_dir: Path, io_executor: ThreadPoolExecutor) -> Iterator[ChunkCache]:
    """A 64 MiB chunk cache with `direct_io` on (opt-in) in a fresh directory."""
    c = ChunkCache(cache_dir, 64 << 20, executor=io_executor, direct_io=True)
    yield c
    c.close()


@pytest.mark.parametrize("size", [0, 1, 4096 - ENTRY_HEADER, 4096 - ENTRY_HEADER + 1, 256 * KIB, 3 * MIB + 5])
async def test_direct_entries_are_padded_to_blocks_and_read_back(
    direct_cache: ChunkCache, cache_dir: Path, size: int
) -> None:
    await direct_cache.put(key(0), payload(0, size))
    if not writes_direct(direct_cache):
        pytest.skip("this file system refuses O_DIRECT")
    on_disk = only_value_file(cache_dir).stat().st_size
    assert on_disk % 4096 == 0 and 0 <= on_disk - (ENTRY_HEADER + size) < 4096
    got = await direct_cache.get(key(0))
    assert got is not None and bytes(got) == payload(0, size)
    assert direct_cache.corrupt == 0


@pytest.mark.parametrize("damage", ["nonzero padding", "a block too much"])
async def test_padding_that_is_not_the_writers_is_damage(
    direct_cache: ChunkCache, cache_dir: Path, damage: str
) -> None:
    await direct_cache.put(key(0), payload(0, 1000))
    path = only_value_file(cache_dir)
    raw = bytearray(path.read_bytes()[: ENTRY_HEADER + 1000])
    raw += bytes(4096 - len(raw))
    if damage == "nonzero padding":
        raw[-1] = 1
    else:
        raw += bytes(4096)
    path.write_bytes(raw)
    assert await direct_cache.get(key(0)) is None
    assert direct_cache.corrupt == 1


async def test_buffered_by_default_and_either_kind_reads_the_other(
    cache_dir: Path, io_executor: ThreadPoolExecutor
) -> None:
    c = ChunkCache(cache_dir, 64 << 20, executor=io_executor)  # off by default
    try:
        await c.put(key(0), payload(0, 1000))
        assert not writes_direct(c)
        assert only_value_file(cache_dir).stat().st_size == ENTRY_HEADER + 1000  # as releases before wrote it
        assert bytes(await c.get(key(0)) or b"?") == payload(0, 1000)
    finally:
        c.close()
    # An entry written either way is read by the other.
    again = ChunkCache(cache_dir, 64 << 20, executor=io_executor, direct_io=True)
    try:
        await again.put(key(1), payload(1, 1000))
        assert bytes(await again.get(key(0)) or b"?") == payload(0, 1000)
        assert bytes(await again.get(key(1)) or b"?") == payload(1, 1000)
    finally:
        again.close()


async def test_auto_writes_with_o_direct_only_what_is_not_read_soon(
    cache_dir: Path, io_executor: ThreadPoolExecutor
) -> None:
    # `tsproxy serve`'s default: a forward reader's chunk (held in memory while it is needed) skips the
    # page cache; a seeking reader's chunk, which the next seeks come back to, goes through it.
    c = ChunkCache(cache_dir, 64 << 20, executor=io_executor, direct_io="auto")
    try:
        await c.put(key(0), payload(0, 1000), read_soon=False)
        if not writes_direct(c):
            pytest.skip("this file system refuses O_DIRECT")
        await c.put(key(1), payload(1, 1000))
        await c.put(key(2), payload(2, 1000), read_soon=True)
        sizes = sorted(p.stat().st_size for p in value_files(cache_dir))
        assert sizes == [ENTRY_HEADER + 1000, ENTRY_HEADER + 1000, 4096]
        for n in range(3):
            assert bytes(await c.get(key(n)) or b"?") == payload(n, 1000)
        assert c.corrupt == 0
    finally:
        c.close()


@pytest.mark.parametrize("direct_io", [False, True])
async def test_read_soon_changes_nothing_unless_auto(
    cache_dir: Path, io_executor: ThreadPoolExecutor, direct_io: bool
) -> None:
    c = ChunkCache(cache_dir, 64 << 20, executor=io_executor, direct_io=direct_io)
    try:
        await c.put(key(0), payload(0, 1000), read_soon=False)
        await c.put(key(1), payload(1, 1000), read_soon=True)
        if direct_io and not writes_direct(c):
            pytest.skip("this file system refuses O_DIRECT")
        size = 4096 if direct_io else ENTRY_HEADER + 1000
        assert [p.stat().st_size for p in value_files(cache_dir)] == [size, size]
    finally:
        c.close()


def test_direct_io_is_true_false_or_auto(cache_dir: Path) -> None:
    with pytest.raises(ValueError, match="direct_io"):
        ChunkCache(cache_dir, 64 << 20, direct_io="sometimes")  # type: ignore[arg-type]


@pytest.mark.parametrize("refused_at", ["open", "write"])
async def test_a_file_system_refusing_o_direct_gets_buffered_entries(
    direct_cache: ChunkCache,
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    refused_at: str,
) -> None:
    import errno

    from tsproxy.cache import chunks

    real_open, real_write = os.open, os.write
    direct_fds: set[int] = set()

    def fake_open(path: str, flags: int, mode: int = 0o777) -> int:
        if flags & os.O_DIRECT and refused_at == "open":
            raise OSError(errno.EINVAL, "Invalid argument", path)
        fd = real_open(path, flags, mode)
        if flags & os.O_DIRECT:
            direct_fds.add(fd)
        return fd

    def fake_write(fd: int, data: bytes | memoryview) -> int:
        if fd in direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    # The refusal a file system without O_DIRECT gives (EINVAL), at open or at the first write.
    monkeypatch.setattr(chunks.os, "open", fake_open)
    monkeypatch.setattr(chunks.os, "write", fake_write)
    with caplog.at_level("INFO", logger="tsproxy.cache"):
        await direct_cache.put(key(0), payload(0, 1000))
        await direct_cache.put(key(1), payload(1, 1000))
    assert not writes_direct(direct_cache)
    assert [r.getMessage() for r in caplog.records if "O_DIRECT" in r.getMessage()] == [
        "chunk cache directory refuses O_DIRECT; entries are written through the page cache"
    ]
    assert sorted(p.stat().st_size for p in value_files(cache_dir)) == [ENTRY_HEADER + 1000] * 2
    for n in (0, 1):
        assert bytes(await direct_cache.get(key(n)) or b"?") == payload(n, 1000)


# -- keys known to the process -------------------------------------------------------------------------


class CountingExecutor(ThreadPoolExecutor):
    """A thread pool that counts the work handed to it."""

    def __init__(self) -> None:
        super().__init__(2, thread_name_prefix="test-cache-counting")
        self.submitted = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


async def test_a_key_never_cached_is_answered_without_the_database(cache_dir: Path) -> None:
    pool = CountingExecutor()
    c = ChunkCache(cache_dir, 64 << 20, executor=pool)
    try:
        await c.put(key(0), payload(0))
        pool.submitted = 0
        assert await c.get(key(1)) is None
        assert await c.contains_many([key(1), key(2)]) == [False, False]
        assert pool.submitted == 0
        # A key that has an entry is looked up, and so is every key of a mixed question.
        assert await c.contains_many([key(1), key(0)]) == [False, True]
        assert bytes(await c.get(key(0)) or b"") == payload(0)
        assert pool.submitted == 2
    finally:
        c.close()
        pool.shutdown()


async def test_known_keys_follow_restarts_deletes_and_evictions(
    cache_dir: Path, io_executor: ThreadPoolExecutor
) -> None:
    first = ChunkCache(cache_dir, 64 << 20, executor=io_executor)
    await first.put(key(0), payload(0))
    await first.put(key(1), payload(1))
    first.close()
    c = ChunkCache(cache_dir, 2 << 20, executor=io_executor)  # 2 MiB: about 7 entries of 256 KiB
    try:
        assert bytes(await c.get(key(0)) or b"") == payload(0)  # cached by the previous run
        await c.discard_stale(key(1))
        assert await c.get(key(1)) is None
        for n in range(2, 400):
            await c.put(key(n), payload(n))
        entries = len(c)
        assert entries < 10
        # Evicted keys are forgotten in batches: what the process remembers stays near the cache's size.
        assert len(c._known) <= 2 * entries + 64 + 1
        assert await c.get(key(2)) is None  # evicted long ago
        assert bytes(await c.get(key(399)) or b"") == payload(399)
    finally:
        c.close()


async def test_keys_that_cannot_be_listed_are_all_looked_up(
    cache_dir: Path, io_executor: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    first = ChunkCache(cache_dir, 64 << 20, executor=io_executor)
    await first.put(key(0), payload(0))
    first.close()

    def broken(self: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr("diskcache.Cache.iterkeys", broken)
    c = ChunkCache(cache_dir, 64 << 20, executor=io_executor)
    try:
        assert bytes(await c.get(key(0)) or b"") == payload(0)
        assert await c.get(key(1)) is None
        assert await c.contains_many([key(0), key(1)]) == [True, False]
    finally:
        c.close()


async def test_puts_beyond_what_the_writer_can_keep_up_with_are_skipped(
    cache_dir: Path, io_executor: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk slower than the reads: puts wait for the writer up to MAX_PENDING_PUT_BYTES, and the chunks
    beyond are served uncached (counted), never queued without bound."""
    import threading

    from tsproxy.cache import chunks

    monkeypatch.setattr(chunks, "MAX_PENDING_PUT_BYTES", 1 * MIB)
    metrics = Metrics()
    c = ChunkCache(cache_dir, 64 << 20, executor=io_executor, metrics=metrics)
    stuck = threading.Event()
    real_put = c._put_sync

    def slow_put(key: ChunkKey, data: bytes | memoryview, direct: bool = False) -> None:
        stuck.wait(30)  # a device that does not answer until the test lets it
        real_put(key, data, direct)

    monkeypatch.setattr(c, "_put_sync", slow_put)
    try:
        waiting = [asyncio.create_task(c.put(key(n), payload(n))) for n in range(4)]  # 4 x 256 KiB: 1 MiB
        await asyncio.sleep(0.05)
        assert not any(t.done() for t in waiting)
        await c.put(key(4), payload(4))  # over the bound: returns at once, not cached
        assert c.skipped == 1 and metrics.cache_skipped._value.get() == 1
        stuck.set()
        await asyncio.gather(*waiting)
        assert await c.contains_many([key(n) for n in range(5)]) == [True] * 4 + [False]
        await c.put(key(4), payload(4))  # caught up: cached again
        assert bytes(await c.get(key(4)) or b"") == payload(4)
    finally:
        stuck.set()
        c.close()
