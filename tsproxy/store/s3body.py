"""Bodies of the S3 backend: GET bodies read (and resumed) in pieces, PUT bodies cut into parts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any

from tsproxy import errors
from tsproxy.store import s3errors
from tsproxy.store.base import MIB, ObjectInfo, aclose
from tsproxy.store.observe import BackendCall
from tsproxy.store.retry import Backoff

# reopen(range header): a GetObject of the same object pinned to its ETag, admitted and retried as
# part of the reader's call; its answer's "Body" takes over.
Reopen = Callable[[str], Awaitable[dict[str, Any]]]

RESUME_CREDIT = 8 * MIB  # body bytes read since a failure that reset a reader's failure count


def content_range(header: str | None) -> tuple[int, int, int] | None:
    """`bytes 0-9/100` -> (0, 9, 100)."""
    if not header or not header.startswith("bytes "):
        return None
    span, _, total = header[6:].partition("/")
    first, _, last = span.partition("-")
    try:
        return int(first), int(last), int(total)
    except ValueError:
        return None


class S3Reader:
    """A GET body read in bounded pieces; a body cut short is resumed with a ranged GET pinned to the
    same ETag (If-Match), so the bytes always come from one version of the object."""

    def __init__(
        self,
        response: dict[str, Any],
        info: ObjectInfo,
        start: int,
        end: int,
        content_range: tuple[int, int] | None,
        call: BackendCall,
        *,
        reopen: Reopen,
        backoff: Backoff,
        read_size: int = MIB,
    ) -> None:
        self._reopen = reopen
        self._backoff = backoff
        self._read_size = read_size
        self._body: Any = response["Body"]
        self.info = info
        self.content_range = content_range
        self._pos = start
        self._end = end  # exclusive
        self._call = call
        self._closed = False
        self._failures = 0
        self._since_failure = 0

    async def _piece(self, limit: int) -> bytes:
        while self._pos < self._end and not self._closed:
            try:
                data: bytes = await self._body.read(min(limit, self._end - self._pos))
            except s3errors.CONNECTION_ERRORS as e:
                error: BaseException = e
            else:
                if data:
                    if len(data) > self._end - self._pos:
                        raise errors.InternalError("The storage backend sent more bytes than asked for.")
                    self._pos += len(data)
                    self._call.bytes_in += len(data)
                    self._since_failure += len(data)
                    return data
                error = errors.ServiceUnavailable("The storage backend ended a body early.")
            await self._resume(error)
        return b""

    async def _resume(self, error: BaseException) -> None:
        """Pick up a body that stopped short where it stopped, from the same object version.

        Failures count against the backend's attempts, as for any request; a good stretch of body
        (`RESUME_CREDIT`) since the last failure starts the count afresh, so a long read survives
        the odd dropped connection but not a store that cuts every answer short.
        """
        self._body.close()
        if self._since_failure >= RESUME_CREDIT:
            self._failures = 0
        self._failures += 1
        self._since_failure = 0
        if not self._backoff.allows_another(self._failures):
            failure = s3errors.to_s3_error(error)
            self._call.finish(failure)
            raise failure from error
        self._call.retries += 1
        await asyncio.sleep(self._backoff.delay(self._failures))
        try:
            response = await self._reopen(f"bytes={self._pos}-{self._end - 1}")
        except errors.PreconditionFailed:
            failure = errors.InternalError("The object changed in the backend while it was being read.")
            self._call.finish(failure)
            raise failure from None
        except BaseException as e:
            self._call.finish(e)
            raise
        self._body = response["Body"]

    async def _pieces(self) -> AsyncIterator[bytes]:
        while piece := await self._piece(self._read_size):
            yield piece

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._pieces()

    async def read(self) -> bytes:
        """The rest of the body in one piece (for small bodies)."""
        pieces = []
        while piece := await self._piece(self._end - self._pos):
            pieces.append(piece)
        return b"".join(pieces)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            # Closing a body not read to its end drops its connection rather than reuse it.
            self._body.close()
        self._call.finish()

    async def __aenter__(self) -> S3Reader:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


async def slices(data: bytes | bytearray, size: int) -> AsyncIterator[bytes | bytearray]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


class Regrouper:
    """Regroups a stream into parts of exactly `size` bytes (the last may be shorter, never empty).

    Holds the part being filled and at most one piece of the stream: a piece that overflows a part is
    carried over as a view, not copied. A part is joined once it is whole, as `bytes`: one allocation
    of its size (no buffer grown and copied piece by piece), and a body the HTTP client sends without
    slicing a copy of it first (it does copy a `bytearray`).
    """

    def __init__(self, body: AsyncIterable[bytes], size: int) -> None:
        self._pieces = aiter(body)
        self._carry = memoryview(b"")
        self._ended = False
        self.size = size

    async def _fill_carry(self) -> bool:
        while not self._carry and not self._ended:
            try:
                piece = await anext(self._pieces)
            except StopAsyncIteration:
                self._ended = True
            else:
                # Views of a piece are held until its part is joined: a mutable one is copied first.
                self._carry = memoryview(piece if isinstance(piece, bytes) else bytes(piece))
        return bool(self._carry)

    async def next_part(self) -> bytes | None:
        views: list[memoryview] = []
        filled = 0
        while filled < self.size and await self._fill_carry():
            take = self.size - filled
            views.append(self._carry[:take])
            filled += len(views[-1])
            self._carry = self._carry[take:]
        return b"".join(views) if views else None

    async def at_end(self) -> bool:
        return not await self._fill_carry()

    async def parts(self, first: bytes) -> AsyncIterator[bytes]:
        yield first
        while (part := await self.next_part()) is not None:
            yield part


async def read_ahead(parts: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The parts of `parts`, the next one gathered (received, transformed) while the consumer uploads
    the current one. Holds at most two parts; closing it stops the gathering and closes `parts`."""
    pending: asyncio.Future[bytes] | None = None
    try:
        pending = asyncio.ensure_future(anext(parts))
        while True:
            try:
                part = await pending
            except StopAsyncIteration:
                pending = None
                return
            pending = asyncio.ensure_future(anext(parts))
            yield part
    finally:
        if pending is not None:
            pending.cancel()
            # wait(), not `await`: the part's own error is superseded, and our own cancellation is kept.
            await asyncio.wait([pending])
            if not pending.cancelled():
                pending.exception()  # retrieved, so that asyncio does not report it as lost
        await aclose(parts)
