"""ThreadDecoders: a seek's frames spread over the transform threads only while no other decode waits."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from cache_helpers import MIB, make_object, text_data

from tsproxy.cache.decoding import ThreadDecoders, Version
from tsproxy.cache.reader import version_id
from tsproxy.format import KeyRing
from tsproxy.format.stages import ZstdStage
from tsproxy.format.zstdframes import Frame
from tsproxy.pool import PriorityPool


def recording_threads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread of each zstd frame inflated from now on, in order."""
    threads: list[int] = []
    real_inflate = ZstdStage._inflate

    def recording(self: ZstdStage, payload: bytes | memoryview, frame: Frame) -> bytes:
        threads.append(threading.get_ident())
        return real_inflate(self, payload, frame)

    monkeypatch.setattr(ZstdStage, "_inflate", recording)
    return threads


async def test_frames_stay_on_one_thread_while_other_decodes_are_in_the_pool(
    ring: KeyRing, monkeypatch: pytest.MonkeyPatch
) -> None:
    obj = make_object(text_data(8 * MIB), chunk_size=4 * MIB, compression="on", ring=ring, frame_size=MIB)
    stored_version = Version(obj.manifest, obj.ctx, version_id(obj.manifest))
    ref = obj.manifest.index.chunk(1)
    stored = bytes(obj.stored[ref.stored_offset : ref.stored_offset + ref.stored_len])
    part = (700_000, 700_000 + MIB)  # a frame and the next
    expected = obj.data[4 * MIB + part[0] : 4 * MIB + part[1]]
    with ThreadPoolExecutor(3) as pool:
        decoders = ThreadDecoders(pool)
        # Alone in the pool: the second frame goes to another thread (test_cache_reader shows they run
        # at the same time).
        threads = recording_threads(monkeypatch)
        assert bytes(await decoders.decode(stored_version, ref, stored, part)) == expected
        assert len(threads) == 2 and threads[0] != threads[1]
        # Another decode holds a thread: both frames are inflated by the seek's own thread.
        release, held_started = threading.Event(), threading.Event()
        real_decode = decoders._decode

        def held(*args: object) -> bytes:
            held_started.set()
            release.wait(30)
            return real_decode(*args)  # type: ignore[arg-type]

        monkeypatch.setattr(decoders, "_decode", held)
        whole = asyncio.ensure_future(decoders.decode(stored_version, ref, stored))
        assert await asyncio.to_thread(held_started.wait, 10)  # it holds a thread before the seek starts
        threads.clear()
        assert bytes(await decoders.decode(stored_version, ref, stored, part)) == expected
        assert len(threads) == 2 and threads[0] == threads[1]
        release.set()
        assert bytes(await whole) == obj.data[4 * MIB : 8 * MIB]
        assert decoders._jobs == 0


@pytest.mark.parametrize("threads", [2, 3])
async def test_a_seeks_frames_go_to_the_threads_in_runs_one_a_thread(
    ring: KeyRing, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    # 256 KiB frames (the default): a 1 MiB seek needs five of them, which go in as many runs as the
    # pool has threads (the longer runs first), one job a run handed on, not one job a frame.
    obj = make_object(
        text_data(8 * MIB), chunk_size=4 * MIB, compression="on", ring=ring, frame_size=256 << 10
    )
    stored_version = Version(obj.manifest, obj.ctx, version_id(obj.manifest))
    ref = obj.manifest.index.chunk(1)
    stored = bytes(obj.stored[ref.stored_offset : ref.stored_offset + ref.stored_len])
    part = (100_000, 100_000 + MIB)
    with PriorityPool(threads) as pool:
        decoders = ThreadDecoders(pool)
        handed: list[int] = []
        real_run = decoders._inflate_run

        def counting(obj: Version, ref: object, payload: bytes, run: list[object]) -> object:
            handed.append(len(run))
            return real_run(obj, ref, payload, run)  # type: ignore[arg-type]

        monkeypatch.setattr(decoders, "_inflate_run", counting)
        inflated = recording_threads(monkeypatch)
        got = await decoders.decode(stored_version, ref, stored, part)
        assert bytes(got) == obj.data[4 * MIB + part[0] : 4 * MIB + part[1]]
    assert len(inflated) == 5
    # The first run (3 frames, or 2) is inflated where the chunk was verified; the others handed on.
    assert sorted(handed, reverse=True) == ([2] if threads == 2 else [2, 1])
