"""The chunk index: size-list codec and original-to-stored range mapping."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from fmt_helpers import aiven_codec_length
from hypothesis import given, settings
from hypothesis import strategies as st

from tsproxy.errors import IntegrityError, InvalidRange
from tsproxy.format.index import MAX_STORED_CHUNK, ChunkIndex, decode_sizes, encode_sizes
from tsproxy.format.wire import Reader

stored_size = st.integers(0, MAX_STORED_CHUNK - 1)


def roundtrip(sizes: list[int]) -> tuple[int, ...]:
    r = Reader(encode_sizes(sizes))
    out = decode_sizes(r, len(sizes) + 10)
    r.end()
    return out


@given(st.lists(stored_size, max_size=300))
def test_sizes_roundtrip(sizes: list[int]) -> None:
    assert roundtrip(sizes) == tuple(sizes)


@given(st.integers(1, 1 << 26), st.integers(0, 5000), st.lists(st.integers(0, 4000), max_size=300))
def test_sizes_roundtrip_near_a_base(base: int, last: int, offsets: list[int]) -> None:
    sizes = [base + o for o in offsets] + [last]
    assert roundtrip(sizes) == tuple(sizes)


@given(st.lists(stored_size, max_size=300))
def test_never_larger_than_base_plus_min_bytes(sizes: list[int]) -> None:
    assert len(encode_sizes(sizes)) <= aiven_codec_length(sizes)


@given(st.integers(2, 3000), st.integers(1 << 16, 1 << 26), st.integers(1, 1 << 26))
def test_equal_sizes_cost_no_bits_per_chunk(count: int, size: int, last: int) -> None:
    # Without compression all stored chunks but the last have one size: a few bytes, however many chunks.
    encoded = encode_sizes([size] * (count - 1) + [last])
    assert len(encoded) <= 13
    assert len(encoded) < aiven_codec_length([size] * (count - 1) + [last])


def test_compressed_sizes_are_compact() -> None:
    # 1000 chunks whose sizes spread over 300 bytes: 9 bits each, against 2 bytes each in the reference codec.
    sizes = [1_000_000 + (i * 7919) % 300 for i in range(1000)] + [1234]
    encoded = encode_sizes(sizes)
    assert len(encoded) == 2 + 3 + 1 + (1000 * 9 + 7) // 8 + 2
    assert aiven_codec_length(sizes) - len(encoded) > 800


def test_truncated_size_list_is_an_integrity_error() -> None:
    encoded = encode_sizes([70000, 70100, 70200, 5])
    for cut in range(len(encoded)):
        with pytest.raises(IntegrityError):
            decode_sizes(Reader(encoded[:cut]), 100)


def test_hostile_count_is_refused_before_allocating() -> None:
    with pytest.raises(IntegrityError):
        decode_sizes(Reader(b"\xff\xff\xff\xff\x0f" + b"\x00" * 10), 10)


@dataclass(frozen=True)
class Seg:
    segment_no: int
    original_size: int
    stored_sizes: tuple[int, ...]


@st.composite
def indexes(draw: st.DrawFn) -> ChunkIndex:
    chunk_size = draw(st.integers(1, 9))
    count = draw(st.integers(1, 6))
    numbers = sorted(draw(st.sets(st.integers(1, 10000), min_size=count, max_size=count)))
    segs = []
    for no in numbers:
        size = draw(st.integers(0, 40))
        chunks = -(-size // chunk_size)
        stored = tuple(draw(st.lists(st.integers(1, 30), min_size=chunks, max_size=chunks)))
        segs.append(Seg(no, size, stored))
    return ChunkIndex(chunk_size, segs)


@given(indexes())
def test_chunks_tile_the_object(index: ChunkIndex) -> None:
    original = stored = 0
    for i in range(len(index)):
        ref = index.chunk(i)
        assert ref.original_offset == original and ref.stored_offset == stored
        assert 1 <= ref.original_len <= index.chunk_size
        original += ref.original_len
        stored += ref.stored_len
        for off in range(ref.original_offset, ref.original_offset + ref.original_len):
            assert index.chunk_at(off) == i
    assert original == index.size and stored == index.stored_size


@given(indexes(), st.data())
@settings(max_examples=200)
def test_span_covers_exactly_the_range(index: ChunkIndex, data: st.DataObject) -> None:
    if index.size == 0:
        with pytest.raises(InvalidRange):
            index.span(0, 0)
        return
    first = data.draw(st.integers(0, index.size - 1))
    last = data.draw(st.integers(first, index.size - 1))
    span = index.span(first, last)
    refs = span.chunks
    assert refs[0].original_offset <= first < refs[0].original_offset + refs[0].original_len
    assert refs[-1].original_offset <= last < refs[-1].original_offset + refs[-1].original_len
    assert span.stored_start == refs[0].stored_offset
    assert span.stored_end == refs[-1].stored_offset + refs[-1].stored_len
    for a, b in itertools.pairwise(refs):
        assert b.original_offset == a.original_offset + a.original_len
        assert b.stored_offset == a.stored_offset + a.stored_len
    # last flags and chunk numbers agree with the segment layout
    for ref in refs:
        seg_chunks = [
            index.chunk(i) for i in range(len(index)) if index.chunk(i).segment_no == ref.segment_no
        ]
        assert ref.last == (ref.chunk_no == len(seg_chunks) - 1)


def test_span_rejects_ranges_outside_the_object() -> None:
    index = ChunkIndex(10, [Seg(1, 25, (10, 10, 5))])
    for first, last in ((0, 25), (-1, 3), (5, 4), (25, 25)):
        with pytest.raises(InvalidRange):
            index.span(first, last)
    with pytest.raises(IndexError):
        index.chunk(3)
    with pytest.raises(IndexError):
        index.chunk_at(25)


def test_empty_segments_between_others() -> None:
    index = ChunkIndex(4, [Seg(1, 5, (4, 1)), Seg(2, 0, ()), Seg(7, 3, (3,))])
    assert len(index) == 3
    ref = index.chunk(2)
    assert (ref.segment_no, ref.chunk_no, ref.last, ref.original_offset, ref.stored_offset) == (
        7,
        0,
        True,
        5,
        5,
    )
    assert index.span(4, 5).chunks == (index.chunk(1), index.chunk(2))
