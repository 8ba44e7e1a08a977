"""The process's allocator: big buffers go back to the system when they are freed, a heap's top is kept
for the next upload, and the threads share few heaps.

tsproxy's hot path allocates and frees buffers of a few MiB (chunks, batches, parts) from several
threads. glibc's malloc serves allocations above its mmap threshold with their own mappings, returned
to the system on free, but by default it raises that threshold after each such free (up to 32 MiB): from
then on multi-MiB buffers come from the heaps of per-thread arenas, which keep the freed memory. In one
run each of `benchmarks/proxy.py`, a 1 GiB upload peaked at 313 MiB with glibc's default, 283 MiB with
the threshold fixed at 8 MiB (backend parts, 25 MiB by default, get mappings of their own, while
chunk-size buffers of 4 MiB stay on the heap, where reusing them is cheap), and 255 MiB at 1 MiB, where
one run each of `benchmarks/fetch.py` showed cold and warm reads 10-20 % slower (page faults on fresh
mappings). The setting `malloc_mmap_threshold` chooses the value; `0` leaves glibc's own behaviour (and
its `MALLOC_MMAP_THRESHOLD_` variable).

Fixing the mmap threshold also fixes glibc's trim threshold at its default, 128 KiB: whenever more than
that is free at the top of a heap, it goes back to the system. An upload frees its batches and its
stored part (about 30 MiB for a 25 MiB part) when it ends, so each part of a broker's one-at-a-time
upload took that memory back from the kernel page by page: some 470 page faults a MiB uploaded, about a
fifth of tsproxy's CPU time (`benchmarks/cpu.py`: 1.48x the bare limit, 1.22x without the faults, one
run each). `malloc_trim_threshold` (64 MiB) lets a heap keep that much; the faults drop to a few a MiB.

Kept free memory counts once per heap, and glibc makes up to eight heaps a core for its threads (the
event loop, the CPU pool, the cache's writers): with a 32 MiB trim threshold and glibc's heaps, a 1 GiB
upload after the reads of `benchmarks/proxy.py` peaked at 350-370 MiB, against 315-324 before. With the
threads sharing two heaps (`malloc_arenas`) it peaked at 307-316 MiB with a 64 MiB threshold (four
runs; reads as fast as before in `benchmarks/fetch.py`); the same upload with no reads before it peaked
5-15 MiB above the base's (three alternating runs: what a heap keeps is most of that process's peak).
`0` leaves glibc's own for either (and its `MALLOC_TRIM_THRESHOLD_` and `MALLOC_ARENA_MAX` variables).

What a heap keeps for the next part is kept for nothing once the uploads stop: after a burst, a quiet
server would sit on up to twice `malloc_trim_threshold` of free memory until the next one. IdleRelease
gives it back (glibc's malloc_trim) once no client request has run for `malloc_idle_release` seconds,
once per quiet spell; the next burst faults its first part's worth in again, as after a restart.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import sys
import time
from collections.abc import Callable
from typing import Any

# mallopt parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def fix_mmap_threshold(threshold: int) -> bool:
    """Set glibc's mmap threshold (which also stops it moving); False where there is nothing to set."""
    return _mallopt(_M_MMAP_THRESHOLD, threshold)


def fix_trim_threshold(threshold: int) -> bool:
    """Set how much free memory glibc keeps at the top of a heap; False where there is nothing to set."""
    return _mallopt(_M_TRIM_THRESHOLD, threshold)


def limit_arenas(arenas: int) -> bool:
    """Cap the heaps glibc makes for threads (set before threads start); False where nothing to set."""
    return _mallopt(_M_ARENA_MAX, arenas)


def release_free() -> bool:
    """Give the free memory of every heap back to the system (glibc's malloc_trim); False where nothing
    was given back or there is no glibc. It takes each heap's lock in turn: call it off the event loop."""
    trim = _glibc("malloc_trim")
    if trim is None:
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))


def _mallopt(parameter: int, value: int) -> bool:
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(parameter, value))


@functools.cache
def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def _glibc(function: str) -> Any:
    """A glibc function by name; None elsewhere (not Linux, or a C library without it: musl has neither
    mallopt nor malloc_trim)."""
    libc = _libc()
    return getattr(libc, function, None) if libc is not None else None


class IdleRelease:
    """Gives the heaps' free memory back to the system once the server has been quiet for `quiet`
    seconds: no client request running and none begun since. Once per quiet spell (a spell with no
    request in it has nothing new to give back).

    The server calls begin() and end() around every request and runs run_forever() as a task. `release`
    runs on a worker thread and says whether anything was given back; `on_release` gets that answer.
    """

    def __init__(
        self,
        quiet: float,
        *,
        release: Callable[[], bool] = release_free,
        on_release: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if quiet <= 0:
            raise ValueError("quiet must be positive")
        self.quiet = quiet
        self._release = release
        self._on_release = on_release
        self._clock = clock
        self._running = 0
        self._quiet_since = clock()
        self._used = False  # a request ran since the last release

    def begin(self) -> None:
        self._running += 1
        self._used = True

    def end(self) -> None:
        self._running -= 1
        self._quiet_since = self._clock()

    def due(self) -> bool:
        """Whether a release is due now."""
        return self._used and self._running == 0 and self._clock() - self._quiet_since >= self.quiet

    async def release_if_due(self) -> bool | None:
        """Release when due: what `release` answered, or None when it was not due."""
        if not self.due():
            return None
        self._used = False
        released = await asyncio.to_thread(self._release)
        if self._on_release is not None:
            self._on_release(released)
        return released

    async def run_forever(self) -> None:
        """Look a few times per quiet period (at most every second) and release when due."""
        step = min(max(self.quiet / 4, 0.05), 1.0)
        while True:
            await asyncio.sleep(step)
            await self.release_if_due()
