"""SingleFlight: one flight per key, shared results and errors, cancellation isolated per waiter."""

from __future__ import annotations

import asyncio

import pytest

from tsproxy.cache.singleflight import Abandoned, SingleFlight, wait


async def test_joins_are_counted_and_reported() -> None:
    joins: list[int] = []
    sf: SingleFlight[str, int] = SingleFlight(on_join=lambda: joins.append(1))
    fut = sf.claim("k")
    assert fut is not None and "k" in sf and len(sf) == 1
    assert all(sf.join("k") is fut for _ in range(3))
    assert sf.join("other") is None  # no flight: not a join
    assert sf.joins == 3 and len(joins) == 3


async def test_an_error_reaches_every_waiter() -> None:
    sf: SingleFlight[str, int] = SingleFlight()
    fut = sf.claim("k")
    assert fut is not None
    waiters = [asyncio.create_task(wait(fut)) for _ in range(5)]
    await asyncio.sleep(0)
    boom = RuntimeError("backend down")
    fut.set_exception(boom)
    assert await asyncio.gather(*waiters, return_exceptions=True) == [boom] * 5


async def test_cancelling_one_waiter_leaves_the_flight_and_the_others() -> None:
    sf: SingleFlight[str, int] = SingleFlight()
    fut = sf.claim("k")
    assert fut is not None
    waiters = [asyncio.create_task(wait(fut)) for _ in range(3)]
    await asyncio.sleep(0)
    waiters[0].cancel()
    await asyncio.sleep(0)
    assert not fut.done()
    fut.set_result(7)
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError) and results[1:] == [7, 7]


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
