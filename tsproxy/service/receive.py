"""Receiving a payload ahead of the transform: the first stage of the store path's pipeline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator

from tsproxy.store.base import aclose

# Payload bytes handed to the transform at a time, at most. A chunk's worth (at the default chunk size):
# each hand-over to a thread and back costs GIL switches against the event loop, so fewer, larger ones
# transform faster (README, "Figures behind the code's constants").
BATCH_SIZE = 4 << 20
# Received batches that may wait for the transform beyond the one it works on: a request holds at most
# BATCH_SIZE * BATCHES_AHEAD bytes of payload it has received and not yet transformed.
BATCHES_AHEAD = 2


def batch_size(chunk_size: int) -> int:
    """The batch size for a segment's chunk size: whole chunks, as many as fit in BATCH_SIZE, so that each
    chunk is sealed directly from its batch (no second copy); BATCH_SIZE for chunks larger than that."""
    return chunk_size * (BATCH_SIZE // chunk_size) if chunk_size <= BATCH_SIZE else BATCH_SIZE


class PayloadBatches:
    """Receives a payload stream into batches of exactly `size` bytes (the last may be shorter) in a task
    of its own, so that the client's bytes keep arriving while earlier batches are transformed and sent.
    At most `ahead` batches wait; then the task stops reading, and the client's TCP window closes.

    The payload's first error (a failed body check, a client gone) reaches the consumer from next(),
    after the batches received before it. close() stops the task and closes the payload; call it in
    a `finally`.
    """

    def __init__(self, payload: AsyncIterable[bytes | memoryview], size: int, ahead: int) -> None:
        if size < 1 or ahead < 1:
            raise ValueError("size and ahead must be positive")
        self._queue: asyncio.Queue[bytes | Exception | None] = asyncio.Queue(ahead)
        self._task = asyncio.ensure_future(self._receive(aiter(payload), size))
        self._ended = False

    async def _receive(self, pieces: AsyncIterator[bytes | memoryview], size: int) -> None:
        try:
            # Pieces are gathered and joined once a batch is full: one allocation of the batch's size,
            # not a buffer grown (and copied) piece by piece. A piece across a batch's end is split (views
            # of it), so batches hold whole chunks when `size` is a multiple of the chunk size.
            gathered: list[bytes | memoryview] = []
            filled = 0
            async for piece in pieces:
                rest = memoryview(piece)
                while len(rest) >= size - filled:
                    gathered.append(rest[: size - filled])
                    rest = rest[size - filled :]
                    await self._queue.put(b"".join(gathered))
                    gathered, filled = [], 0
                if rest:
                    gathered.append(rest)
                    filled += len(rest)
            if filled:
                await self._queue.put(b"".join(gathered))
            await self._queue.put(None)
        except Exception as e:
            await self._queue.put(e)
        finally:
            await aclose(pieces)

    async def next(self) -> bytes | None:
        """The next batch; None once the payload has ended. Raises the payload's error."""
        if self._ended:
            return None
        item = await self._queue.get()
        if isinstance(item, Exception):
            self._ended = True
            raise item
        if item is None:
            self._ended = True
        return item

    async def close(self) -> None:
        """Stop receiving (if still at it) and wait until the task is gone."""
        self._ended = True
        self._task.cancel()
        # wait(), not `await task`: a cancellation of the caller itself must not be swallowed here.
        await asyncio.wait([self._task])
