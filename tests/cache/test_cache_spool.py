"""The spool of a streamed GET: any split of an answer into pieces gives each chunk its exact bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tsproxy.cache.spool import StoredSpool


@st.composite
def answers(draw: st.DrawFn) -> tuple[int, bytes, list[int], list[tuple[int, int]]]:
    """(start offset, answer bytes, piece sizes, ascending non-overlapping chunk spans within it)."""
    start = draw(st.integers(0, 10_000))
    size = draw(st.integers(0, 3000))
    data = draw(st.binary(min_size=size, max_size=size))
    cuts = sorted(draw(st.lists(st.integers(0, size), max_size=12)))
    pieces = [b - a for a, b in zip([0, *cuts], [*cuts, size], strict=True)]
    bounds = sorted(draw(st.lists(st.integers(0, size), max_size=10)))
    spans = [(start + bounds[i], start + bounds[i + 1]) for i in range(0, len(bounds) - 1, 2)]
    return start, data, pieces, spans


@given(answers())
def test_chunks_come_out_whole_however_the_answer_is_cut(
    case: tuple[int, bytes, list[int], list[tuple[int, int]]],
) -> None:
    start, data, pieces, spans = case
    spool = StoredSpool(start)
    pos = 0
    pending = list(spans)
    for size in pieces:
        spool.add(data[pos : pos + size])
        pos += size
        assert spool.end == start + pos
        while pending and pending[0][1] <= spool.end:
            a, b = pending.pop(0)
            assert bytes(spool.take(a, b)) == data[a - start : b - start]
            # Nothing before the taken chunk's end is held any longer.
            assert spool.held <= spool.end - b + max(pieces, default=0)
    assert not pending


def test_a_take_inside_one_piece_is_a_view_and_backwards_is_refused() -> None:
    spool = StoredSpool(100)
    piece = bytes(range(200))
    spool.add(piece)
    got = spool.take(110, 150)
    assert isinstance(got, memoryview) and bytes(got) == piece[10:50]
    with pytest.raises(ValueError):
        spool.take(120, 130)  # before the last take's end
    with pytest.raises(ValueError):
        spool.take(250, 400)  # not all received yet


def test_a_bytearray_piece_is_held_as_a_copy() -> None:
    spool = StoredSpool(0)
    piece = bytearray(b"abcdef")
    spool.add(piece)
    piece[:] = b"zzzzzz"
    assert bytes(spool.take(0, 6)) == b"abcdef"
