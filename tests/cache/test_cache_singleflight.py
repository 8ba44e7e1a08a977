"""SingleFlight: one piece of work per key, shared results and errors, cancellation isolated per waiter."""

from __future__ import annotations

import asyncio

import pytest

from tsproxy.cache.singleflight import Abandoned, SingleFlight, wait


class Work:
    """Work that counts its runs and finishes when the test says so."""

    def __init__(self, result: object = "done") -> None:
        self.runs = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.result = result
        self.cancelled = False

    async def __call__(self) -> object:
        self.runs += 1
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


async def test_concurrent_callers_share_one_run() -> None:
    joins: list[int] = []
    sf: SingleFlight[str, object] = SingleFlight(on_join=lambda: joins.append(1))
    work = Work()
    waiters = [asyncio.create_task(sf.do("k", work)) for _ in range(10)]
    await work.started.wait()
    assert "k" in sf and len(sf) == 1
    work.release.set()
    assert await asyncio.gather(*waiters) == ["done"] * 10
    assert work.runs == 1
    assert sf.joins == 9 and len(joins) == 9
    assert "k" not in sf  # finished work is forgotten: the next call runs again
    again = Work()
    again.release.set()
    assert await sf.do("k", again) == "done" and again.runs == 1


async def test_different_keys_run_separately() -> None:
    sf: SingleFlight[str, object] = SingleFlight()
    a, b = Work("a"), Work("b")
    ta, tb = asyncio.create_task(sf.do("a", a)), asyncio.create_task(sf.do("b", b))
    a.release.set()
    b.release.set()
    assert (await ta, await tb) == ("a", "b")
    assert (a.runs, b.runs) == (1, 1)


async def test_an_error_reaches_every_waiter() -> None:
    sf: SingleFlight[str, object] = SingleFlight()
    boom = RuntimeError("backend down")
    work = Work(boom)
    waiters = [asyncio.create_task(sf.do("k", work)) for _ in range(5)]
    await work.started.wait()
    work.release.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert results == [boom] * 5
    assert work.runs == 1 and "k" not in sf


@pytest.mark.parametrize("victim", [0, 3])  # the leader, or a joiner
async def test_cancelling_one_waiter_leaves_the_work_and_the_others(victim: int) -> None:
    sf: SingleFlight[str, object] = SingleFlight()
    work = Work()
    waiters = [asyncio.create_task(sf.do("k", work)) for _ in range(5)]
    await work.started.wait()
    waiters[victim].cancel()
    await asyncio.sleep(0)
    work.release.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert isinstance(results[victim], asyncio.CancelledError)
    assert [r for i, r in enumerate(results) if i != victim] == ["done"] * 4
    assert not work.cancelled and work.runs == 1


async def test_work_finishes_even_if_every_waiter_leaves() -> None:
    sf: SingleFlight[str, object] = SingleFlight()
    work = Work()
    waiter = asyncio.create_task(sf.do("k", work))
    await work.started.wait()
    waiter.cancel()
    work.release.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not work.cancelled
    assert "k" not in sf


async def test_claim_join_forget() -> None:
    sf: SingleFlight[str, int] = SingleFlight()
    fut = sf.claim("k")
    assert fut is not None
    assert sf.claim("k") is None  # one leader per key
    joined = sf.join("k")
    assert joined is fut and sf.joins == 1
    fut.set_result(7)
    assert "k" in sf  # settled but still registered until the leader forgets it
    assert await wait(joined) == 7
    sf.forget("k", fut)
    assert "k" not in sf and sf.join("k") is None


async def test_forgetting_an_unsettled_flight_abandons_it() -> None:
    sf: SingleFlight[str, int] = SingleFlight()
    fut = sf.claim("k")
    assert fut is not None
    waiter = asyncio.create_task(wait(fut))
    await asyncio.sleep(0)
    sf.forget("k", fut)
    with pytest.raises(Abandoned):
        await waiter
    assert sf.claim("k") is not None  # a waiter may take it over


async def test_forget_leaves_a_newer_flight_alone() -> None:
    sf: SingleFlight[str, int] = SingleFlight()
    old = sf.claim("k")
    assert old is not None
    sf.forget("k", old)
    new = sf.claim("k")
    assert new is not None
    sf.forget("k", old)  # a late forget of the old flight
    assert sf.join("k") is new


async def test_cancelled_work_abandons_its_waiters() -> None:
    sf: SingleFlight[str, object] = SingleFlight()
    work = Work()
    waiter = asyncio.create_task(sf.do("k", work))
    await work.started.wait()
    # Cancel the work itself (as a shutdown does), not the waiter.
    (task,) = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and t is not waiter]
    task.cancel()
    with pytest.raises(Abandoned):
        await waiter
    assert work.cancelled and "k" not in sf
