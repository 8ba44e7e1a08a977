"""The process's allocator: big buffers go back to the system when they are freed.

tsproxy's hot path allocates and frees buffers of a few MiB (chunks, batches, parts) from several
threads. glibc's malloc serves allocations above its mmap threshold with their own mappings, returned
to the system on free, but by default it raises that threshold after each such free (up to 32 MiB): from
then on multi-MiB buffers come from the heaps of per-thread arenas, which keep the freed memory. In one
run each of `benchmarks/proxy.py`, a 1 GiB upload peaked at 313 MiB with glibc's default, 283 MiB with
the threshold fixed at 8 MiB (backend parts, 25 MiB by default, get mappings of their own, while
chunk-size buffers of 4 MiB stay on the heap, where reusing them is cheap), and 255 MiB at 1 MiB, where
one run each of `benchmarks/fetch.py` showed cold and warm reads 10-20 % slower (page faults on fresh
mappings). The setting `malloc_mmap_threshold`
chooses the value; `0` leaves glibc's own behaviour (and its `MALLOC_MMAP_THRESHOLD_` variable).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_MMAP_THRESHOLD = -3  # mallopt parameter number (malloc.h)


def fix_mmap_threshold(threshold: int) -> bool:
    """Set glibc's mmap threshold (which also stops it moving); False where there is nothing to set."""
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
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))
