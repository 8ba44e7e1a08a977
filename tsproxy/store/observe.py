"""Timing and outcome of backend operations, reported to an optional `on_request` hook."""

from __future__ import annotations

import asyncio
import time
from types import TracebackType

from tsproxy.errors import S3Error
from tsproxy.store.base import RequestObserver


def outcome_of(error: BaseException | None) -> str:
    """The `outcome` label of an operation: "ok", the S3 error code, "cancelled" or "error"."""
    if error is None:
        return "ok"
    if isinstance(error, S3Error):
        return error.code
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    return "error"


class Call:
    """One backend operation being observed; `finish` reports it once (later calls do nothing).

    Use as a context manager for operations that end when their call returns, or keep it and call
    `finish` yourself for a streamed body that ends when its reader closes.
    """

    __slots__ = ("bytes_in", "bytes_out", "finished", "hook", "operation", "retries", "seconds", "started")

    def __init__(self, hook: RequestObserver | None, operation: str) -> None:
        self.hook = hook
        self.operation = operation
        self.started = time.perf_counter()
        self.seconds: float | None = None  # frozen at first byte for streamed reads (see `mark`)
        self.retries = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.finished = False

    def mark(self) -> None:
        """Freeze the latency now (e.g. when a GET's headers arrive) while the body is still read."""
        if self.seconds is None:
            self.seconds = time.perf_counter() - self.started

    def finish(self, error: BaseException | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        if self.hook is None:
            return
        seconds = self.seconds if self.seconds is not None else time.perf_counter() - self.started
        # A metrics hook must never turn a good request into a failed one.
        try:
            self.hook(self.operation, outcome_of(error), seconds, self.retries, self.bytes_in, self.bytes_out)
        except Exception:  # pragma: no cover - defensive
            pass

    def __enter__(self) -> Call:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.finish(exc)
