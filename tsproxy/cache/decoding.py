"""Decoding stored chunks on the transform threads: one ChunkDecoder per thread and stored version, and
the frames a seek needs of a chunk inflated on several threads at once when the others are idle. Used by
the read engine (reader.py); no I/O, no cache.

Spreading a seek's frames over the threads shortens a lone consumer's wait (its frames inflating at once
instead of one after the other). Under load it gains nothing, since every thread is busy anyway, and it
would keep each chunk's decrypted payload alive until its last frame's turn in the queue: with 32
readers seeking at once that held tens of MiB more. So a decode only hands frames to other threads
when it is the only decode in the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from typing import Any, NamedTuple, TypeVar

from tsproxy.format import ChunkDecoder, ChunkRef, Manifest, ObjectContext
from tsproxy.format.stages import FrameStep, Payload, join_pieces
from tsproxy.metrics import Metrics
from tsproxy.pool import PriorityPool

T = TypeVar("T")

# Decoders kept per executor thread (each holds a zstd context and an AES key schedule).
DECODERS_PER_THREAD = 16

Span = tuple[int, int]
"""Original bytes [start, stop) within one chunk."""


class Version(NamedTuple):
    """One stored version of an object, as its chunks are decoded: `version` is reader.version_id(manifest)
    (another version of the same object id has other salts or CRCs, so decoders are kept per version)."""

    manifest: Manifest
    ctx: ObjectContext
    version: bytes


class ThreadDecoders:
    """Verifies and decodes chunks in an executor, counting the threads' CPU time as read transform time."""

    def __init__(self, executor: Executor, metrics: Metrics | None = None) -> None:
        self._executor = executor
        self._metrics = metrics
        self._local = threading.local()
        self._lock = threading.Lock()
        self._jobs = 0  # decodes submitted and not yet finished (frames handed on are not counted)
        # Urgent work goes ahead of other work on a PriorityPool; any other executor takes it in turn. A
        # seek's frames are split into as many runs as the pool has threads (two for another executor).
        self._submit_urgent: Callable[..., Future[Any]] = executor.submit
        self._threads = 2
        if isinstance(executor, PriorityPool):
            self._submit_urgent = executor.submit_urgent
            self._threads = max(2, executor.threads)

    async def decode(
        self,
        obj: Version,
        ref: ChunkRef,
        stored: bytes | memoryview,
        part: Span | None = None,
        *,
        urgent: bool = True,
    ) -> bytes | memoryview:
        """Chunk ref's plaintext, or only `part` of it (the whole chunk is verified either way). The frames
        of a part are inflated across the executor's threads.

        urgent: a reader waits for it (a chunk prefetched ahead of readers is not): on a PriorityPool it
        goes ahead of other work, prefetches and uploads' chunks."""
        if part is None:
            return await self._submit(urgent, self._decode, obj, ref, stored)
        first, rest = await self._submit(urgent, self._decode_part, obj, ref, stored, part)
        if not rest:
            return first
        others = await asyncio.gather(*(asyncio.wrap_future(f) for f in rest))
        return join_pieces([first, *others])

    def _submit(self, urgent: bool, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """fn(*args) on the executor, counted in `_jobs` until it ends or is cancelled before it starts."""
        with self._lock:
            self._jobs += 1
        try:
            job = (self._submit_urgent if urgent else self._executor.submit)(fn, *args)
        except BaseException:
            self._ended(None)
            raise
        job.add_done_callback(self._ended)
        return asyncio.wrap_future(job)

    def _ended(self, _job: Future[Any] | None) -> None:
        with self._lock:
            self._jobs -= 1

    def _decoder(self, obj: Version) -> ChunkDecoder:
        """This executor thread's decoder of one stored version."""
        decoders: OrderedDict[bytes, ChunkDecoder] | None = getattr(self._local, "decoders", None)
        if decoders is None:
            decoders = self._local.decoders = OrderedDict()
        decoder = decoders.get(obj.version)
        if decoder is None:
            decoder = decoders[obj.version] = ChunkDecoder(obj.manifest, obj.ctx)
            if len(decoders) > DECODERS_PER_THREAD:
                decoders.popitem(last=False)
        else:
            decoders.move_to_end(obj.version)
        return decoder

    def _decode(self, obj: Version, ref: ChunkRef, stored: bytes | memoryview) -> bytes:
        """Runs on an executor thread: verify and decode one whole chunk."""
        with self._counting_cpu():
            return self._decoder(obj).decode(ref, stored)

    def _decode_part(
        self, obj: Version, ref: ChunkRef, stored: bytes | memoryview, part: Span
    ) -> tuple[bytes | memoryview, list[Future[bytes | memoryview]]]:
        """Runs on an executor thread: verify the whole chunk, then split the frames that hold `part` into
        as many runs as the executor has threads, inflate the first run here while the others inflate on
        the other threads (one core each), handed back as futures; or all of them here when other
        decodes are queued or running. Nothing waits here for another thread's work, so a full executor
        cannot deadlock on it."""
        with self._counting_cpu():
            decoder = self._decoder(obj)
            payload, plan = decoder.open_range(ref, stored, *part)
            if plan is None or len(plan) < 2 or self._jobs > 1:
                return decoder.assemble(ref, payload, plan, *part), []
            runs = _split(plan, self._threads)
            # Only when the pool is otherwise idle (above), so their priority is moot: queued as urgent.
            rest = [self._submit_urgent(self._inflate_run, obj, ref, payload, run) for run in runs[1:]]
            return _inflated(decoder, ref, payload, runs[0]), rest

    def _inflate_run(
        self, obj: Version, ref: ChunkRef, payload: bytes | memoryview, run: list[FrameStep]
    ) -> bytes | memoryview:
        with self._counting_cpu():
            return _inflated(self._decoder(obj), ref, payload, run)

    @contextlib.contextmanager
    def _counting_cpu(self) -> Iterator[None]:
        """Count the executor thread's CPU time spent inside as read transform time."""
        started = time.thread_time()
        try:
            yield
        finally:
            if self._metrics is not None:
                self._metrics.transform_cpu_seconds.labels("read").inc(time.thread_time() - started)


def _inflated(
    decoder: ChunkDecoder, ref: ChunkRef, payload: bytes | memoryview, run: list[FrameStep]
) -> Payload:
    """The original bytes a run of frame steps gives, inflated on this thread."""
    return join_pieces([decoder.inflate_part(ref, payload, step) for step in run])


def _split(plan: list[FrameStep], runs: int) -> list[list[FrameStep]]:
    """plan cut into at most `runs` consecutive runs of nearly equal length, the longer ones first."""
    runs = min(runs, len(plan))
    size, extra = divmod(len(plan), runs)
    out, pos = [], 0
    for n in range(runs):
        end = pos + size + (1 if n < extra else 0)
        out.append(plan[pos:end])
        pos = end
    return out
