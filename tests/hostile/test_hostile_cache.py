"""Finding 2 of issue 31: nothing read from the cache volume is deserialised, so a planted row runs nothing.

diskcache pickles keys and values that are not bytes, and unpickles what its database says was pickled:
a key row with `raw = 0` when keys are listed (at start), a value row in pickle mode on a hit. One such
row planted in `cache.db` by anyone who can write the cache volume used to run code as tsproxy. Here
every planted row carries a pickle that would copy the key ring out (as the attack in the issue did);
the tests assert the copy never appears, no unpickling happens at all (Python's `pickle.find_class`
audit event), and reads are served from the store. Damage the cache already handled (truncated, flipped
or swapped entry files, unknown kinds) is tested in tests/cache/test_cache_chunks.py.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sqlite3
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tsproxy.cache.chunks import ChunkCache, ChunkKey
from tsproxy.metrics import Metrics

_UNPICKLED: list[tuple[Any, ...]] = []
_WATCHING = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _WATCHING and event == "pickle.find_class":
        _UNPICKLED.append(args)


sys.addaudithook(_audit)  # audit hooks cannot be removed; this one only records while a test watches


@pytest.fixture
def no_unpickling() -> Iterator[list[tuple[Any, ...]]]:
    """Records every class or function an unpickler looks up while the test runs."""
    global _WATCHING
    _UNPICKLED.clear()
    _WATCHING = True
    try:
        yield _UNPICKLED
    finally:
        _WATCHING = False


class _CopyRing:
    """Unpickled, it copies `source` to `target`: the key ring leaving through the cache volume."""

    def __init__(self, source: Path, target: Path) -> None:
        self.source, self.target = source, target

    def __reduce__(self) -> tuple[Any, ...]:
        return (shutil.copyfile, (str(self.source), str(self.target)))


def _payload(source: Path, target: Path) -> bytes:
    return pickle.dumps(_CopyRing(source, target))


@contextmanager
def _db(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection that commits and is closed at the end of the block (sqlite3's own only commits)."""
    with closing(sqlite3.connect(path)) as con, con:
        yield con


def _plant(db: Path, rows: list[tuple[Any, ...]], sql: str) -> None:
    with _db(db) as con:
        con.executemany(sql, rows)


_INSERT = (
    "INSERT INTO Cache (key, raw, store_time, expire_time, access_time, access_count, tag, size, mode,"
    " filename, value) VALUES (?, ?, ?, NULL, ?, 0, NULL, ?, ?, ?, ?)"
)


def key(n: int) -> ChunkKey:
    return ChunkKey(b"hostile-object-1", 1, n)


async def test_planted_rows_are_never_unpickled_opened_or_deleted(
    tmp_path: Path, no_unpickling: list[tuple[Any, ...]]
) -> None:
    ring = tmp_path / "ring.json"
    ring.write_text('{"secret": "key material"}')
    stolen = tmp_path / "stolen"
    outside = tmp_path / "outside.val"  # a file a planted row names, to be read or culled
    outside.write_bytes(b"\x04" + bytes(200))
    directory = tmp_path / "chunks"
    with ThreadPoolExecutor(2) as pool:
        cache = ChunkCache(directory, 4 << 20, executor=pool)
        for n in range(3):
            await cache.put(key(n), bytes([n]) * 1000)
        cache.close()

        db = directory / "cache.db"
        evil = _payload(ring, stolen)
        now = time.time()
        entry_file = next(p for p in directory.rglob("*.val"))
        link = entry_file.with_name("0" * 30 + ".val")
        link.symlink_to(outside)
        _plant(
            db,
            [
                # A pickled key: listed when the cache opens.
                (sqlite3.Binary(evil), 0, now, now, 0, 1, None, b""),
                # Keys tsproxy looks up, with values in pickle mode (in the row, in a file), text mode,
                # a file outside the cache, a link out of it, and a raw str value.
                (sqlite3.Binary(key(10).to_bytes()), 1, now, 0.0, len(evil), 4, None, sqlite3.Binary(evil)),
                (sqlite3.Binary(key(11).to_bytes()), 1, now, 0.0, 0, 4, entry_file.name, None),
                (sqlite3.Binary(key(12).to_bytes()), 1, now, 0.0, 10, 3, str(entry_file), None),
                (
                    sqlite3.Binary(key(13).to_bytes()),
                    1,
                    now,
                    0.0,
                    10,
                    2,
                    "../" + outside.name,
                    None,
                ),
                (sqlite3.Binary(key(14).to_bytes()), 1, now, 0.0, 10, 2, str(outside), None),
                (
                    sqlite3.Binary(key(15).to_bytes()),
                    1,
                    now,
                    0.0,
                    10,
                    2,
                    str(link.relative_to(directory)),
                    None,
                ),
                (sqlite3.Binary(key(16).to_bytes()), 1, now, 0.0, 0, 1, None, "a string"),
                # A key of another type (raw str) and a pickled key that equals a real key once loaded.
                ("text key", 1, now, now, 0, 1, None, b""),
                (sqlite3.Binary(pickle.dumps(key(0).to_bytes())), 0, now, now, 0, 1, None, b""),
            ],
            _INSERT,
        )
        # The size accounting must still match the rows, or the cache is reset before anything is read.
        with _db(db) as con:
            con.execute(
                "UPDATE Settings SET value = (SELECT COALESCE(SUM(size), 0) FROM Cache) WHERE key = 'size'"
            )
            (pickled_file,) = con.execute(
                "SELECT filename FROM Cache WHERE key = ?", (key(11).to_bytes(),)
            ).fetchone()
        (directory / pickled_file).write_bytes(evil)

        metrics = Metrics()
        cache = ChunkCache(directory, 4 << 20, executor=pool, metrics=metrics)
        try:
            for n in range(10, 17):
                assert await cache.get(key(n)) is None, n
            # The entries that were the cache's own are still served.
            for n in range(3):
                assert bytes(await cache.get(key(n)) or b"") == bytes([n]) * 1000
            assert cache.corrupt == 7
            # Fill the cache past its limit: eviction culls planted rows too, and deletes no file of theirs.
            for n in range(100, 112):
                await cache.put(key(n), os.urandom(512 << 10))
        finally:
            cache.close()
    assert not stolen.exists()
    assert no_unpickling == []
    assert outside.read_bytes() == b"\x04" + bytes(200)
    assert ring.exists()


def _damage(kind: str, db: Path) -> None:
    with _db(db) as con:
        if kind == "setting":
            # Passed to the Disk's constructor by diskcache: an unexpected argument failed the start.
            con.execute("INSERT INTO Settings VALUES ('disk_evil', 1)")
        elif kind == "trigger":
            # Would keep the size accounting at zero, so the cache grew without bound.
            con.execute(
                "CREATE TRIGGER shrink AFTER INSERT ON Cache BEGIN"
                " UPDATE Settings SET value = 0 WHERE key = 'size'; END"
            )
        elif kind == "size":
            con.execute("UPDATE Settings SET value = -1000000000 WHERE key = 'size'")


@pytest.mark.parametrize("kind", ["setting", "trigger", "size"])
async def test_planted_settings_and_triggers_reset_the_cache(
    tmp_path: Path, kind: str, no_unpickling: list[tuple[Any, ...]]
) -> None:
    directory = tmp_path / "chunks"
    with ThreadPoolExecutor(2) as pool:
        cache = ChunkCache(directory, 4 << 20, executor=pool)
        await cache.put(key(0), b"x" * 1000)
        cache.close()
        _damage(kind, directory / "cache.db")
        metrics = Metrics()
        cache = ChunkCache(directory, 4 << 20, executor=pool, metrics=metrics)
        try:
            assert await cache.get(key(0)) is None  # started empty
            await cache.put(key(1), b"y" * 1000)
            assert bytes(await cache.get(key(1)) or b"") == b"y" * 1000
        finally:
            cache.close()
    resets = metrics.registry.get_sample_value("tsproxy_cache_resets_total", {"reason": "damaged"})
    assert resets == 1
    assert no_unpickling == []


async def test_planted_values_of_known_settings_do_not_apply(tmp_path: Path) -> None:
    directory = tmp_path / "chunks"
    with ThreadPoolExecutor(2) as pool:
        cache = ChunkCache(directory, 4 << 20, executor=pool)
        await cache.put(key(0), b"x" * 1000)
        cache.close()
        with _db(directory / "cache.db") as con:
            con.execute("UPDATE Settings SET value = 'off' WHERE key = 'sqlite_journal_mode'")
            con.execute("UPDATE Settings SET value = 'none' WHERE key = 'eviction_policy'")
            con.execute("UPDATE Settings SET value = 1 WHERE key = 'size_limit'")
        cache = ChunkCache(directory, 4 << 20, executor=pool)
        try:
            assert bytes(await cache.get(key(0)) or b"") == b"x" * 1000
        finally:
            cache.close()
    with _db(directory / "cache.db") as con:
        settings = dict(con.execute("SELECT key, value FROM Settings").fetchall())
        (mode,) = con.execute("PRAGMA journal_mode").fetchone()
    assert (settings["eviction_policy"], settings["size_limit"], mode) == (
        "least-recently-used",
        4 << 20,
        "wal",
    )


@pytest.mark.seaweed
def test_a_poisoned_cache_runs_nothing_and_reads_come_from_the_store(
    restartable: Any, no_unpickling: list[tuple[Any, ...]]
) -> None:
    proxy = restartable("seaweed", chunk_size="64KiB")
    s3 = proxy.client()
    bucket = f"h-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    body = os.urandom(600_000)
    s3.put_object(Bucket=bucket, Key="segment.log", Body=body)
    assert s3.get_object(Bucket=bucket, Key="segment.log")["Body"].read() == body
    cache_dir = Path(proxy.proxy.cfg.cache_dir)
    ring = Path(proxy.proxy.cfg.key_ring)
    proxy.stop()

    stolen = cache_dir.parent / "stolen-ring.json"
    evil = _payload(ring, stolen)
    db = cache_dir / "cache.db"
    with _db(db) as con:
        entries = con.execute("SELECT COUNT(*) FROM Cache").fetchone()[0]
        assert entries >= 1  # the read cached its chunks: every one is now a pickle
        con.execute("UPDATE Cache SET mode = 4, filename = NULL, value = ?", (sqlite3.Binary(evil),))
        con.execute(_INSERT, (sqlite3.Binary(evil), 0, time.time(), time.time(), 0, 1, None, b""))
        con.execute(
            "UPDATE Settings SET value = (SELECT COALESCE(SUM(size), 0) FROM Cache) WHERE key = 'size'"
        )

    proxy.restart()
    s3 = proxy.client()
    assert s3.get_object(Bucket=bucket, Key="segment.log")["Body"].read() == body
    assert (
        s3.get_object(Bucket=bucket, Key="segment.log", Range="bytes=70000-200000")["Body"].read()
        == (body[70000:200001])
    )
    assert not stolen.exists()
    assert no_unpickling == []
