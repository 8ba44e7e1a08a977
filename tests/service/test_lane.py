"""Lane: functions run in the order they were submitted, one at a time, on a pool of several threads; a
bounded number wait; the first failure fails what follows it; close() stops what has not started."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tsproxy.service.lane import Lane


def on(pool: ThreadPoolExecutor) -> Any:
    async def run(fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    return run


def test_in_order_and_never_two_at_once() -> None:
    async def main() -> None:
        done: list[int] = []
        running = [0]
        overlap = threading.Event()
        lock = threading.Lock()

        def step(i: int) -> int:
            with lock:
                running[0] += 1
                if running[0] > 1:
                    overlap.set()
            time.sleep(0.002 if i % 2 else 0)  # later steps would overtake earlier ones if they could
            done.append(i)
            with lock:
                running[0] -= 1
            return i

        with ThreadPoolExecutor(4) as pool:
            lane = Lane(on(pool), 20)
            tasks = [await lane.submit(step, i) for i in range(20)]
            assert await tasks[-1] == 19
            assert [await t for t in tasks] == list(range(20))
            await lane.close()
        assert done == list(range(20)) and not overlap.is_set()

    asyncio.run(main())


def test_a_failure_fails_everything_after_it() -> None:
    async def main() -> None:
        ran: list[int] = []

        def step(i: int) -> None:
            if i == 2:
                raise ValueError("step 2")
            ran.append(i)

        with ThreadPoolExecutor(2) as pool:
            lane = Lane(on(pool), 5)
            tasks = [await lane.submit(step, i) for i in range(5)]
            with pytest.raises(ValueError, match="step 2"):
                await tasks[-1]
            with pytest.raises(ValueError, match="step 2"):
                await lane.submit(step, 5)  # a failed lane refuses more at once
            await lane.close()
        assert ran == [0, 1]
        assert [t.exception() is None for t in tasks] == [True, True, False, False, False]

    asyncio.run(main())


def test_close_stops_what_has_not_started() -> None:
    async def main() -> None:
        started = threading.Event()
        release = threading.Event()
        ran: list[int] = []

        def step(i: int) -> None:
            started.set()
            release.wait(5)
            ran.append(i)

        with ThreadPoolExecutor(2) as pool:
            lane = Lane(on(pool), 5)
            for i in range(5):
                await lane.submit(step, i)
            await asyncio.to_thread(started.wait, 5)
            await lane.close()  # returns at once: the running step ends in its own time
            release.set()
        assert ran == [0]

    asyncio.run(main())


def test_submitting_waits_for_room() -> None:
    async def main() -> None:
        release = threading.Event()

        def step(i: int) -> int:
            release.wait(5)
            return i

        with ThreadPoolExecutor(2) as pool:
            lane = Lane(on(pool), 2)
            first = await lane.submit(step, 0)
            await lane.submit(step, 1)
            third = asyncio.ensure_future(lane.submit(step, 2))
            await asyncio.sleep(0.05)
            assert not third.done()  # two wait: no room until the first is done
            release.set()
            assert await (await third) == 2 and first.result() == 0
            await lane.close()

    asyncio.run(main())
