"""Fetch planning: coverage, no overlaps, bounded sizes, and coalescing where it pays."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tsproxy.cache.plan import FetchRequest, plan_fetches

MIB = 1 << 20


@dataclass(frozen=True)
class Extent:
    stored_offset: int
    stored_len: int


def layout(sizes: list[int], start: int = 0) -> list[Extent]:
    out = []
    for size in sizes:
        out.append(Extent(start, size))
        start += size
    return out


@st.composite
def problems(draw: st.DrawFn) -> tuple[list[Extent], list[bool], int, int]:
    n = draw(st.integers(0, 60))
    sizes = draw(st.lists(st.integers(0, 5 * MIB), min_size=n, max_size=n))
    missing = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    max_gap = draw(st.sampled_from([0, 1, MIB, 4 * MIB, 64 * MIB]))
    max_request = draw(st.sampled_from([1, MIB, 4 * MIB, 16 * MIB, 32 * MIB]))
    return layout(sizes, draw(st.integers(0, 1 << 40))), missing, max_gap, max_request


@given(problems())
def test_plans_cover_exactly_the_missing_chunks_without_overlap(
    problem: tuple[list[Extent], list[bool], int, int],
) -> None:
    chunks, missing, max_gap, max_request = problem
    plan = plan_fetches(chunks, missing, max_gap_bytes=max_gap, max_request_bytes=max_request)
    planned = [p for req in plan for p in req.positions]
    assert planned == [i for i, m in enumerate(missing) if m]  # each once, in order
    for req in plan:
        assert req.positions == tuple(sorted(req.positions))
        first, last = chunks[req.positions[0]], chunks[req.positions[-1]]
        # A request starts at its first needed chunk and ends with its last: nothing wasted at the edges.
        assert req.stored_start == first.stored_offset
        assert req.stored_end == last.stored_offset + last.stored_len
        for p in req.positions:
            assert req.stored_start <= chunks[p].stored_offset
            assert chunks[p].stored_offset + chunks[p].stored_len <= req.stored_end
        # Bounded: at most max_request bytes, unless it is a single chunk larger than that.
        assert req.size <= max_request or len(req.positions) == 1
        # Bytes carried for chunks not needed stay within the gap allowance between any two neighbours.
        for a, b in zip(req.positions, req.positions[1:], strict=False):
            assert chunks[b].stored_offset - (chunks[a].stored_offset + chunks[a].stored_len) <= max_gap
    for before, after in itertools.pairwise(plan):
        assert before.stored_end <= after.stored_start  # sorted, never overlapping


@given(problems())
def test_a_run_that_fits_is_one_request(problem: tuple[list[Extent], list[bool], int, int]) -> None:
    chunks, _, _, max_request = problem
    missing = [True] * len(chunks)
    plan = plan_fetches(chunks, missing, max_gap_bytes=0, max_request_bytes=max_request)
    total = sum(c.stored_len for c in chunks)
    if chunks and total <= max_request:
        assert len(plan) == 1
    # Never more requests than chunks, and splitting is not wasteful: any two neighbouring requests
    # together would have been too large (otherwise they should have been one).
    assert len(plan) <= len(chunks)
    for before, after in itertools.pairwise(plan):
        assert after.stored_end - before.stored_start > max_request


def test_contiguous_missing_chunks_coalesce() -> None:
    chunks = layout([4 * MIB] * 8)
    plan = plan_fetches(chunks, [False, True, True, True, True, False, False, False],
                        max_gap_bytes=0, max_request_bytes=32 * MIB)  # fmt: skip
    assert plan == [FetchRequest(4 * MIB, 20 * MIB, (1, 2, 3, 4))]


def test_small_gaps_are_bridged_and_large_ones_are_not() -> None:
    chunks = layout([MIB] * 6)
    missing = [True, False, True, False, False, True]
    bridged = plan_fetches(chunks, missing, max_gap_bytes=MIB, max_request_bytes=32 * MIB)
    assert [(r.positions, r.size) for r in bridged] == [((0, 2), 3 * MIB), ((5,), MIB)]
    wide = plan_fetches(chunks, missing, max_gap_bytes=2 * MIB, max_request_bytes=32 * MIB)
    assert [(r.positions, r.size) for r in wide] == [((0, 2, 5), 6 * MIB)]
    none = plan_fetches(chunks, missing, max_gap_bytes=0, max_request_bytes=32 * MIB)
    assert [r.positions for r in none] == [(0,), (2,), (5,)]


def test_large_runs_split_into_nearly_equal_requests() -> None:
    chunks = layout([4 * MIB] * 16)  # 64 MiB
    plan = plan_fetches(chunks, [True] * 16, max_gap_bytes=0, max_request_bytes=32 * MIB)
    assert [r.size for r in plan] == [32 * MIB, 32 * MIB]
    plan = plan_fetches(chunks[:9], [True] * 9, max_gap_bytes=0, max_request_bytes=32 * MIB)
    assert sorted(r.size for r in plan) == [16 * MIB, 20 * MIB]  # not 32 + 4
    plan = plan_fetches(chunks, [True] * 16, max_gap_bytes=0, max_request_bytes=20 * MIB)
    assert [r.size for r in plan] == [16 * MIB] * 4


def test_an_oversized_chunk_is_its_own_request() -> None:
    chunks = layout([MIB, 40 * MIB, MIB])
    plan = plan_fetches(chunks, [True] * 3, max_gap_bytes=0, max_request_bytes=32 * MIB)
    assert [r.positions for r in plan] == [(0,), (1,), (2,)]


def test_nothing_missing_means_no_requests() -> None:
    assert plan_fetches(layout([MIB] * 4), [False] * 4, max_gap_bytes=MIB, max_request_bytes=MIB) == []
    assert plan_fetches([], [], max_gap_bytes=0, max_request_bytes=1) == []


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        plan_fetches(layout([1]), [], max_gap_bytes=0, max_request_bytes=1)
    with pytest.raises(ValueError):
        plan_fetches([], [], max_gap_bytes=-1, max_request_bytes=1)
    with pytest.raises(ValueError):
        plan_fetches([], [], max_gap_bytes=0, max_request_bytes=0)
