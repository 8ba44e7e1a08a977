"""A lane: functions run one after another, in order, on the CPU pool, never two at once.

The store path seals a segment's chunks on several threads at once, in whatever order they finish;
what must see the bytes in order (the payload's MD5, the record of each stored chunk and the MD5 of the
stored bytes) goes down a lane beside them. Submitting does not wait: the caller awaits only what it
needs the result of. The first failure fails every function submitted after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

# How a lane runs a function on the CPU pool (ServiceCore._cpu, its direction bound).
Runner = Callable[..., Awaitable[Any]]


class Lane:
    """Runs each submitted function after the one before it has finished, through `run`."""

    def __init__(self, run: Runner) -> None:
        self._run = run
        self._last: asyncio.Task[Any] | None = None

    def submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Task[T]:
        """Queue fn(*args) behind everything submitted before; its task gives the result (or the first
        failure of the lane)."""
        previous = self._last

        async def step() -> T:
            if previous is not None:
                await previous  # in order; and a failure before this one is this one's failure too
            result: T = await self._run(fn, *args)
            return result

        task = asyncio.ensure_future(step())
        self._last = task
        return task

    async def close(self) -> None:
        """Stop the lane: what has not started never will (a function already running on a thread ends
        in its own time). Call it in a `finally`."""
        task, self._last = self._last, None
        if task is None:
            return
        task.cancel()  # it waits on the task before it, which is cancelled in turn, and so on
        # wait(), not `await task`: the lane's own failure is the caller's to have seen, not to get again.
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # retrieved, so that asyncio does not report it as lost
