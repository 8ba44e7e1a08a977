"""The read engine: original byte ranges of stored objects, from the chunk cache or the backend.

For each chunk a read needs, in order:

1. the few most recently used chunks held in memory (HotChunks) answer repeats at once; for a reader
   seeking about the object, the stored bytes of the chunks seeks touched, held in the same memory
   bound, are decoded (only the part needed) without reading the disk;
2. a disk-cache read started ahead for a forward reader (see below) is awaited;
3. a download already under way (single-flight) is joined;
4. else the disk cache is asked; a hit costs no backend request, and its stored bytes are decoded;
5. else the chunk is fetched, together with the next missing chunks of the read (up to
   FOREGROUND_BYTES from where the read needs them), in one coalesced ranged GET.

While it consumes, the reader keeps a window of chunks scheduled ahead (see prefetch.PrefetchPolicy):
within its own range, and past it to the object's end once the object is being read forward. Those
windows go out as background requests, bounded in number and in bytes, whose chunks land in the cache.
A forward reader also has the next PROMOTE_AHEAD chunks read from the disk cache and decoded into
memory in the background, so a warm sequential read does not stop at each chunk boundary for them.
Chunks are decoded (authenticated, decrypted, inflated) in the executor (decoding.ThreadDecoders: the
frames a seek needs of a chunk inflate on several of its threads at once); the chunk a reader waits for
goes ahead of the chunks fetched beside it (urgent work on the PriorityPool, and the window's decodes
wait briefly for the reader's own chunk, OWN_FIRST_WAIT). The disk cache holds the
stored bytes as fetched (cache.chunks), put there once they have decoded; memory holds plaintext. A
chunk that fails is an error for every reader waiting on it and is never cached; a disk-cache entry
that fails to decode is dropped as stale and the chunk fetched again.
Downloads outlive the read that started them, so a client hanging up never fails another reader
sharing them.

Size: past 700 lines since deletes forget chunks (`forget`) and forward readers decode their part of a
chunk first. The order above is one state machine over shared per-chunk state (downloads in flight, the
window, the hot set); split across modules, each half would reach into the other's. Planning (prefetch),
decoding (decoding) and the disk cache (chunks) are already modules of their own.

Memory: `memory_bytes` of hot chunks; a read holds the chunk it is yielding plus, without a disk cache,
its own read-ahead window; downloads hold at most max_parallel_fetches requests of at most
max_request_bytes each.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import struct
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from tsproxy import defaults, errors
from tsproxy.format import ChunkRef, Manifest, ObjectContext
from tsproxy.metrics import Metrics

from .chunks import DIRECT_BLOCK, ChunkCache, ChunkKey
from .decoding import Span, ThreadDecoders, Version
from .hot import HotChunks, Sealed
from .plan import FetchRequest, plan_fetches
from .prefetch import PrefetchPolicy, Stream
from .singleflight import Abandoned, SingleFlight, wait
from .spool import StoredSpool

FetchStored = Callable[[int, int], AsyncIterator[bytes | memoryview]]
"""(stored_start, stored_end_exclusive) -> those stored bytes of one backend object version, as a stream
of pieces in order (closed with aclose when the reader is done with it, read to the end or not)."""

# How much of a read a cold first fetch brings in, counted from the first byte the read needs: enough
# to bring a 1 MiB fetch or a 4 MiB chunk read that crosses a chunk boundary in one GET (rather than a
# second one issued a round trip later), little enough for a quick first byte on a long read.
FOREGROUND_BYTES = 4 << 20
# How long the decode of a chunk fetched ahead of a reader waits for the chunk the reader itself fetched
# and waits for (a miss: a cold reader's first chunk, beside the window fetched with it). Both GETs go
# out at once, so the window's bytes often come in first, and the PriorityPool cannot put the reader's
# chunk ahead of decodes already running: on two cores, two of the window's held a first read back
# (README, "Figures behind the code's constants"). Bounded, so a reader's chunk whose bytes are slow never
# stalls the window for long.
OWN_FIRST_WAIT = 0.05  # seconds
# Chunks a forward reader has moved from the disk cache into memory ahead of its position.
PROMOTE_AHEAD = 1
# Bytes a kept view may hold beyond what it shows (a disk-cache entry's header and padding) before it is
# copied instead (see ChunkReader._keep_sealed).
KEEP_SLACK_BYTES = 2 * DIRECT_BLOCK
# Manifests whose version_id is remembered (hashing a large multipart object's segments at every read
# was a measurable share of a cold random read's event-loop time).
VERSIONS_KEPT = 64


@dataclass(frozen=True)
class Part:
    """A chunk downloaded for a reader that needs only part of it (a seek, not a forward scan): its
    stored bytes, verified, and the part decoded. A chunk stored as several zstd frames (format 2) then
    costs only the frames that hold the part, which is most of a cold random read's CPU. Another reader
    joining the download decodes what it needs from `stored`; only whole chunks are kept in memory."""

    stored: bytes | memoryview
    span: Span
    data: bytes | memoryview


Loaded = bytes | memoryview | Part
"""What a chunk's download settles with: its whole plaintext, or a Part."""


@dataclass
class _Read:
    """One read() call: what it reads and its own bookkeeping."""

    manifest: Manifest
    ctx: ObjectContext
    fetch: FetchStored
    first: int  # the original bytes first..last (inclusive) it reads
    last: int
    last_chunk: int
    # Moving forward through the object: it gets, and shares, whole chunks, and may schedule past its end.
    forward: bool
    limit: int  # original offset (exclusive) up to which this read may schedule chunks
    stream: Stream
    version: bytes  # version_id(manifest)
    # The download of the chunk this read waits for, when the read started it itself (a miss): the
    # decodes of chunks fetched ahead wait for its decode first (see OWN_FIRST_WAIT).
    own: asyncio.Future[Loaded] | None = None
    # Chunks this read has scheduled or joined ahead, kept here when there is no disk cache to land in.
    pending: dict[int, asyncio.Future[Loaded]] = field(default_factory=dict)

    @property
    def object_id(self) -> bytes:
        return self.manifest.object_id

    def key(self, ref: ChunkRef) -> ChunkKey:
        return ChunkKey(self.version, ref.segment_no, ref.chunk_no)

    def part(self, ref: ChunkRef) -> Span | None:
        """What a read that is not moving forward needs of chunk ref when that is only part of it (see
        Part: only that part is inflated); None when it gets the whole chunk."""
        return None if self.forward else self.needed(ref)

    def needed(self, ref: ChunkRef) -> Span | None:
        """What this read needs of chunk ref when that is only part of it; None when it needs all."""
        start = max(self.first, ref.original_offset) - ref.original_offset
        stop = min(self.last + 1, ref.original_offset + ref.original_len) - ref.original_offset
        if start == 0 and stop == ref.original_len:
            return None
        return start, stop

    @property
    def decoding(self) -> Version:
        return Version(self.manifest, self.ctx, self.version)


def version_id(manifest: Manifest) -> bytes:
    """16 bytes naming one stored version's chunks, the key of everything cached from it.

    The object id alone does not do: every completion of one multipart upload seals its chunks under
    the upload's object id, and a part re-sent between two completions gives the same segment number
    other bytes. So the id also covers what each segment holds: its salt (random per upload of a part,
    with encryption), the MD5 of its original bytes and its stored chunk sizes and CRC32Cs, and the
    chunk size. A rewrap or a copy keeps all of these, and so keeps the cached chunks too.
    """
    h = hashlib.blake2b(manifest.object_id, digest_size=16, person=b"tsproxy-chunks")
    h.update(manifest.chunk_size.to_bytes(8, "big"))
    for seg in manifest.segments:
        h.update(struct.pack(">IIQ", seg.segment_no, len(seg.stored_sizes), seg.original_size))
        h.update(seg.salt.ljust(8, b"\0"))
        h.update(seg.md5)
        h.update(struct.pack(f">{len(seg.stored_sizes)}Q", *seg.stored_sizes))
        h.update(struct.pack(f">{len(seg.crc32c)}I", *seg.crc32c))
    return h.digest()


class ChunkReader:
    """Serves original byte ranges of stored objects; one per process, shared by all requests."""

    def __init__(
        self,
        cache: ChunkCache | None,
        executor: Executor,
        *,
        prefetch_bytes: int = defaults.PREFETCH,
        max_request_bytes: int = 32 << 20,
        max_gap_bytes: int = 1 << 20,
        max_parallel_fetches: int = 8,
        max_prefetch_in_flight_bytes: int | None = None,
        max_tracked_objects: int = 1024,
        memory_bytes: int = defaults.MEMORY_CACHE_SIZE,
        metrics: Metrics | None = None,
    ) -> None:
        if max_parallel_fetches < 1 or max_request_bytes < 1 or max_gap_bytes < 0 or prefetch_bytes < 0:
            raise ValueError("reader bounds must be positive")
        self._cache = cache
        self._hot = HotChunks(memory_bytes)
        self._max_request = max_request_bytes
        self._max_gap = max_gap_bytes
        self._metrics = metrics
        self._flights: SingleFlight[ChunkKey, Loaded] = SingleFlight(
            on_join=metrics.singleflight_joins.inc if metrics is not None else None
        )
        self._policy = PrefetchPolicy(
            prefetch_bytes, max_objects=max_tracked_objects, on_count=self._count_prefetch
        )
        self._slots = asyncio.Semaphore(max_parallel_fetches)
        # Background requests get at most half the slots, so a reader's own fetch never waits behind them.
        self._background_slots = asyncio.Semaphore(max(1, max_parallel_fetches // 2))
        self._background_budget = (
            max_prefetch_in_flight_bytes if max_prefetch_in_flight_bytes is not None else 4 * prefetch_bytes
        )
        self._background_bytes = 0
        self._tasks: set[asyncio.Task[None]] = set()
        # Disk-cache reads started ahead of a forward reader: their result, or None when the cache
        # no longer had the chunk. Not single-flight downloads: they fetch nothing from the backend.
        self._promoting: dict[ChunkKey, asyncio.Future[bytes | memoryview | None]] = {}
        self._decoders = ThreadDecoders(executor, metrics)
        # id(manifest) -> (the manifest, its version_id): the manifest is held so its id stays its own.
        self._versions: OrderedDict[int, tuple[Manifest, bytes]] = OrderedDict()
        self._closed = False

    @property
    def policy(self) -> PrefetchPolicy:
        """The prefetch bookkeeping (issued / used / wasted counts)."""
        return self._policy

    @property
    def joins(self) -> int:
        """Chunk reads that joined a download already under way."""
        return self._flights.joins

    async def read(
        self, manifest: Manifest, ctx: ObjectContext, fetch: FetchStored, first: int, last: int
    ) -> AsyncIterator[bytes | memoryview]:
        """The original bytes first..last (inclusive) of the object, in order, as chunks become ready.

        IntegrityError (never wrong bytes) when stored data fails verification; the fetch function's
        errors as they are.
        """
        if self._closed:
            raise errors.ServiceUnavailable("shutting down")
        if not 0 <= first <= last < manifest.size:
            raise errors.InvalidRange(
                f"bytes {first}-{last} are not within an object of {manifest.size} bytes"
            )
        index = manifest.index
        i0, i1 = index.chunk_at(first), index.chunk_at(last)
        stream = self._policy.begin(manifest.object_id, first)
        # Past its own end a read schedules only into the cache, and only for a forward-moving reader; a
        # read from the object's first byte is taken for the start of one (a segment read from its start,
        # a chunk-by-chunk scan), so its next window is on the way before the second read arrives.
        forward = stream.sequential or first == 0
        limit = manifest.size if (forward and self._cache is not None) else last + 1
        rd = _Read(manifest, ctx, fetch, first, last, i1, forward, limit, stream, self._version(manifest))
        try:
            for i in range(i0, i1 + 1):
                ref = index.chunk(i)
                position = max(first, ref.original_offset)
                start = position - ref.original_offset
                stop = min(last + 1, ref.original_offset + ref.original_len) - ref.original_offset
                data = await self._chunk(rd, i, ref, position, rd.part(ref))
                if len(data) == ref.original_len:
                    # A view, not a copy: the chunk stays alive (and unchanged) as long as the view does.
                    data = data if start == 0 and stop == len(data) else memoryview(data)[start:stop]
                yield data
                self._policy.consumed(manifest.object_id, stream, i, ref.original_offset + stop)
            self._policy.finished(stream)
        finally:
            rd.pending.clear()

    def _version(self, manifest: Manifest) -> bytes:
        """version_id(manifest), remembered for the last VERSIONS_KEPT manifests read."""
        known = self._versions.get(id(manifest))
        if known is not None and known[0] is manifest:
            self._versions.move_to_end(id(manifest))
            return known[1]
        version = version_id(manifest)
        self._versions[id(manifest)] = (manifest, version)
        if len(self._versions) > VERSIONS_KEPT:
            self._versions.popitem(last=False)
        return version

    @property
    def caches_on_disk(self) -> bool:
        """Whether chunks may be held on disk (a disk cache that is not certainly empty)."""
        return self._cache is not None and self._cache.may_hold_entries

    async def holds(self, manifest: Manifest, first: int, last: int) -> bool:
        """Whether this instance holds every chunk of the original bytes first..last of one stored version
        (in memory, on disk, or on its way): a read of them now would ask the backend for nothing."""
        if self._closed or not 0 <= first <= last < manifest.size:
            return False
        version = self._version(manifest)
        index = manifest.index
        keys = [
            ChunkKey(version, ref.segment_no, ref.chunk_no)
            for ref in (index.chunk(i) for i in range(index.chunk_at(first), index.chunk_at(last) + 1))
        ]
        rest = [
            k
            for k in keys
            if k not in self._hot
            and Sealed(k) not in self._hot
            and k not in self._flights
            and k not in self._promoting
        ]
        if not rest:
            return True
        return self._cache is not None and all(await self._cache.contains_many(rest))

    async def forget(self, manifest: Manifest) -> int:
        """Drop every cached chunk of one stored version, from memory and disk: its object was deleted.
        Returns the disk entries deleted. A download of one of its chunks still under way may land later,
        to age out like any entry no reader asks for."""
        version = version_id(manifest)
        keys = [
            ChunkKey(version, seg.segment_no, chunk_no)
            for seg in manifest.segments
            for chunk_no in range(len(seg.stored_sizes))
        ]
        for key in keys:
            self._hot.discard(key)
            self._hot.discard(Sealed(key))
        return await self._cache.delete_many(keys) if self._cache is not None else 0

    async def close(self) -> None:
        """Cancel downloads under way; reads still running fail with ServiceUnavailable."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._policy.clear()
        self._hot.clear()
        self._versions.clear()

    # -- one chunk ---------------------------------------------------------------------------------

    async def _chunk(
        self, rd: _Read, i: int, ref: ChunkRef, position: int, part: Span | None
    ) -> bytes | memoryview:
        """Chunk i's plaintext, after making sure the chunks ahead of it are on their way: the whole
        chunk, or (only when `part` is given and the chunk is not in memory) just that part of it."""
        key = rd.key(ref)
        fut = rd.pending.pop(i, None)
        data = self._hot.get(key)
        if data is None and fut is None and key in self._promoting:
            data = await wait(self._promoting[key])  # None: evicted from the disk cache meanwhile
        if data is None and fut is None:
            fut = self._flights.join(key)
            if fut is None:
                data = await self._from_cached(rd, ref, part)
        if fut is None and data is None:
            if part is None and rd.forward:
                # A forward reader waiting for a download gets what it needs of the chunk inflated first;
                # the whole chunk follows in the background for the reads after it.
                part = rd.needed(ref)
            fut = await self._fetch_foreground(rd, i, ref, position, part)
            rd.own = fut
        self._policy.scheduled(rd.stream, ref.original_offset + ref.original_len)
        await self._read_ahead(rd, position)
        self._promote_ahead(rd, i)
        if data is None:
            assert fut is not None
            data = await self._wait(rd, i, ref, fut, part)
            self._count_cache("miss", ref.original_len)
        else:
            self._count_cache("hit", ref.original_len)
        return data

    async def _wait(
        self, rd: _Read, i: int, ref: ChunkRef, fut: asyncio.Future[Loaded], part: Span | None
    ) -> bytes | memoryview:
        """The result of a chunk's download; a download cancelled under us is started again."""
        key = rd.key(ref)
        while True:
            try:
                return await self._plain(rd, ref, await wait(fut), part)
            except Abandoned:
                if self._closed:
                    raise errors.ServiceUnavailable("shutting down") from None
            cached = self._hot.get(key)
            if cached is None:
                cached = await self._from_cached(rd, ref, part)
            if cached is not None:
                return cached
            # No await between looking and claiming, so the chunk cannot be claimed by another in between.
            fut = self._flights.join(key) or self._launch(rd, i, [ref], [True], background=False)[0]

    async def _plain(self, rd: _Read, ref: ChunkRef, loaded: Loaded, part: Span | None) -> bytes | memoryview:
        """What a reader gets of a downloaded chunk: the whole plaintext, or the part it asked for. A
        chunk downloaded for another reader's part is decoded again from its (verified) stored bytes."""
        if not isinstance(loaded, Part):
            return loaded
        if part is not None and loaded.span == part:
            return loaded.data
        plain = await self._decoded(rd, ref, loaded.stored, part)
        if part is None:
            self._hot.put(rd.key(ref), plain)
        return plain

    async def _fetch_foreground(
        self, rd: _Read, i: int, ref: ChunkRef, position: int, part: Span | None = None
    ) -> asyncio.Future[Loaded]:
        """Fetch chunk i now, with the missing chunks of this read up to FOREGROUND_BYTES past position."""
        index = rd.manifest.index
        reach = min(rd.manifest.size - 1, position + FOREGROUND_BYTES - 1)
        end = min(rd.last_chunk, index.chunk_at(reach))
        refs = [ref] + [index.chunk(j) for j in range(i + 1, end + 1)]
        missing = await self._missing(rd, refs[1:])
        if rd.key(ref) in self._flights:  # someone started it while we looked
            joined = self._flights.join(rd.key(ref))
            assert joined is not None
            return joined
        # All of them this read's own (up to its last chunk): a seek has only what it needs inflated.
        parts = {pos: span for pos, r in enumerate(refs) if (span := rd.part(r)) is not None}
        if part is not None:
            parts[0] = part
        futures = self._launch(rd, i, refs, [True, *missing], background=False, parts=parts)
        for pos in range(1, len(refs)):
            if pos in futures:
                rd.pending[i + pos] = futures[pos]
        self._policy.scheduled(rd.stream, refs[-1].original_offset + refs[-1].original_len)
        return futures[0]

    async def _read_ahead(self, rd: _Read, position: int) -> None:
        """Schedule the next window ahead of position when the policy says so and the budget allows."""
        rng = self._policy.want(rd.stream, position, rd.limit)
        if rng is None:
            return
        index = rd.manifest.index
        j0, j1 = index.chunk_at(rng[0]), index.chunk_at(rng[1] - 1)
        refs = [index.chunk(j) for j in range(j0, j1 + 1)]
        upper = refs[-1].stored_offset + refs[-1].stored_len - refs[0].stored_offset
        if self._background_bytes and self._background_bytes + upper > self._background_budget:
            return  # over budget: asked again at the next chunk
        self._policy.scheduled(rd.stream, refs[-1].original_offset + refs[-1].original_len)
        if self._cache is not None:
            # The chunks land in the cache, so this read need not wait while the cache is asked which
            # of them it already has (an executor round trip, at every chunk of a warm forward read).
            self._spawn(self._launch_ahead(rd, j0, refs))
            return
        missing = await self._missing(rd, refs)
        futures = self._launch(rd, j0, refs, missing, background=True)
        if self._cache is None:
            # Nowhere for the chunks to land: this read holds them (its window bounds the memory).
            for pos, ref in enumerate(refs):
                j = j0 + pos
                if j > rd.last_chunk:
                    break
                fut = futures.get(pos) or rd.pending.get(j) or self._flights.join(rd.key(ref))
                if fut is not None:
                    rd.pending[j] = fut

    async def _launch_ahead(self, rd: _Read, j0: int, refs: list[ChunkRef]) -> None:
        missing = await self._missing(rd, refs)
        if not self._closed:
            self._launch(rd, j0, refs, missing, background=True)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _promote_ahead(self, rd: _Read, i: int) -> None:
        """For a forward reader, start reading the next chunks from the disk cache into memory."""
        if self._cache is None or not rd.stream.sequential or self._closed:
            return
        index = rd.manifest.index
        for j in range(i + 1, i + 1 + PROMOTE_AHEAD):
            if j >= len(index):
                return
            ref = index.chunk(j)
            if ref.original_offset >= rd.limit:
                return
            key = rd.key(ref)
            if key in self._hot or key in self._promoting or key in self._flights:
                continue  # in memory already, or on its way
            fut: asyncio.Future[bytes | memoryview | None] = asyncio.get_running_loop().create_future()
            self._promoting[key] = fut
            self._spawn(self._promote(rd, ref, fut))

    async def _promote(
        self, rd: _Read, ref: ChunkRef, fut: asyncio.Future[bytes | memoryview | None]
    ) -> None:
        key = rd.key(ref)
        data: bytes | memoryview | None = None
        try:
            # A miss when the chunk is not (or no longer) cached; nobody waits for it yet.
            data = await self._from_disk(rd, ref, urgent=False)
        finally:
            # Settled even when cancelled, so a reader waiting on it goes on to the other sources.
            if not fut.done():
                fut.set_result(data)
            if self._promoting.get(key) is fut:
                del self._promoting[key]

    async def _from_cached(self, rd: _Read, ref: ChunkRef, part: Span | None) -> bytes | memoryview | None:
        """Chunk ref's plaintext (or `part` of it) from its stored bytes held in memory, else from the
        disk cache; None when neither has it."""
        data = await self._from_sealed(rd, ref, part)
        if data is None and self._cache is not None:
            data = await self._from_disk(rd, ref, part)
        return data

    async def _from_sealed(self, rd: _Read, ref: ChunkRef, part: Span | None) -> bytes | memoryview | None:
        """Chunk ref's plaintext (or `part` of it) decoded from its stored bytes held in memory, or None."""
        key = rd.key(ref)
        stored = self._hot.get(Sealed(key))
        if stored is None:
            return None
        plain = await self._decoded(rd, ref, stored, part)
        if part is None:
            self._hot.put(key, plain)
        return plain

    def _keep_sealed(self, key: ChunkKey, stored: bytes | memoryview) -> None:
        """Hold a chunk's verified stored bytes for the next seek into it. A view into a much larger
        buffer (a piece of a coalesced answer) is copied, so memory holds little more than is counted;
        a disk-cache entry's payload (a view past its header, before its padding) is kept as it is."""
        if isinstance(stored, memoryview):
            under = stored.obj
            slack = len(under) - stored.nbytes if isinstance(under, bytes) else None
            if slack is None or slack > KEEP_SLACK_BYTES:
                stored = bytes(stored)
        self._hot.put(Sealed(key), stored)

    async def _from_disk(
        self, rd: _Read, ref: ChunkRef, part: Span | None = None, *, urgent: bool = True
    ) -> bytes | memoryview | None:
        """Chunk ref's plaintext decoded from the disk cache (and now in memory too), or None on a miss;
        with `part`, only that part of it (not kept in memory). urgent: a reader waits for it."""
        assert self._cache is not None
        key = rd.key(ref)
        stored = await self._cache.get(key)
        if stored is None:
            return None
        try:
            plain = await self._decoded(rd, ref, stored, part, urgent=urgent)
        except errors.IntegrityError:
            # The entry passed the cache's own check, so it is what was put under this key: bytes that
            # are not this version's chunk are stale, never served and never counted as disk damage.
            await self._cache.discard_stale(key)
            return None
        if part is None:
            self._hot.put(key, plain)
        else:
            self._keep_sealed(key, stored)
        return plain

    def _inflate_ahead(self, rd: _Read, ref: ChunkRef, stored: bytes | memoryview) -> None:
        """Decode a whole chunk into memory for a forward reader that so far got only part of it; its
        next read waits for this (a promotion, see _chunk) rather than decoding the chunk again."""
        key = rd.key(ref)
        if self._closed or key in self._promoting:
            return
        fut: asyncio.Future[bytes | memoryview | None] = asyncio.get_running_loop().create_future()
        self._promoting[key] = fut
        self._spawn(self._inflate(rd, ref, stored, fut))

    async def _inflate(
        self,
        rd: _Read,
        ref: ChunkRef,
        stored: bytes | memoryview,
        fut: asyncio.Future[bytes | memoryview | None],
    ) -> None:
        key = rd.key(ref)
        plain: bytes | memoryview | None = None
        try:
            plain = await self._decoded(rd, ref, stored, None, urgent=False)
            self._hot.put(key, plain)
        except errors.IntegrityError:
            pass  # its reader got the same error; a next one fetches the chunk again
        finally:
            if not fut.done():
                fut.set_result(plain)
            if self._promoting.get(key) is fut:
                del self._promoting[key]

    async def _decoded(
        self, rd: _Read, ref: ChunkRef, stored: bytes | memoryview, part: Span | None, *, urgent: bool = True
    ) -> bytes | memoryview:
        """Chunk ref's plaintext (or `part` of it) decoded from its stored bytes in the executor; urgent
        (ahead of other work) unless nobody waits for it yet (a chunk prefetched or promoted ahead)."""
        return await self._decoders.decode(rd.decoding, ref, stored, part, urgent=urgent)

    async def _missing(self, rd: _Read, refs: list[ChunkRef]) -> list[bool]:
        """Which of refs are neither downloading nor cached (checked again after the cache answers)."""
        keys = [rd.key(r) for r in refs]
        cached = [False] * len(keys)
        if self._cache is not None and keys:
            cached = await self._cache.contains_many(keys)
        return [
            not c and k not in self._flights and k not in self._hot for k, c in zip(keys, cached, strict=True)
        ]

    # -- downloads ---------------------------------------------------------------------------------

    def _launch(
        self,
        rd: _Read,
        first_index: int,
        refs: list[ChunkRef],
        missing: list[bool],
        *,
        background: bool,
        parts: dict[int, Span] | None = None,
    ) -> dict[int, asyncio.Future[Loaded]]:
        """Claim the missing chunks and start coalesced requests for them; futures by position in refs.

        refs are consecutive chunks of the object, the first being chunk first_index; `parts` gives, by
        position, all a reader needs of some of them (see Part).
        """
        if self._closed:
            raise errors.ServiceUnavailable("shutting down")
        # Claiming is synchronous, so no other task can claim a chunk between the check and here.
        missing = [m and rd.key(r) not in self._flights for m, r in zip(missing, refs, strict=True)]
        plan = plan_fetches(refs, missing, max_gap_bytes=self._max_gap, max_request_bytes=self._max_request)
        futures: dict[int, asyncio.Future[Loaded]] = {}
        for req in plan:
            claimed: dict[int, asyncio.Future[Loaded]] = {}
            for pos in req.positions:
                fut = self._flights.claim(rd.key(refs[pos]))
                assert fut is not None
                claimed[pos] = fut
            futures.update(claimed)
            if background:
                self._background_bytes += req.size  # released by _download
                self._policy.issued_ahead(rd.object_id, (first_index + p for p in req.positions))
            task = asyncio.get_running_loop().create_task(
                self._download(rd, req, refs, claimed, background, parts or {})
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return futures

    async def _download(
        self,
        rd: _Read,
        req: FetchRequest,
        refs: list[ChunkRef],
        claimed: dict[int, asyncio.Future[Loaded]],
        background: bool,
        parts: dict[int, Span],
    ) -> None:
        """One ranged GET, streamed: each chunk goes to be decoded as soon as its stored bytes are in,
        while the rest of the answer is still arriving, and is settled and cached once it has decoded."""
        decoding: list[asyncio.Task[None]] = []
        try:
            async with self._background_slots if background else contextlib.nullcontext(), self._slots:
                await self._receive(rd, req, refs, claimed, decoding, parts, urgent=not background)
        except Exception as e:
            # Chunks whose bytes never came in fail; those already decoding settle themselves.
            for fut in claimed.values():
                if not fut.done():
                    fut.set_exception(e)
        finally:
            if background:
                self._background_bytes -= req.size
            if decoding:
                await asyncio.gather(*decoding, return_exceptions=True)
            for pos, fut in claimed.items():
                self._flights.forget(rd.key(refs[pos]), fut)

    async def _receive(
        self,
        rd: _Read,
        req: FetchRequest,
        refs: list[ChunkRef],
        claimed: dict[int, asyncio.Future[Loaded]],
        decoding: list[asyncio.Task[None]],
        parts: dict[int, Span],
        *,
        urgent: bool,
    ) -> None:
        """Read a request's answer piece by piece, starting a decode for each claimed chunk it completes
        (urgent: a reader waits for them)."""
        wanted = sorted(claimed)  # positions in refs, which is stored order
        spool = StoredSpool(req.stored_start)
        loop = asyncio.get_running_loop()
        pieces = rd.fetch(req.stored_start, req.stored_end)
        try:
            async for piece in pieces:
                spool.add(piece)
                if spool.end > req.stored_end:
                    raise errors.IntegrityError(
                        f"backend sent more than the {req.size} bytes asked for from {req.stored_start}"
                    )
                while wanted and spool.end >= refs[wanted[0]].stored_offset + refs[wanted[0]].stored_len:
                    pos = wanted.pop(0)
                    ref = refs[pos]
                    data = spool.take(ref.stored_offset, ref.stored_offset + ref.stored_len)
                    keep = self._decode_and_keep(rd, ref, data, claimed[pos], parts.get(pos), urgent=urgent)
                    decoding.append(loop.create_task(keep))
        finally:
            close = getattr(pieces, "aclose", None)
            if close is not None:
                await close()
        if spool.end != req.stored_end:
            got = spool.end - req.stored_start
            raise errors.IntegrityError(f"backend sent {got} bytes of {req.size} from {req.stored_start}")

    async def _decode_and_keep(
        self,
        rd: _Read,
        ref: ChunkRef,
        stored: bytes | memoryview,
        fut: asyncio.Future[Loaded],
        part: Span | None = None,
        *,
        urgent: bool = True,
    ) -> None:
        own = rd.own
        if not urgent and own is not None and not own.done():
            # A chunk fetched ahead: the chunk its reader waits for decodes first (see OWN_FIRST_WAIT).
            await asyncio.wait([own], timeout=OWN_FIRST_WAIT)
        try:
            plain = await self._decoded(rd, ref, stored, part, urgent=urgent)
        except Exception as e:  # IntegrityError above all: every waiter fails, nothing is cached
            fut.set_exception(e)
            return
        if part is None:
            fut.set_result(plain)
            self._hot.put(rd.key(ref), plain)
        else:
            fut.set_result(Part(stored, part, plain))
            self._keep_sealed(rd.key(ref), stored)
            if rd.forward:
                self._inflate_ahead(rd, ref, stored)
        if self._cache is not None:
            # The stored bytes as fetched, now verified: a quarter of the plaintext for Kafka data, and
            # already sealed when the object is encrypted. A forward reader holds the chunk in memory
            # while it needs it; a seeking one comes back to its chunks from the disk cache moments later.
            await self._cache.put(rd.key(ref), stored, read_soon=not rd.forward)
        # Forgotten only now, so a reader arriving before the cache has it joins instead of refetching.
        self._flights.forget(rd.key(ref), fut)

    # -- metrics -----------------------------------------------------------------------------------

    def _count_cache(self, result: str, nbytes: int) -> None:
        if self._metrics is not None:
            self._metrics.cache_requests.labels(result).inc()
            self._metrics.cache_bytes.labels(result).inc(nbytes)

    def _count_prefetch(self, state: str, n: int) -> None:
        if self._metrics is not None:
            self._metrics.prefetch_chunks.labels(state).inc(n)
