"""The transform threads' pool: work a client is waiting on goes ahead of work nobody waits on yet.

One pool of CPU threads (zstd, AES-GCM, hashing) serves the store path (sealing an upload's chunks),
the read path's decodes of the chunk a reader asked for, and the decodes of chunks prefetched ahead of
it. In a plain FIFO pool a reader's chunk waits behind every chunk queued before it: a forward
reader's first GET behind the decodes of the window prefetched beside it when those bytes came in
first (it finished decoding after two of the window's, README, "Figures behind the code's
constants"), and a consumer's read behind the chunks of an upload the broker is sending
at the same time.
benchmarks/fetch.py's first_ms has not shown a difference beyond its noise on an otherwise idle
machine; the order is what a reader under load needs regardless
(tests/cache/test_cache_reader.py shows it). A job already running is not overtaken: that is why the
read engine also has a window's decodes wait for the reader's own chunk (reader.OWN_FIRST_WAIT).

So each job has a deadline, its submission time, less URGENT_LEAD for urgent work, and the threads take
the earliest deadline first (ties in submission order). Urgent work passes the other work submitted
less than URGENT_LEAD before it; other work that has waited longer than that goes first, so no kind
of work waits for ever behind the other. Work of one kind runs in submission order.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")

# How far ahead of other work urgent work goes: the time other work may wait for urgent work submitted
# after it (about 20 chunk decodes).
URGENT_LEAD = 0.1  # seconds

_Job = tuple[float, int, "Future[Any]", Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class PriorityPool(Executor):
    """A fixed number of threads taking jobs earliest deadline first (see the module's docstring).

    `submit` queues other work, `submit_urgent` work a client is waiting on. Usable wherever an Executor
    is (`loop.run_in_executor`). Threads start with the pool and end at `shutdown`.
    """

    def __init__(self, threads: int, thread_name_prefix: str = "pool") -> None:
        if threads < 1:
            raise ValueError("a pool needs at least one thread")
        self._jobs: list[_Job] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{thread_name_prefix}_{n}", daemon=True)
            for n in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def threads(self) -> int:
        return len(self._threads)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Queue work nobody waits on yet (a prefetch, an upload's chunk)."""
        return self._queue(0.0, fn, args, kwargs)

    def submit_urgent(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Queue work a client is waiting on: it goes ahead of other work submitted up to URGENT_LEAD
        seconds before it."""
        return self._queue(URGENT_LEAD, fn, args, kwargs)

    def _queue(
        self, lead: float, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Future[T]:
        future: Future[T] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("cannot submit to a pool that is shut down")
            deadline = time.monotonic() - lead
            heapq.heappush(self._jobs, (deadline, next(self._order), future, fn, args, kwargs))
            self._cond.notify()
        return future

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return  # shut down and drained
                _, _, future, fn, args, kwargs = heapq.heappop(self._jobs)
            if future.set_running_or_notify_cancel():  # False: cancelled while it waited
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as e:
                    future.set_exception(e)
            # Hold nothing of a finished job (its arguments, a decoded chunk) while waiting for the next.
            del future, fn, args, kwargs

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more work; with cancel_futures, cancel the jobs not started; with wait, wait for the
        threads, which finish every job still queued."""
        with self._cond:
            self._closed = True
            if cancel_futures:
                for job in self._jobs:
                    job[2].cancel()
                self._jobs.clear()
            self._cond.notify_all()
        if wait:
            for thread in self._threads:
                thread.join()
