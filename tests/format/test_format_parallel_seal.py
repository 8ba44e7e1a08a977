"""A segment sealed in stages (cut in order, sealed on several threads in any order, recorded in order)
is stored byte for byte as one fed from one thread, and knows the MD5 of what it stored."""

from __future__ import annotations

import hashlib
import itertools
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from fmt_helpers import DATA_KINDS, make_data
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tsproxy.format import (
    MIN_CHUNK_SIZE,
    ChunkCut,
    KeyRing,
    ObjectContext,
    SegmentEncoder,
    SegmentInfo,
    TransformSettings,
)

SALT = b"01234567"
transform_settings = st.builds(
    TransformSettings,
    chunk_size=st.sampled_from((MIN_CHUNK_SIZE, MIN_CHUNK_SIZE + 7, 96 * 1024)),
    compression=st.sampled_from(("off", "on", "auto")),
    level=st.just(1),
    encryption=st.booleans(),
)


def fed(ctx: ObjectContext, cfg: TransformSettings, data: bytes) -> tuple[list[bytes], SegmentInfo]:
    enc = SegmentEncoder(ctx, cfg, 2, salt=SALT if cfg.encryption else None, object_start=False)
    out = enc.feed(data) + enc.finish()
    return out, enc.info


def staged(
    ctx: ObjectContext,
    cfg: TransformSettings,
    batches: list[bytes],
    pool: ThreadPoolExecutor,
    shuffle: random.Random,
) -> tuple[list[bytes], SegmentInfo]:
    """Cut batch by batch, every chunk sealed on the pool, the chunks of a batch submitted in a shuffled
    order (so later chunks often finish first), recorded in chunk order."""
    stored_md5 = hashlib.md5()
    enc = SegmentEncoder(
        ctx, cfg, 2, salt=SALT if cfg.encryption else None, object_start=False, stored_md5=stored_md5
    )
    cuts: list[ChunkCut] = []
    for batch in batches:
        cuts += enc.cut(batch)
    cuts += enc.cut_last()
    order = list(cuts)
    shuffle.shuffle(order)
    futures = {cut.chunk_no: pool.submit(enc.seal, cut) for cut in order}
    out = []
    for cut in cuts:
        out.append(futures[cut.chunk_no].result())
        enc.record(cut.chunk_no, out[-1])
    return out, enc.conclude()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    transform_settings,
    st.sampled_from(DATA_KINDS),
    st.integers(0, 4 * MIN_CHUNK_SIZE + 3),
    st.lists(st.integers(1, 200_000), max_size=10),
    st.integers(0, 2**16),
)
def test_staged_sealing_stores_the_same_bytes_as_feeding(
    ring: KeyRing, cfg: TransformSettings, kind: str, size: int, cuts: list[int], seed: int
) -> None:
    original = make_data(kind, size, seed)
    ctx = ObjectContext.new(cfg, ring)
    points = sorted({min(c, size) for c in cuts} | {0, size})
    batches = [original[a:b] for a, b in itertools.pairwise(points)]
    with ThreadPoolExecutor(3) as pool:
        got, info = staged(ctx, cfg, batches, pool, random.Random(seed))
    want, want_info = fed(ctx, cfg, original)
    assert got == want
    assert info == want_info  # sizes, CRC32Cs, MD5, compression decision
    assert info.stored_md5 == hashlib.md5(b"".join(got)).digest()
    assert want_info.stored_md5 is None  # nobody asked the fed encoder


def test_chunks_of_aligned_batches_are_views_of_them(ring: KeyRing) -> None:
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE)
    enc = SegmentEncoder(ObjectContext.new(cfg, ring), cfg)
    first, second = make_data("text", 2 * MIN_CHUNK_SIZE, 1), make_data("text", MIN_CHUNK_SIZE, 2)
    cuts = enc.cut(first)
    assert [c.chunk_no for c in cuts] == [0] and cuts[0].data.obj is first  # the second is held back
    cuts = enc.cut(second)
    assert [(c.chunk_no, c.last) for c in cuts] == [(1, False)] and cuts[0].data.obj is first
    short = make_data("text", MIN_CHUNK_SIZE // 3, 3)  # the payload's end: a short last chunk, not copied
    cuts = enc.cut(short)
    assert [(c.chunk_no, c.last) for c in cuts] == [(2, False)] and cuts[0].data.obj is second
    last = enc.cut_last()
    assert [(c.chunk_no, c.last) for c in last] == [(3, True)] and last[0].data.obj is short


def test_a_chunk_across_batches_keeps_a_buffer_of_its_own(ring: KeyRing) -> None:
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE)
    enc = SegmentEncoder(ObjectContext.new(cfg, ring), cfg)
    data = make_data("random", 3 * MIN_CHUNK_SIZE, 3)
    cuts = [c for i in range(0, len(data), 1000) for c in enc.cut(data[i : i + 1000])] + enc.cut_last()
    assert [bytes(c.data) for c in cuts] == [
        data[i : i + MIN_CHUNK_SIZE] for i in range(0, len(data), MIN_CHUNK_SIZE)
    ]
    assert len({id(c.data.obj) for c in cuts}) == 3


def test_staged_use_is_checked(ring: KeyRing) -> None:
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE)
    ctx = ObjectContext.new(cfg, ring)
    enc = SegmentEncoder(ctx, cfg)
    with pytest.raises(TypeError):
        enc.cut(bytearray(10))  # type: ignore[arg-type]
    cuts = enc.cut(bytes(3 * MIN_CHUNK_SIZE)) + enc.cut_last()
    assert len(cuts) == 3
    with pytest.raises(RuntimeError, match="conclude"):
        enc.conclude()
    with pytest.raises(RuntimeError, match="out of order"):
        enc.record(1, enc.seal(cuts[1]))
    with pytest.raises(RuntimeError, match="ended"):
        enc.cut(b"more")
    for cut in cuts:
        enc.record(cut.chunk_no, enc.seal(cut))
    assert enc.conclude().original_size == 3 * MIN_CHUNK_SIZE
    mixed = SegmentEncoder(ctx, cfg)
    mixed.feed(b"x")
    with pytest.raises(RuntimeError, match="not both"):
        mixed.cut(b"y")


def test_one_zstd_context_per_concurrent_sealing(ring: KeyRing) -> None:
    """Chunks sealed at once never share a zstd context (not thread-safe), and contexts are reused."""
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE, compression="on")
    enc = SegmentEncoder(ObjectContext.new(cfg, ring), cfg)
    data = make_data("text", 40 * MIN_CHUNK_SIZE, 4)
    cuts = enc.cut(data) + enc.cut_last()
    barrier = threading.Barrier(4)

    def seal(cut: ChunkCut) -> bytes:
        if cut.chunk_no < 4:
            barrier.wait(5)  # four sealings start together
        return enc.seal(cut)

    with ThreadPoolExecutor(4) as pool:
        stored = list(pool.map(seal, cuts))
    codecs = enc._chain._codecs
    assert 1 <= len(codecs) <= 4 and len({id(c) for c in codecs}) == len(codecs)
    for cut, out in zip(cuts, stored, strict=True):
        enc.record(cut.chunk_no, out)
    info = enc.conclude()
    assert info.stored_sizes == tuple(len(s) for s in stored) and all(
        s < MIN_CHUNK_SIZE for s in info.stored_sizes
    )
