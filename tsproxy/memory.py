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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

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


def _mallopt(parameter: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(parameter, value))
