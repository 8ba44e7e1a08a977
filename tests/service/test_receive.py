"""PayloadBatches, the receiving stage of the store path: batches in order, a bound on what it reads ahead
of a consumer that does not keep up, errors passed on after the batches before them, and a clean stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tsproxy.service.receive import PayloadBatches, batch_size


class Client:
    """A payload of `count` pieces of `piece` bytes each (piece i filled with byte i), that counts what was
    taken from it, can fail after `fail_after` pieces, and notes whether it was closed."""

    def __init__(self, count: int, piece: int, fail_after: int | None = None) -> None:
        self.count, self.piece, self.fail_after = count, piece, fail_after
        self.taken = 0
        self.closed = False

    async def pieces(self) -> AsyncIterator[bytes]:
        try:
            for i in range(self.count):
                if i == self.fail_after:
                    raise ConnectionResetError("client went away")
                self.taken += self.piece
                yield bytes([i % 256]) * self.piece
                await asyncio.sleep(0)
        finally:
            self.closed = True


async def settle() -> None:
    """Let every task run until it waits on something only the test can give (no clock involved)."""
    for _ in range(200):
        await asyncio.sleep(0)


async def drain(batches: PayloadBatches) -> list[bytes]:
    out = []
    while (batch := await batches.next()) is not None:
        out.append(batch)
    return out


def test_batches_come_in_order_and_whole() -> None:
    async def main() -> None:
        client = Client(count=23, piece=1000)
        batches = PayloadBatches(client.pieces(), 4096, 2)
        try:
            got = await drain(batches)
        finally:
            await batches.close()
        assert b"".join(got) == b"".join(bytes([i]) * 1000 for i in range(23))
        # Exactly the batch size (pieces split across batch ends), so batches hold whole chunks.
        assert [len(b) for b in got] == [4096] * 5 + [23_000 - 5 * 4096]
        assert await batches.next() is None
        assert client.closed

    asyncio.run(main())


def test_a_piece_larger_than_a_batch_is_split_across_batches() -> None:
    async def main() -> None:
        client = Client(count=3, piece=10_000)
        batches = PayloadBatches(client.pieces(), 4096, 2)
        try:
            got = await drain(batches)
        finally:
            await batches.close()
        assert [len(b) for b in got] == [4096] * 7 + [30_000 - 7 * 4096]
        assert b"".join(got) == b"".join(bytes([i]) * 10_000 for i in range(3))
        assert all(isinstance(b, bytes) for b in got)

    asyncio.run(main())


def test_batch_sizes_hold_whole_chunks() -> None:
    assert batch_size(4 << 20) == 4 << 20
    assert batch_size(1 << 20) == 4 << 20
    assert batch_size(3 << 20) == 3 << 20
    assert batch_size(64 << 10) == 4 << 20
    assert batch_size(1_500_000) == 3_000_000
    assert batch_size(16 << 20) == 4 << 20  # a chunk gathered from several batches


def test_reading_ahead_stops_at_the_bound() -> None:
    async def main() -> None:
        client = Client(count=1000, piece=1000)
        batches = PayloadBatches(client.pieces(), 10_000, 3)
        try:
            await settle()
            # Three batches wait and one is being gathered when the queue is full: no more is read.
            assert 30_000 <= client.taken <= 4 * 10_000
            taken = client.taken
            await settle()
            assert client.taken == taken
            # Taking one batch lets one more in.
            assert len(await batches.next() or b"") == 10_000
            await settle()
            assert client.taken == taken + 10_000
        finally:
            await batches.close()
        assert client.closed

    asyncio.run(main())


def test_an_error_comes_after_the_batches_before_it() -> None:
    async def main() -> None:
        client = Client(count=100, piece=1000, fail_after=25)
        batches = PayloadBatches(client.pieces(), 10_000, 8)
        try:
            assert len(await batches.next() or b"") == 10_000
            assert len(await batches.next() or b"") == 10_000
            with pytest.raises(ConnectionResetError):
                await batches.next()
            assert await batches.next() is None
        finally:
            await batches.close()
        assert client.closed

    asyncio.run(main())


def test_close_mid_stream_stops_reading_and_closes_the_payload() -> None:
    async def main() -> None:
        client = Client(count=1000, piece=1000)
        batches = PayloadBatches(client.pieces(), 10_000, 2)
        assert await batches.next() is not None
        await batches.close()
        taken = client.taken
        await settle()
        assert client.closed and client.taken == taken
        assert await batches.next() is None

    asyncio.run(main())


def test_a_cancelled_consumer_stays_cancelled() -> None:
    async def main() -> None:
        client = Client(count=1000, piece=1000)
        batches = PayloadBatches(client.pieces(), 10_000, 2)

        async def consumer() -> None:
            try:
                while await batches.next() is not None:
                    await asyncio.Event().wait()  # a send that never finishes
            finally:
                await batches.close()

        task = asyncio.ensure_future(consumer())
        await settle()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert client.closed

    asyncio.run(main())
