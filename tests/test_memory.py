"""The allocator settings `tsproxy serve` makes at start (glibc only)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tsproxy.memory import IdleRelease


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_thresholds_are_set_where_glibc_is() -> None:
    code = (
        "from tsproxy import memory; print(memory.fix_mmap_threshold(8 << 20), "
        "memory.fix_trim_threshold(64 << 20), memory.limit_arenas(2))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True True True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_release_gives_a_heaps_kept_free_memory_back() -> None:
    # The serve settings (8 MiB mmap threshold, a heap keeps up to 256 MiB free here): 80 one-MiB buffers
    # come from the heap, stay resident once freed, and go back to the system only when released.
    code = """
from tsproxy import memory
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
memory.fix_mmap_threshold(8 << 20)
memory.fix_trim_threshold(256 << 20)
base = rss()
held = [b"x" * (1 << 20) for _ in range(80)]
held.clear()
kept = rss()
released = memory.release_free()
print(kept - base, rss() - base, released)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    kept, after, released = done.stdout.split()
    assert int(kept) >= 60  # freed, yet resident: what the trim threshold keeps for the next upload
    assert int(after) <= 20
    assert released == "True"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _idle(clock: Clock, answers: list[bool]) -> tuple[IdleRelease, list[bool], list[bool]]:
    calls: list[bool] = []
    seen: list[bool] = []

    def release() -> bool:
        calls.append(True)
        return answers[len(calls) - 1]

    return IdleRelease(5, release=release, on_release=seen.append, clock=clock), calls, seen


async def test_idle_release_waits_for_a_quiet_spell_after_a_request() -> None:
    clock = Clock()
    idle, calls, seen = _idle(clock, [True, False])
    clock.now += 60
    assert await idle.release_if_due() is None  # no request yet: nothing of ours to give back
    idle.begin()
    clock.now += 60
    assert await idle.release_if_due() is None  # a request is running, however long
    idle.end()
    clock.now += 4.9
    assert await idle.release_if_due() is None  # not quiet for long enough
    clock.now += 0.1
    assert await idle.release_if_due() is True
    assert calls == [True] and seen == [True]
    clock.now += 60
    assert await idle.release_if_due() is None  # once per quiet spell
    idle.begin()
    idle.begin()
    idle.end()
    clock.now += 60
    assert await idle.release_if_due() is None  # one of two requests still running
    idle.end()
    clock.now += 5
    assert await idle.release_if_due() is False  # due again; glibc had nothing to give back
    assert calls == [True, True] and seen == [True, False]


def test_idle_release_needs_a_positive_quiet_time() -> None:
    with pytest.raises(ValueError):
        IdleRelease(0)
