"""The one hook every backend request passes through: admitted before it leaves, reported when it ends.

A backend takes `on_request`, either a `RequestObserver` or just a report function. It awaits
`observer.before(operation)` before each request it sends to the store (every retry, every resumed
GET and every internal HEAD included), so a rate limiter installed there sees all of them; it calls
`observer.after(...)` once per operation, after its retries, which is what metrics and job statistics
count. `BackendCall` does both for one operation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import TracebackType
from typing import Protocol, runtime_checkable

from tsproxy.errors import S3Error

# report(operation, outcome, seconds, retries, bytes_in, bytes_out): once per backend operation, after
# its retries; outcome is "ok" or the S3 error code it ended with.
ReportRequest = Callable[[str, str, float, int, int, int], None]


@runtime_checkable
class RequestObserver(Protocol):
    """Sees every backend request: may hold each one back, and hears how each operation ended."""

    async def before(self, operation: str) -> None:
        """A request for `operation` is about to be sent; return when it may go."""
        ...

    def after(
        self, operation: str, outcome: str, seconds: float, retries: int, bytes_in: int, bytes_out: int
    ) -> None:
        """An operation ended (see `ReportRequest`). Must not raise."""
        ...


OnRequest = RequestObserver | ReportRequest  # what backends accept as `on_request`


class ReportOnly:
    """A RequestObserver that holds nothing back and passes each report to a function."""

    __slots__ = ("report",)

    def __init__(self, report: ReportRequest) -> None:
        self.report = report

    async def before(self, operation: str) -> None:
        return None

    def after(
        self, operation: str, outcome: str, seconds: float, retries: int, bytes_in: int, bytes_out: int
    ) -> None:
        self.report(operation, outcome, seconds, retries, bytes_in, bytes_out)


def observer_of(on_request: OnRequest | None) -> RequestObserver | None:
    """The observer for a backend's `on_request` argument (a bare report function gets wrapped)."""
    if on_request is None or isinstance(on_request, RequestObserver):
        return on_request
    return ReportOnly(on_request)


def outcome_of(error: BaseException | None) -> str:
    """The `outcome` label of an operation: "ok", the S3 error code, "cancelled" or "error"."""
    if error is None:
        return "ok"
    if isinstance(error, S3Error):
        return error.code
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    return "error"


class BackendCall:
    """One backend operation being observed: `admit` before each request it sends, `finish` once.

    `async with` admits the first request and finishes on exit, for operations that end when their
    call returns; a retry loop admits each further attempt itself. A streamed body that ends when its
    reader closes keeps the call and finishes it then. Time spent held back in `admit` is not latency.
    """

    __slots__ = (
        "bytes_in",
        "bytes_out",
        "finished",
        "observer",
        "operation",
        "retries",
        "seconds",
        "started",
    )

    def __init__(self, observer: RequestObserver | None, operation: str) -> None:
        self.observer = observer
        self.operation = operation
        self.started = time.perf_counter()
        self.seconds: float | None = None  # frozen at first byte for streamed reads (see `mark`)
        self.retries = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.finished = False

    async def admit(self) -> None:
        """Return when the next request of this operation may be sent (the observer decides)."""
        if self.observer is None:
            return
        held = time.perf_counter()
        try:
            await self.observer.before(self.operation)
        finally:
            self.started += time.perf_counter() - held

    def mark(self) -> None:
        """Freeze the latency now (e.g. when a GET's headers arrive) while the body is still read."""
        if self.seconds is None:
            self.seconds = time.perf_counter() - self.started

    def finish(self, error: BaseException | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        if self.observer is None:
            return
        seconds = self.seconds if self.seconds is not None else time.perf_counter() - self.started
        # A metrics hook must never turn a good request into a failed one.
        try:
            self.observer.after(
                self.operation, outcome_of(error), seconds, self.retries, self.bytes_in, self.bytes_out
            )
        except Exception:  # pragma: no cover - defensive
            pass

    def __enter__(self) -> BackendCall:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.finish(exc)

    async def __aenter__(self) -> BackendCall:
        await self.admit()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.finish(exc)
