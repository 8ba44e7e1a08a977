"""Every byte range reads back exactly, for every size, chunk size, compression and encryption setting."""

from __future__ import annotations

import itertools
import tracemalloc
from collections.abc import Callable

import pytest
from fmt_helpers import DATA_KINDS, KIB, encode_multipart, make_data
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tsproxy.format import (
    MAX_CHUNK_SIZE,
    MIN_CHUNK_SIZE,
    TRAILER_SIZE,
    ChunkDecoder,
    KeyRing,
    ObjectContext,
    SegmentEncoder,
    TransformSettings,
    decode_object,
    decode_tail,
    encode_object,
    encode_stream,
    iter_range,
    open_object,
    read_range,
    tail_length,
)
from tsproxy.format.context import TAG_SIZE

CHUNK_SIZES = (MIN_CHUNK_SIZE, MIN_CHUNK_SIZE + 7, 96 * KIB)
transform_settings = st.builds(
    TransformSettings,
    chunk_size=st.sampled_from(CHUNK_SIZES),
    compression=st.sampled_from(("off", "on", "auto")),
    level=st.sampled_from((1, 3)),
    encryption=st.booleans(),
)
slow_examples = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def sizes_around_chunks(chunk: int) -> st.SearchStrategy[int]:
    """Object sizes up to several chunks plus one, often right at a chunk boundary."""
    return st.one_of(
        st.builds(lambda k, r: k * chunk + r, st.integers(0, 3), st.integers(0, chunk)),
        st.builds(lambda k, d: max(0, k * chunk + d), st.integers(0, 4), st.integers(-1, 1)),
    )


def interesting_offsets(size: int, chunk: int) -> list[int]:
    """Object start and end and both sides of every chunk boundary."""
    points = {0, size - 1}
    for boundary in range(chunk, size, chunk):
        points |= {boundary - 1, boundary}
    return sorted(p for p in points if 0 <= p < size)


@slow_examples
@given(
    transform_settings,
    st.sampled_from(DATA_KINDS),
    st.integers(0, 2**32),
    st.data(),
)
def test_single_put_reads_back(
    ring: KeyRing, cfg: TransformSettings, kind: str, seed: int, data: st.DataObject
) -> None:
    size = data.draw(sizes_around_chunks(cfg.chunk_size), label="size")
    event(f"chunks: {-(-size // cfg.chunk_size)}")
    original = make_data(kind, size, seed)
    stored = encode_object(original, cfg, ring, content_type="text/plain", metadata={"k": "v"})
    assert decode_object(stored, ring) == original

    manifest, _ = open_object(stored, ring)
    assert manifest.size == size and manifest.md5 is not None
    overhead = TAG_SIZE if cfg.encryption else 0
    assert manifest.data_size <= size + overhead * len(manifest.index)
    assert len(stored) == manifest.data_size + tail_length(stored[-TRAILER_SIZE:])
    if size == 0:
        return
    points = interesting_offsets(size, cfg.chunk_size)
    for first in points:
        for last in points:
            if first <= last:
                assert read_range(stored, ring, first, last) == original[first : last + 1]
    for _ in range(5):
        first = data.draw(st.integers(0, size - 1))
        last = data.draw(st.integers(first, size - 1))
        assert read_range(stored, ring, first, last) == original[first : last + 1]


@slow_examples
@given(
    transform_settings,
    st.lists(
        st.tuples(st.integers(1, 10000), st.sampled_from(DATA_KINDS), sizes_around_chunks(MIN_CHUNK_SIZE)),
        min_size=1,
        max_size=4,
        unique_by=lambda p: p[0],
    ),
    st.integers(0, 2**32),
    st.data(),
)
def test_multipart_reads_back(
    ring: KeyRing,
    cfg: TransformSettings,
    parts: list[tuple[int, str, int]],
    seed: int,
    data: st.DataObject,
) -> None:
    payloads = [(no, make_data(kind, size, seed + no)) for no, kind, size in parts]
    stored, manifest = encode_multipart(payloads, cfg, ring)
    original = b"".join(p for _, p in sorted(payloads))
    assert decode_object(stored, ring) == original
    assert [s.segment_no for s in manifest.segments] == sorted(no for no, _, _ in parts)
    for _ in range(6):
        if not original:
            break
        first = data.draw(st.integers(0, len(original) - 1))
        last = data.draw(st.integers(first, len(original) - 1))
        assert read_range(stored, ring, first, last) == original[first : last + 1]
        assert (
            b"".join(iter_range(_reader(stored), len(stored), ring, first, last))
            == original[first : last + 1]
        )


def _reader(stored: bytes) -> Callable[[int, int], bytes]:
    return lambda start, end: stored[start:end]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    transform_settings,
    st.sampled_from(DATA_KINDS),
    st.integers(0, 3 * MIN_CHUNK_SIZE + 1),
    st.lists(st.integers(1, 100_000), max_size=12),
)
def test_feeding_in_any_pieces_gives_the_same_bytes(
    ring: KeyRing, cfg: TransformSettings, kind: str, size: int, cuts: list[int]
) -> None:
    original = make_data(kind, size, size)
    ctx = ObjectContext.new(cfg, ring)

    def encode(pieces: list[bytes | memoryview]) -> tuple[bytes, object]:
        enc = SegmentEncoder(ctx, cfg, 3, salt=b"01234567" if cfg.encryption else None)
        out = [c for p in pieces for c in enc.feed(p)] + enc.finish()
        return b"".join(out), enc.info

    points = sorted({min(c, size) for c in cuts} | {0, size})
    pieces: list[bytes | memoryview] = [
        memoryview(bytearray(original[a:b])) for a, b in itertools.pairwise(points)
    ]
    assert encode([original]) == encode(pieces)


def test_encoder_emits_chunks_as_data_arrives(ring: KeyRing) -> None:
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE, compression="off")
    enc = SegmentEncoder(ObjectContext.new(cfg, ring), cfg)
    assert enc.feed(bytes(MIN_CHUNK_SIZE)) == []  # held back: it may be the last chunk
    assert len(enc.feed(b"x")) == 1
    assert len(enc.feed(bytes(3 * MIN_CHUNK_SIZE))) == 3
    last = enc.finish()
    assert len(last) == 1 and len(last[0]) == 1 + TAG_SIZE
    assert enc.info.stored_sizes[-1] == 1 + TAG_SIZE
    assert enc.info.original_size == 4 * MIN_CHUNK_SIZE + 1
    with pytest.raises(RuntimeError):
        enc.feed(b"more")


def test_incompressible_chunks_are_stored_raw(ring: KeyRing) -> None:
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE, compression="on")
    original = make_data("random", 2 * MIN_CHUNK_SIZE, 1)
    stored = encode_object(original, cfg, ring)
    manifest, _ = open_object(stored, ring)
    assert manifest.segments[0].stored_sizes == (MIN_CHUNK_SIZE + TAG_SIZE,) * 2
    text = make_data("text", 2 * MIN_CHUNK_SIZE, 1)
    manifest, _ = open_object(encode_object(text, cfg, ring), ring)
    assert all(s < MIN_CHUNK_SIZE // 2 for s in manifest.segments[0].stored_sizes)


def test_unencrypted_raw_chunks_are_the_original_bytes() -> None:
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE, compression="off", encryption=False)
    original = make_data("mixed", 150_000, 5)
    stored = encode_object(original, cfg, None)
    manifest, _ = open_object(stored, None)
    assert stored[: manifest.data_size] == original


def test_chunk_decoder_reads_chunks_in_any_order(ring: KeyRing) -> None:
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE)
    original = make_data("mixed", 5 * MIN_CHUNK_SIZE + 99, 9)
    stored = encode_object(original, cfg, ring)
    manifest, ctx = decode_tail(stored[-2000:], ring)  # any suffix holding the tail will do
    decoder = ChunkDecoder(manifest, ctx)
    for i in reversed(range(len(manifest.index))):
        ref = manifest.index.chunk(i)
        piece = decoder.decode(ref, stored[ref.stored_offset : ref.stored_offset + ref.stored_len])
        assert piece == original[ref.original_offset : ref.original_offset + ref.original_len]


def test_iter_range_reads_a_few_chunks_at_a_time(ring: KeyRing) -> None:
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE)
    original = make_data("text", 20 * MIN_CHUNK_SIZE + 5, 3)
    stored = encode_object(original, cfg, ring)
    reads: list[tuple[int, int]] = []

    def read(start: int, end: int) -> bytes:
        reads.append((start, end))
        return stored[start:end]

    assert b"".join(iter_range(read, len(stored), ring)) == original
    chunk_reads = reads[2:]
    assert len(chunk_reads) == 6  # 21 chunks, four per read
    assert all(b[0] == a[1] for a, b in itertools.pairwise(chunk_reads))


def test_streaming_encode_memory_stays_within_a_few_chunks(ring: KeyRing) -> None:
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE, compression="on")
    piece = make_data("mixed", 32 * KIB, 11)
    total = 0
    tracemalloc.start()
    try:
        for out in encode_stream((piece for _ in range(512)), cfg, ring):  # 16 MiB through
            total += len(out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total > 0
    assert peak < 6 * MIN_CHUNK_SIZE, f"peak {peak} bytes while streaming 16 MiB"


def test_rsa_wrapped_objects_read_back(rsa_ring: KeyRing) -> None:
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE)
    original = make_data("text", 100_000, 2)
    stored = encode_object(original, cfg, rsa_ring)
    assert decode_object(stored, rsa_ring) == original
    manifest, _ = open_object(stored, rsa_ring)
    assert manifest.kek_id == "test-rsa" and manifest.wrapped_dek is not None
    assert len(manifest.wrapped_dek) == 384


def test_small_objects_do_not_pay_for_a_whole_chunk(ring: KeyRing) -> None:
    cfg = TransformSettings(chunk_size=MAX_CHUNK_SIZE, compression="auto")
    tracemalloc.start()
    try:
        stored = encode_object(b"a small index file" * 50, cfg, ring)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decode_object(stored, ring) == b"a small index file" * 50
    assert peak < 2 * MIN_CHUNK_SIZE, f"peak {peak} bytes for a 900-byte object"
