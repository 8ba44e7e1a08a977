"""The chunk cache: stored chunks, exactly as the object store holds them, in a size-bounded LRU disk
cache that survives restarts.

A chunk is cached as fetched: compressed (when its segment is) and sealed (AES-256-GCM under the
object's data key, or its CRC32C for an object stored without encryption), and is decoded again on a
hit (cache.reader). So the cache never holds a byte the store does not hold, and what the store holds
encrypted stays encrypted on the node's disk with no key of the cache's own; a cache hit costs a read
of the stored size (about a quarter of the chunk for Kafka data) and a decode, and a put costs the write
of the stored size, nothing more.

Entries live in a `diskcache.Cache` directory, keyed by (version id, segment_no, chunk_no). The version
id (cache.reader.version_id) names one stored version of an object: its random object id together with
what each of its segments holds (salt, stored chunk sizes and CRC32Cs), so neither an overwritten object
nor another completion of the same multipart upload can be served from an old entry; the old entries
age out of the LRU, but for a deleted object's: a delete through this instance drops its version's
entries at once (`delete_many`). An entry is

    kind (u8 = 4) || payload length (u32 BE) || CRC32C(key || payload) (u32 BE) || payload || padding

where the padding is zeros up to the next multiple of 4096 bytes (fewer than 4096) in a file written with
O_DIRECT (see _DirectWrites; `direct_io`), and absent in one written through the page cache. Releases
before padding was written read a padded entry as damaged: deleted, counted and fetched again.

Which entries are written with O_DIRECT (`direct_io`): none (False), all (True), or ("auto", the default
of `tsproxy serve`) those put with `read_soon=False`: chunks a reader moving forward fetched, which it
holds in memory for as long as it needs them, while a seeking reader's chunks, which the next seeks come
back to moments later, go through the page cache.

An entry that fails its check (bit rot, a truncated file, a file swapped between keys) is deleted,
counted as corrupt and reported as a miss; it is never served. An entry of an older layout (kind 1, a
decoded chunk with a CRC32C; kind 3, a decoded chunk sealed under a key derived from the KEK) is not
damage: it is deleted and reported as a miss without counting as corruption. So is an intact entry
whose payload does not decode under the object's context (`discard_stale`): the key makes that all but
impossible, but the decoder's check, not the cache's, is what stands between such bytes and a reader.

Size: diskcache measures its volume as SQLite pages plus value file sizes, and evicts in two ways: a
`set` that finds the volume at its limit evicts up to `cull_limit` least recently used entries, and
`cull()` evicts in batches of ten until the volume is under the limit. Batches of ten would empty a
small cache at every put, so puts evict one entry each (cull_limit=1), which holds the bound while
chunks are of similar size, and `cull()` runs only when a put still leaves the volume over the limit (a
large chunk displacing a small one). The volume is at or below `max_bytes` whenever no put is in
progress. Not counted: the SQLite write-ahead log (a few MiB at most) and file system block rounding.

Only bytes, never objects: diskcache can keep any Python key or value by pickling it, and unpickles
what it finds in its database (a key row whose `raw` flag is 0, when keys are listed; a value row in
pickle mode, on a hit). Whoever can write to the cache volume could then run code as tsproxy. So the
cache's Disk (_PrivateDisk) keeps and reads only bytes: keys are 24-byte blobs, values are entry files
of this cache's own naming; any other row (a pickled key or value, text, a file name outside the cache
or not of its layout) is foreign: never deserialised, never opened or deleted, and, when a lookup meets
it, deleted and counted as corrupt like any damaged entry. The database's settings and schema are
checked against what diskcache itself creates before it is opened (a planted setting or trigger would
otherwise steer pragmas, the Disk's arguments or the size accounting): anything else there is damage.

Privacy: the directory is made 0700, the database (and its -wal and -shm files) and every entry file
0600, whatever the process umask; files left by an older version with wider modes are tightened when
the cache is opened.

Damage: a cache is disposable. When its database cannot be opened or fails SQLite's quick check, the
directory is moved aside as `<dir>.damaged-<UTC time>` (keeping its database for inspection, not its
chunk files) or, when it cannot be renamed (a volume's mount point), emptied; the cache then starts
empty, with one log line and `tsproxy_cache_resets_total{reason="damaged"}`.

Lookups of keys the process knows to have no entry (it lists the keys when it opens the cache and adds
each one it puts) answer at once, without a thread hop or a query: a cold read asks about every chunk it
fetches. Evicted keys stay in that list until it is listed again, which happens once it holds twice as
many keys as the cache has entries; a stale key costs only the query it would have cost anyway.

Every diskcache call runs off the event loop: lookups in the executor passed in, puts (the entry
file's write and the row insert, a few milliseconds a chunk) one at a time in a writer thread of
the cache's own. Puts are serialised anyway (SQLite has one writer), and a lookup on a cold read's path
never waits for a thread that a queue of puts holds.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import mmap
import os
import re
import shutil
import sqlite3
import stat
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import closing, suppress
from functools import cache
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar

import diskcache
from awscrt.checksums import crc32c

from tsproxy.metrics import Metrics

log = logging.getLogger("tsproxy.cache")

T = TypeVar("T")

DirectIo = bool | Literal["auto"]
"""Which cache entries are written with O_DIRECT: all (True), none (False), or a forward reader's ("auto")."""

_KIND_STORED = 4
# Decoded chunks: 1 with a CRC32C, 3 sealed under a cache key; 2 was never released. Misses, not damage.
_OLDER_KINDS = (1, 2, 3)
# What _open returns for an entry of an older layout (a distinct object).
_STALE = memoryview(b"")
_HEADER = struct.Struct(">BII")  # kind, payload length, CRC32C
# Entry files written with O_DIRECT are padded to a multiple of this (the alignment it needs).
DIRECT_BLOCK = 4096
# Stored bytes that may wait for the cache's writer; a put beyond them is skipped (the chunk is served,
# not cached), so a disk slower than the reads never makes the queue, and the memory it holds, grow.
MAX_PENDING_PUT_BYTES = 64 << 20
_KEY = struct.Struct(">16sII")
# Errors a damaged or vanished cache directory can raise; the cache degrades to misses on them.
_STORAGE_ERRORS = (OSError, sqlite3.Error, diskcache.Timeout)
_DB_NAME = diskcache.core.DBNAME  # "cache.db"
_DB_FILES = (_DB_NAME, _DB_NAME + "-wal", _DB_NAME + "-shm")
# SQLite's primary result codes for a file that is damaged or not a database at all.
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26
# Entry file names: this cache's `xx/<30 hex>.val` and diskcache's own two levels, `xx/yy/<28 hex>.val`.
_ENTRY_FILE = re.compile(r"[0-9a-f]{2}/(?:[0-9a-f]{2}/)?[0-9a-f]{28,30}\.val")
# Everything diskcache is told (so no value left in a database's Settings table applies).
_SETTINGS: dict[str, Any] = {
    **diskcache.core.DEFAULT_SETTINGS,
    "eviction_policy": "least-recently-used",
    "cull_limit": 1,  # see the module docstring
    "statistics": 0,
}


class _Everything(set[bytes]):
    """Known keys when they could not be listed: every key may have an entry."""

    def __contains__(self, _key: object) -> bool:
        return True


class _CacheDamaged(Exception):
    """The cache database cannot be used as it is; the cache is reset."""


class _ForeignEntry(Exception):
    """A row this cache never writes (not bytes in an entry file of its own): a damaged entry."""


class _Foreign:
    """What a key row that is not a raw blob lists as: never equal to a ChunkKey's bytes."""

    __slots__ = ()


_FOREIGN_KEY = _Foreign()


class ChunkKey(NamedTuple):
    """Names one stored chunk of one stored object version."""

    object_id: bytes  # of the version: cache.reader.version_id, not the manifest's object id alone
    segment_no: int
    chunk_no: int

    def to_bytes(self) -> bytes:
        """The diskcache key: 24 bytes, fixed layout, so equal keys are equal bytes."""
        return _KEY.pack(self.object_id, self.segment_no, self.chunk_no)


class _Pieces:
    """A read-only file-like over header + payload, so diskcache writes them without joining them first;
    `direct`: written with O_DIRECT where the cache can (_PrivateDisk.direct)."""

    def __init__(self, *pieces: bytes | memoryview, direct: bool = False) -> None:
        self._pieces: Iterator[bytes | memoryview] = iter(pieces)
        self.direct = direct

    def read(self, _size: int = -1) -> bytes | memoryview:
        # diskcache calls read() until it returns b"", so one piece per call is enough.
        return next(self._pieces, b"")


class _PrivateDisk(diskcache.Disk):
    """diskcache's Disk, but entry files are created 0600 and their directories 0700 whatever the umask,
    written with O_DIRECT when `direct` is set and the value asks for it (see _DirectWrites), and spread
    over 256 directories that are kept once made (diskcache's own makes two levels of them and removes
    each one it empties)."""

    direct: _DirectWrites | None = None

    def filename(
        self, key: Any = diskcache.core.UNKNOWN, value: Any = diskcache.core.UNKNOWN
    ) -> tuple[str, str]:
        """A random entry file name, in one of 256 directories (by its first two hex digits)."""
        name = os.urandom(16).hex()
        filename = os.path.join(name[:2], name[2:] + ".val")
        return filename, os.path.join(self._directory, filename)

    def put(self, key: Any) -> tuple[sqlite3.Binary, bool]:
        """A key's database form: only bytes are keys here (diskcache would pickle anything else)."""
        if type(key) is not bytes:
            raise TypeError(f"chunk cache keys are bytes, not {type(key).__name__}")
        return sqlite3.Binary(key), True

    def get(self, key: Any, raw: bool) -> Any:
        """A listed key: the bytes of a raw blob row; any other row is foreign and never unpickled."""
        if raw and type(key) in (bytes, sqlite3.Binary):
            return bytes(key)
        return _FOREIGN_KEY

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        """An entry: an open file (read) or the bytes of an entry file of this cache's own naming, or
        bytes held in the row itself. Anything else (pickle or text mode, a name outside the cache, a
        link) raises _ForeignEntry and is never deserialised or opened."""
        if mode == diskcache.core.MODE_RAW and type(value) in (bytes, sqlite3.Binary):
            return bytes(value)
        if mode != diskcache.core.MODE_BINARY or not _is_entry_file(filename):
            raise _ForeignEntry(f"mode {mode!r}, file {filename!r}")
        assert filename is not None
        try:
            fd = os.open(os.path.join(self._directory, filename), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _ForeignEntry(f"file {filename!r} is a link") from None
            raise
        handle = os.fdopen(fd, "rb")
        if read:
            return handle
        with handle:
            return handle.read()

    def remove(self, file_path: str) -> None:
        """Delete an entry's file. Its directory stays (diskcache's own removes emptied directories, so
        that almost every put paid for a mkdir: a new inode, some 5 % of a cold read's CPU), except one
        of the two-level layout of releases before, removed once empty as it was. A name not of the
        cache's own layout (a planted row's) is left alone: nothing outside the entries is ever deleted."""
        if not _is_entry_file(file_path):
            return
        full_path = os.path.join(self._directory, file_path)
        with suppress(OSError):
            os.remove(full_path)
        if file_path.count(os.sep) > 1:
            with suppress(OSError):
                os.removedirs(os.path.dirname(full_path))

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> tuple[Any, ...]:
        if not read:
            if type(value) is not bytes:  # diskcache would pickle it
                raise TypeError(f"chunk cache values are bytes, not {type(value).__name__}")
            return tuple(super().store(value, read, key=key))
        filename, full_path = self.filename(key, value)
        pieces = list(iter(lambda: value.read(1 << 22), b""))
        wants_direct = isinstance(value, _Pieces) and value.direct
        try:
            size = self._write(full_path, pieces, wants_direct)
        except FileNotFoundError:
            # The entry's directory is gone (made when the cache opened; removed by hand since).
            _make_private_dirs(self._directory, os.path.dirname(filename))
            size = self._write(full_path, pieces, wants_direct)
        return size, diskcache.core.MODE_BINARY, filename, None

    def _write(self, path: str, pieces: list[bytes | memoryview], wants_direct: bool) -> int:
        direct = self.direct
        if direct is not None and wants_direct:
            size = direct.write(path, pieces)
            if size is not None:
                return size
            self.direct = None  # the file system refuses O_DIRECT: buffered from now on
            log.info(
                "chunk cache directory refuses O_DIRECT; entries are written through the page cache",
                extra={"fields": {"cache_dir": str(direct.directory), "error": direct.refused}},
            )
        # O_EXCL as diskcache's own "xb": a random name never overwrites an entry.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        size = 0
        with os.fdopen(fd, "wb") as f:
            for piece in pieces:
                size += len(piece)
                f.write(piece)
        return size


class _DirectWrites:
    """Entry files written with O_DIRECT from one page-aligned buffer, padded with zeros to a whole
    number of blocks (the entry's header gives the payload's length, so readers ignore the padding).

    Why: a chunk cache is written once per chunk and read back through the memory tier, so the page
    cache's copy of a buffered write is mostly work no reader uses, and takes page cache from the broker's
    log beside it. On the project's machine, for cold reads of a producer-compressed segment (its chunks
    stored uncompressed), tsproxy's CPU was 2.6-3.0 s/GiB with buffered writes and 1.8 with these
    (benchmarks/cpu.py --producer-codec zstd). But a chunk read again soon after it was cached then
    comes from the device, not the page cache: random 1 MiB reads of uncompressed batches, which come
    back to such chunks, measured 0.71x direct against 0.83x with every entry buffered
    (benchmarks/fetch.py --rounds 5). So by default (`cache_direct_io = auto`) only a forward reader's
    chunks are written this way, and a seeking reader's go through the page cache.
    The write waits for the device, which only the cache's own writer thread does. Thread-safe (one
    buffer, one lock).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._buffer = mmap.mmap(-1, 1 << 20)  # anonymous: page-aligned, grown to the largest entry
        self.refused: str | None = None

    def write(self, path: str, pieces: list[bytes | memoryview]) -> int | None:
        """The padded size written, or None (nothing left behind) when the file system refuses O_DIRECT."""
        total = sum(len(p) for p in pieces)
        padded = -(-total // DIRECT_BLOCK) * DIRECT_BLOCK
        with self._lock:
            if len(self._buffer) < padded:
                self._buffer.close()
                self._buffer = mmap.mmap(-1, padded)
            with memoryview(self._buffer) as buf:
                pos = 0
                for piece in pieces:
                    buf[pos : pos + len(piece)] = piece
                    pos += len(piece)
                buf[pos:padded] = bytes(padded - pos)
                return padded if self._write_file(path, buf[:padded]) else None

    def _write_file(self, path: str, data: memoryview) -> bool:
        """A new file at path holding data, written with O_DIRECT; False (no file left) when refused."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_DIRECT
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as e:
            return self._refused(e)
        try:
            done = 0
            while done < len(data):
                done += os.write(fd, data[done:])
        except OSError as e:
            os.close(fd)
            os.unlink(path)
            return self._refused(e)
        os.close(fd)
        return True

    def _refused(self, error: OSError) -> bool:
        """False for the refusal of a file system without O_DIRECT (EINVAL); any other error raised."""
        if error.errno != errno.EINVAL:
            raise error
        self.refused = str(error)
        return False


def _is_entry_file(name: object) -> bool:
    """True for an entry file name of the cache's own layout (relative, inside it, no `..`)."""
    return isinstance(name, str) and _ENTRY_FILE.fullmatch(name.replace(os.sep, "/")) is not None


def _make_entry_dirs(root: str) -> None:
    """Make the 256 entry directories the cache has not got yet, so that no put pays for a mkdir (a new
    inode: on a fresh cache, some 4 % of a cold read's CPU when each directory was made by its first
    entry)."""
    for n in range(256):
        _make_private_dirs(root, f"{n:02x}")


def _make_private_dirs(root: str, relative: str) -> None:
    path = root
    for part in relative.split(os.sep):
        path = os.path.join(path, part)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass


class ChunkCache:
    """Stored chunks on disk, LRU-evicted to stay within max_bytes.

    The constructor opens (or creates) the directory and so does disk I/O: call it off the event loop.
    The async methods run their disk work in `executor` (one of its own if none is given).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int,
        *,
        executor: Executor | None = None,
        metrics: Metrics | None = None,
        direct_io: DirectIo = False,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        if direct_io not in (True, False, "auto"):
            raise ValueError(f"direct_io must be True, False or 'auto', not {direct_io!r}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._own_executor = executor is None
        if executor is None:
            executor = ThreadPoolExecutor(4, thread_name_prefix="chunk-cache")
        self._executor = executor
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="chunk-cache-writer")
        self._metrics = metrics
        if metrics is not None:
            metrics.cache_resets.labels("damaged")  # present at 0 from the first scrape
        try:
            self._cache = self._open_private()
        except _CacheDamaged as damage:
            self._reset(damage)
            self._cache = self._open_private()
        self._direct_io = direct_io
        if direct_io and hasattr(os, "O_DIRECT"):  # Linux; elsewhere entries are written buffered
            self._cache.disk.direct = _DirectWrites(self.directory)
        # Puts are serialised (SQLite allows one writer anyway) so the entry count tells what they evicted.
        self._write_lock = threading.Lock()
        self._pending_bytes = 0  # stored bytes handed to the writer and not yet written (event loop only)
        self._skipped = 0
        self._evictions = 0
        self._corrupt = 0
        self._volume = self._cache.volume()
        if self._volume > max_bytes:
            # A restart with a smaller limit: shrink now rather than on the first put.
            self._evictions += self._cache.cull(retry=True)
            self._volume = self._cache.volume()
        # Keys that may have an entry: every key with one, and some evicted since (diskcache does not
        # say which). A key not in it has no entry, so a cold read's lookups answer without a thread
        # hop and a database query. Changed (added to, discarded from, or replaced when relisted) only
        # under _write_lock; read from the event loop without it (a set's membership test is atomic).
        self._known: set[bytes] = set()
        self._relearn()
        self._publish()

    # -- reading -----------------------------------------------------------------------------------

    async def get(self, key: ChunkKey) -> bytes | memoryview | None:
        """The cached stored bytes of a chunk, or None (absent, unreadable or failed its check)."""
        if key.to_bytes() not in self._known:
            return None
        return await self._run(self._get_sync, key)

    def _get_sync(self, key: ChunkKey) -> bytes | memoryview | None:
        disk_key = key.to_bytes()
        try:
            # read=True opens the file inside diskcache's transaction (an LRU get is a write) and lets
            # us read it after the lock is released; an open file survives a concurrent eviction.
            handle = self._cache.get(disk_key, read=True, retry=True)
            if handle is None:
                return None
            if isinstance(handle, bytes):  # a value small enough to live in the database itself
                entry = handle
            else:
                with handle:
                    entry = handle.read()
        except _ForeignEntry:
            self._discard_corrupt(disk_key)  # planted or damaged: deleted, never read
            return None
        except _STORAGE_ERRORS as e:
            log.warning("chunk cache read failed, treating as a miss: %s", e)
            return None
        payload = self._open(disk_key, entry)
        if payload is _STALE:
            self._delete_sync(disk_key)  # an older layout: a miss, not damage
            return None
        if payload is None:
            self._discard_corrupt(disk_key)
        return payload

    async def discard_stale(self, key: ChunkKey) -> None:
        """Delete an intact entry that did not decode under its object's context: a miss, not damage."""
        log.info("chunk cache entry does not decode for its object version; deleted and refetched")
        await self._run(self._delete_sync, key.to_bytes())

    async def contains_many(self, keys: list[ChunkKey]) -> list[bool]:
        """Whether an entry exists for each key (not checked, not counted as a use for LRU), in one call;
        only keys that may have one are looked up."""
        known = self._known
        maybe = [k for k in keys if k.to_bytes() in known]
        if not maybe:
            return [False] * len(keys)
        found = set(await self._run(lambda: [k for k in maybe if self._contains_sync(k)]))
        return [k in found for k in keys]

    @property
    def may_hold_entries(self) -> bool:
        """False when the cache certainly holds no entry (no disk access)."""
        return bool(self._known)

    async def delete_many(self, keys: list[ChunkKey]) -> int:
        """Delete the entries of `keys` (those of an object deleted from the store); how many there were.
        Only keys that may have an entry are looked up, in one call off the event loop."""
        maybe = [disk_key for disk_key in (k.to_bytes() for k in keys) if disk_key in self._known]
        if not maybe:
            return 0
        return int(await self._run(lambda: sum(self._delete_sync(disk_key) for disk_key in maybe)))

    def _contains_sync(self, key: ChunkKey) -> bool:
        try:
            return key.to_bytes() in self._cache
        except _STORAGE_ERRORS:
            return False

    # -- writing -----------------------------------------------------------------------------------

    async def put(self, key: ChunkKey, data: bytes | memoryview, *, read_soon: bool = True) -> None:
        """Store a chunk's stored bytes (the reader decodes them first, so only verified bytes land here),
        evicting least recently used entries to stay within max_bytes.

        read_soon: a reader may read the entry back before the memory tier would answer it (a seeking
        reader's chunk); with direct_io "auto" only entries put without it are written with O_DIRECT.

        A failing disk is logged and ignored: the cache is an optimisation, never a reason to fail a read.
        So is a disk that is behind: with MAX_PENDING_PUT_BYTES already waiting, the chunk is not cached
        (counted in `skipped` and tsproxy_cache_skipped_total).
        """
        size = len(data)
        if self._pending_bytes and self._pending_bytes + size > MAX_PENDING_PUT_BYTES:
            self._skipped += 1
            if self._metrics is not None:
                self._metrics.cache_skipped.inc()
            return
        self._pending_bytes += size
        try:
            direct = self._direct_io is True or (self._direct_io == "auto" and not read_soon)
            await asyncio.get_running_loop().run_in_executor(self._writer, self._put_sync, key, data, direct)
        finally:
            self._pending_bytes -= size

    def _put_sync(self, key: ChunkKey, data: bytes | memoryview, direct: bool = False) -> None:
        disk_key = key.to_bytes()
        crc = crc32c(data, crc32c(disk_key))
        pieces = _Pieces(_HEADER.pack(_KIND_STORED, len(data), crc), data, direct=direct)
        try:
            with self._write_lock:
                before = len(self._cache) + (disk_key not in self._cache)
                # read=True: the value is a file-like, always stored as a file, never joined in memory.
                self._cache.set(disk_key, pieces, read=True, retry=True)
                self._known.add(disk_key)
                self._volume = self._cache.volume()
                if self._volume > self.max_bytes:
                    self._cache.cull(retry=True)
                    self._volume = self._cache.volume()
                entries = len(self._cache)
                evicted = before - entries
                if len(self._known) > 2 * entries + 64:
                    self._relearn()  # mostly evicted keys by now
        except _STORAGE_ERRORS as e:
            log.warning("chunk cache write failed, chunk not cached: %s", e)
            return
        if evicted:
            self._evictions += evicted
            if self._metrics is not None:
                self._metrics.cache_evictions.inc(evicted)
        self._publish()

    # -- state -------------------------------------------------------------------------------------

    def size_bytes(self) -> int:
        """Bytes the cache held on disk after its last change (diskcache's volume; no disk access)."""
        return self._volume

    @property
    def evictions(self) -> int:
        """Entries evicted to stay within max_bytes since this ChunkCache was opened."""
        return self._evictions

    @property
    def skipped(self) -> int:
        """Puts skipped because the writer was behind, since this ChunkCache was opened."""
        return self._skipped

    @property
    def corrupt(self) -> int:
        """Entries that failed their check and were deleted since this ChunkCache was opened."""
        return self._corrupt

    def __len__(self) -> int:
        """Number of entries (disk access: call off the event loop)."""
        return len(self._cache)

    def close(self) -> None:
        """Finish the puts under way and close the database (disk access: off the event loop). Idempotent."""
        self._writer.shutdown(wait=True)
        self._cache.close()
        if self._own_executor:
            self._executor.shutdown(wait=False)

    # -- internals ---------------------------------------------------------------------------------

    def _open_private(self) -> Any:
        """Open diskcache on a private directory; _CacheDamaged if its database is damaged."""
        directory = self.directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        _make_private(directory, 0o700)
        db = directory / _DB_NAME
        try:
            # SQLite gives the -wal and -shm files the mode of the database: create it 0600 first
            # (an empty file is a valid new database).
            os.close(os.open(db, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        except FileExistsError:
            if stat.S_IMODE(db.stat().st_mode) & 0o077:
                _tighten(directory)  # written by an older version, under the umask
        settings = {**_SETTINGS, "size_limit": self.max_bytes}
        _check_database(db, settings)
        try:
            cache = diskcache.Cache(str(directory), disk=_PrivateDisk, **settings)
        except sqlite3.DatabaseError as e:
            if _is_damage(e):
                raise _CacheDamaged(str(e)) from e
            raise
        _make_entry_dirs(str(directory))
        return cache

    def _reset(self, damage: _CacheDamaged) -> None:
        """Move a damaged cache aside (or empty it where it cannot be moved); log it once, count it."""
        directory = self.directory.absolute()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = directory.with_name(f"{directory.name}.damaged-{stamp}")
        try:
            os.rename(directory, aside)
        except OSError:
            # A mount point, a read-only parent or a name already taken: empty it where it is.
            _remove_children(directory, keep=())
            where = None
        else:
            # Keep the database to look at; the chunk files are useless without it and would take as
            # much disk again as the cache itself.
            _remove_children(aside, keep=_DB_FILES)
            where = str(aside)
        log.error(
            "chunk cache damaged; moved aside and started empty"
            if where
            else "chunk cache damaged; emptied and started afresh",
            extra={
                "fields": {
                    "cache_dir": str(directory),
                    "moved_to": where,
                    "reason": "damaged",
                    "error": str(damage),
                }
            },
        )
        if self._metrics is not None:
            self._metrics.cache_resets.labels("damaged").inc()

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _open(self, disk_key: bytes, entry: bytes) -> bytes | memoryview | None:
        """The payload of an entry if it passes its check; _STALE for an older layout's entry; else None."""
        view = memoryview(entry)
        if not view:
            return None
        kind = view[0]
        if kind == _KIND_STORED:
            if len(view) < _HEADER.size:
                return None
            _, length, crc = _HEADER.unpack_from(view)
            payload = view[_HEADER.size : _HEADER.size + length]
            padding = view[_HEADER.size + length :]
            if (
                len(payload) != length
                or len(padding) >= DIRECT_BLOCK
                or (padding and padding != bytes(len(padding)))
                or crc32c(payload, crc32c(disk_key)) != crc
            ):
                return None
            return payload
        if kind in _OLDER_KINDS:
            return _STALE
        return None

    def _discard_corrupt(self, disk_key: bytes) -> None:
        self._corrupt += 1
        if self._metrics is not None:
            self._metrics.cache_corrupt.inc()
        log.warning("chunk cache entry failed its check; deleted and refetched")
        self._delete_sync(disk_key)

    def _delete_sync(self, disk_key: bytes) -> bool:
        try:
            with self._write_lock:
                self._known.discard(disk_key)
                deleted = bool(self._cache.delete(disk_key, retry=True))
                self._volume = self._cache.volume()
        except _STORAGE_ERRORS as e:
            log.warning("chunk cache delete failed: %s", e)
            return False
        self._publish()
        return deleted

    def _relearn(self) -> None:
        """Known keys from the database: exactly those with an entry (at open, and when evictions have
        left many stale ones). The caller holds _write_lock, or no other thread uses the cache yet."""
        try:
            self._known = {k for k in self._cache.iterkeys() if type(k) is bytes and len(k) == _KEY.size}
        except _STORAGE_ERRORS as e:
            log.warning("chunk cache keys could not be listed; lookups ask the database: %s", e)
            self._known = _Everything()

    def _publish(self) -> None:
        if self._metrics is not None:
            self._metrics.cache_size.set(self._volume)


def _is_damage(e: sqlite3.DatabaseError) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    # A "database is locked" (another process at work) is not damage; anything else from the file is.
    return not isinstance(e, sqlite3.OperationalError)


def _check_database(db: Path, settings: dict[str, Any]) -> None:
    """SQLite's quick check on the cache database, then its contents (_check_contents); _CacheDamaged
    unless both pass."""
    try:
        with closing(sqlite3.connect(db, timeout=60, isolation_level=None)) as con:
            rows = con.execute("PRAGMA quick_check").fetchall()
    except sqlite3.DatabaseError as e:
        if _is_damage(e):
            raise _CacheDamaged(str(e)) from e
        raise
    if rows != [("ok",)]:
        raise _CacheDamaged("quick_check: " + "; ".join(str(r[0]) for r in rows[:3]))
    _check_contents(db, settings)


def _check_contents(db: Path, settings: dict[str, Any]) -> None:
    """_CacheDamaged unless the database holds only what diskcache makes: its own tables, indexes and
    triggers (as it writes them), known settings of the right types, and counts that match the rows.
    Then `settings` are written over the stored ones: diskcache applies the stored `sqlite_*` ones as
    pragmas on every connection it opens, before it writes the ones it is given."""
    with closing(sqlite3.connect(db, timeout=60, isolation_level=None)) as con:
        try:
            schema = set(con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall())
            if not schema:
                return  # a new, empty database
            unexpected = schema - _expected_schema()
            if unexpected:
                raise _CacheDamaged("unexpected schema: " + ", ".join(sorted(str(u[1]) for u in unexpected)))
            stored = dict(con.execute("SELECT key, value FROM Settings").fetchall())
            known = {**diskcache.core.DEFAULT_SETTINGS, **diskcache.core.METADATA}
            for name, value in stored.items():
                if name not in known or type(value) is not type(known[name]):
                    raise _CacheDamaged(f"unexpected setting {name!r}")
            ((count, size),) = con.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM Cache").fetchall()
            if (stored.get("count", count), stored.get("size", size)) != (count, size):
                raise _CacheDamaged("entry count or size does not match the entries")
            con.executemany(
                "UPDATE Settings SET value = ? WHERE key = ?",
                [(v, k) for k, v in settings.items() if k in stored],
            )
        except sqlite3.OperationalError as e:
            if "no such" not in str(e):  # "database is locked" and the like are not damage
                raise
            raise _CacheDamaged(str(e)) from e  # a table or column missing: not what diskcache leaves


@cache
def _expected_schema() -> frozenset[tuple[str, str, str, str]]:
    """The schema diskcache creates (tables, indexes, triggers and their SQL), from a scratch cache."""
    with tempfile.TemporaryDirectory(prefix="tsproxy-cache-schema-") as scratch:
        diskcache.Cache(scratch, **_SETTINGS).close()
        with closing(sqlite3.connect(os.path.join(scratch, _DB_NAME))) as con:
            rows = con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    return frozenset(rows)


def _make_private(path: Path, mode: int) -> None:
    """chmod, where this process may; a directory it does not own (a volume's mount point) stays as it is."""
    try:
        if stat.S_IMODE(path.stat().st_mode) != mode:
            os.chmod(path, mode)
    except PermissionError:
        log.info(
            "chunk cache directory mode left as it is (not its owner); its entries are private",
            extra={"fields": {"cache_dir": str(path)}},
        )


def _tighten(directory: Path) -> None:
    """Make every file under directory 0600 and every directory 0700 (entries of an older version)."""
    for root, dirs, files in os.walk(directory):
        for names, mode in ((dirs, 0o700), (files, 0o600)):
            for name in names:
                path = os.path.join(root, name)
                if not os.path.islink(path):  # chmod follows links: never change a file elsewhere
                    with suppress(FileNotFoundError):
                        os.chmod(path, mode)


def _remove_children(directory: Path, keep: tuple[str, ...]) -> None:
    for child in directory.iterdir():
        if child.name in keep:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
