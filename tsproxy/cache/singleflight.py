"""Single-flight: concurrent requests for the same key share one piece of work in flight.

The first caller for a key leads: it registers a future and the work that settles it. Later callers join
and await the same future. Waiters await it through `asyncio.shield`, so a waiter that is cancelled (a
client hung up) leaves the work, and every other waiter, undisturbed. An error settles the future with
that error, so every waiter sees it.

The leader removes the key when it is done with it (`forget`), which may be later than settling the
future: the chunk reader keeps a settled key registered until the chunk is in the disk cache, so a reader
arriving in between joins the finished result instead of downloading the chunk again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Abandoned(Exception):
    """The work for a key was cancelled before it finished; a waiter may start it again."""


def _consume(fut: asyncio.Future[Any]) -> None:
    # Mark the error as retrieved: a flight nobody waited for must not log "exception was never retrieved".
    if not fut.cancelled():
        fut.exception()


class SingleFlight(Generic[K, V]):
    """A table of in-flight futures by key."""

    def __init__(self, on_join: Callable[[], None] | None = None) -> None:
        self._flights: dict[K, asyncio.Future[V]] = {}
        self._on_join = on_join
        self.joins = 0

    def __len__(self) -> int:
        return len(self._flights)

    def __contains__(self, key: K) -> bool:
        return key in self._flights

    def claim(self, key: K) -> asyncio.Future[V] | None:
        """Lead the work for key: a new pending future the caller must settle, or None if one is in flight."""
        if key in self._flights:
            return None
        fut: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_consume)
        self._flights[key] = fut
        return fut

    def join(self, key: K) -> asyncio.Future[V] | None:
        """The future of the flight for key, if there is one (counted as a join)."""
        fut = self._flights.get(key)
        if fut is not None:
            self.joins += 1
            if self._on_join is not None:
                self._on_join()
        return fut

    def forget(self, key: K, fut: asyncio.Future[V]) -> None:
        """Remove key's flight if it is still fut; a pending fut is failed with Abandoned first."""
        if not fut.done():
            fut.set_exception(Abandoned())
        if self._flights.get(key) is fut:
            del self._flights[key]


async def wait(fut: asyncio.Future[V]) -> V:
    """Await a shared future without cancelling it when the waiter is cancelled."""
    return await asyncio.shield(fut)
