"""A lane: functions run one after another, in order, on the CPU pool, never two at once.

The store path seals a segment's chunks on several threads at once, in whatever order they finish;
what must see the bytes in order goes down a lane beside them: the payload's MD5 down one, the record of
each stored chunk and the MD5 of the stored bytes down another (two lanes run at once). Submitting
waits only for room in the lane (a bound on the functions, and so on the bytes, waiting in it); the
caller awaits the results it needs. The first failure fails every function submitted after it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

# How a lane runs a function on the CPU pool (ServiceCore._cpu, its direction bound).
Runner = Callable[..., Awaitable[Any]]


class Lane:
    """Runs each submitted function after the one before it has finished, through `run`; at most `limit`
    submitted functions are unfinished at a time."""

    def __init__(self, run: Runner, limit: int) -> None:
        if limit < 1:
            raise ValueError("a lane holds at least one function")
        self._run = run
        self._limit = limit
        self._tasks: deque[asyncio.Task[Any]] = deque()  # unfinished, oldest first

    async def submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Task[T]:
        """Queue fn(*args) behind everything submitted before, once there is room; its task gives the
        result (or the first failure of the lane, which a full lane raises here at once)."""
        while self._tasks and (self._tasks[0].done() or len(self._tasks) >= self._limit):
            oldest = self._tasks[0]
            # wait(), not `await`: a cancellation of the caller is its own, a failure is raised below.
            await asyncio.wait([oldest])
            error = None if oldest.cancelled() else oldest.exception()
            if error is not None:
                raise error
            self._tasks.popleft()
        previous = self._tasks[-1] if self._tasks else None

        async def step() -> T:
            if previous is not None:
                await previous  # in order; and a failure before this one is this one's failure too
            result: T = await self._run(fn, *args)
            return result

        task = asyncio.ensure_future(step())
        self._tasks.append(task)
        return task

    async def close(self) -> None:
        """Stop the lane: what has not started never will (a function already running on a thread ends
        in its own time). Call it in a `finally`."""
        tasks, self._tasks = list(self._tasks), deque()
        if not tasks:
            return
        tasks[-1].cancel()  # it waits on the task before it, which is cancelled in turn, and so on
        await asyncio.wait(tasks)
        for task in tasks:
            if not task.cancelled():
                task.exception()  # retrieved, so that asyncio does not report it as lost
