"""An object's first stored bytes, fetched beside its tail, so that a cold read from the start of an
object costs one round trip to the store instead of two (the tail, then the chunks it locates).

A tsproxy object keeps its data area at byte 0 and its manifest at its end (docs/FORMAT.md): the tail
must be read before any chunk can be located, except the first, which always starts at stored byte 0.
So a read from original byte 0 asks for the object's head at the same time as its tail: a GET of the
stored bytes the read's first chunks can span at most. The head's GET is not pinned to a version (none
is known yet): its bytes are used only when its ETag is the one the tail was read with, and every chunk
taken from it is authenticated as any other. An object whose tail read holds it whole (a suffix longer
than the object) needs no head GET: the tail read's bytes are its head.

`HeadRanges` is the read engine's fetch function for one version (store.base.VersionRanges) with a head
in front of it: what the head holds is served from it as its bytes arrive, the rest fetched as usual,
its GET sent at once rather than after the head's part.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections.abc import AsyncIterator

from tsproxy.store.base import Backend, ObjectReader, VersionRanges


class StoredHead:
    """Stored bytes [0, length) of an object, of whichever version the store answers with, as they
    arrive. The buffer is the immutable pieces as received; readers take views of them."""

    def __init__(self, length: int) -> None:
        self.length = length  # bytes asked for (the answer may be shorter: a smaller object)
        self.etag: str | None = None  # the version the bytes are of, once the answer's headers are in
        self._pieces: list[bytes] = []
        self._starts: list[int] = []
        self._end = 0  # bytes received
        self._done = False  # the answer ended (whole, cut short or failed)
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def fetch(cls, backend: Backend, bucket: str, key: str, length: int) -> StoredHead:
        """Start a GET of an object's first `length` stored bytes, in the background."""
        head = cls(length)
        head._task = asyncio.get_running_loop().create_task(head._fill(backend, bucket, key))
        return head

    @classmethod
    def held(cls, etag: str, data: bytes) -> StoredHead:
        """An object's head already in hand (all of a small object, from its tail read)."""
        head = cls(len(data))
        head.etag = etag
        if data:
            head._add(bytes(data))
        head._finish()
        return head

    @property
    def done(self) -> bool:
        """Its GET has ended (or there was none)."""
        return self._done

    async def _fill(self, backend: Backend, bucket: str, key: str) -> None:
        reader: ObjectReader | None = None
        try:
            reader = await backend.get(bucket, key, 0, self.length - 1)
            self.etag = reader.info.etag
            self._changed.set()
            async for piece in reader:
                self._add(bytes(piece))
        except Exception:  # a guess that failed: the read asks the store for what it lacks
            pass
        finally:
            if reader is not None:
                await reader.close()
            self._finish()

    def _add(self, piece: bytes) -> None:
        if not piece:
            return
        self._starts.append(self._end)
        self._pieces.append(piece)
        self._end += len(piece)
        self._changed.set()

    def _finish(self) -> None:
        self._done = True
        self._changed.set()

    async def _progress(self) -> None:
        """Return once more bytes (or the answer's end) came in since the last call."""
        self._changed.clear()
        await self._changed.wait()

    async def version(self) -> str | None:
        """The ETag of the version the head is of; None when its GET failed."""
        while self.etag is None and not self._done:
            await self._progress()
        return self.etag

    async def pieces(self, start: int, end: int) -> AsyncIterator[memoryview]:
        """Views of stored bytes [start, end) in order, as they arrive; stops early where the answer
        ended short of them (the caller fetches the rest)."""
        pos = start
        while pos < end:
            if pos < self._end:
                i = self._index(pos)
                piece, at = self._pieces[i], self._starts[i]
                stop = min(end, at + len(piece))
                yield memoryview(piece)[pos - at : stop - at]
                pos = stop
            elif self._done:
                return
            else:
                await self._progress()

    def _index(self, pos: int) -> int:
        """The piece holding stored byte `pos` (one received already)."""
        return bisect.bisect_right(self._starts, pos) - 1

    async def close(self) -> None:
        """Stop its GET if it is still running (the read it was fetched for is over)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class HeadRanges:
    """VersionRanges with a head in front: ranges that start within the head are served from it."""

    __slots__ = ("head", "ranges")

    def __init__(self, ranges: VersionRanges, head: StoredHead) -> None:
        self.ranges, self.head = ranges, head

    async def __call__(self, start: int, end: int) -> AsyncIterator[bytes | memoryview]:
        head = self.head
        covered = min(end, head.length)
        if start >= covered:
            async for piece in self.ranges(start, end):
                yield piece
            return
        # The part past the head goes out now, not once the head's part is through.
        rest = asyncio.get_running_loop().create_task(self._open(covered, end)) if covered < end else None
        try:
            pos = start
            if await head.version() == self.ranges.etag:
                async for view in head.pieces(start, covered):
                    yield view
                    pos += len(view)
            if pos < covered:  # another version, a failed head GET or one cut short
                async for piece in self.ranges(pos, covered):
                    yield piece
            if rest is not None:
                reader = await rest
                rest = None
                try:
                    async for piece in reader:
                        yield piece
                finally:
                    await reader.close()
        finally:
            if rest is not None:
                rest.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    reader = await rest
                    await reader.close()

    async def _open(self, start: int, end: int) -> ObjectReader:
        r = self.ranges
        return await r.backend.get(r.bucket, r.key, start, end - 1, if_match=r.etag)
