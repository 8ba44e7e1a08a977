"""PriorityPool: urgent work goes ahead of other work queued shortly before it, never for ever."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import CancelledError, Future

import pytest

from tsproxy import pool
from tsproxy.pool import PriorityPool


def _blocked(p: PriorityPool) -> threading.Event:
    """Occupy the pool's one thread until the returned event is set."""
    release = threading.Event()
    started = threading.Event()

    def hold() -> None:
        started.set()
        release.wait(10)

    p.submit(hold)
    assert started.wait(10)
    return release


def test_urgent_work_runs_before_other_work_queued_just_before_it() -> None:
    p = PriorityPool(1)
    try:
        release = _blocked(p)
        order: list[str] = []
        jobs = [p.submit(order.append, "prefetch 1"), p.submit(order.append, "upload")]
        jobs += [p.submit_urgent(order.append, "reader 1"), p.submit(order.append, "prefetch 2")]
        jobs += [p.submit_urgent(order.append, "reader 2")]
        release.set()
        for job in jobs:
            job.result(10)
        assert order == ["reader 1", "reader 2", "prefetch 1", "upload", "prefetch 2"]
    finally:
        p.shutdown()


def test_other_work_that_waited_longer_than_the_lead_goes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool, "URGENT_LEAD", 0.05)
    p = PriorityPool(1)
    try:
        release = _blocked(p)
        order: list[str] = []
        old = p.submit(order.append, "upload queued long ago")
        time.sleep(0.2)
        urgent = p.submit_urgent(order.append, "reader")
        release.set()
        old.result(10)
        urgent.result(10)
        assert order == ["upload queued long ago", "reader"]
    finally:
        p.shutdown()


def test_results_exceptions_and_cancellation() -> None:
    p = PriorityPool(2, thread_name_prefix="t")
    try:
        assert p.threads == 2
        assert p.submit(pow, 2, 10).result(10) == 1024
        assert p.submit_urgent(lambda *, x: x * 2, x=21).result(10) == 42
        with pytest.raises(ZeroDivisionError):
            p.submit(lambda: 1 // 0).result(10)
        assert {t.name for t in threading.enumerate() if t.name.startswith("t_")} == {"t_0", "t_1"}
    finally:
        p.shutdown()
    p = PriorityPool(1)
    release = _blocked(p)
    queued: Future[int] = p.submit(int, "7")
    assert queued.cancel()
    release.set()
    p.shutdown()
    with pytest.raises(CancelledError):
        queued.result(10)


def test_shutdown_finishes_queued_work_or_cancels_it() -> None:
    p = PriorityPool(1)
    release = _blocked(p)
    kept = p.submit(int, "1")
    release.set()
    p.shutdown(wait=True)
    assert kept.result(0) == 1
    with pytest.raises(RuntimeError):
        p.submit(int, "2")

    p = PriorityPool(1)
    release = _blocked(p)
    dropped = p.submit(int, "3")
    p.shutdown(wait=False, cancel_futures=True)
    release.set()
    assert dropped.cancelled()


def test_an_event_loop_runs_work_in_it() -> None:
    p = PriorityPool(2)

    async def run() -> int:
        return await asyncio.get_running_loop().run_in_executor(p, sum, [1, 2, 3])

    try:
        assert asyncio.run(run()) == 6
    finally:
        p.shutdown()
