"""PrefetchPolicy: forward detection, window scheduling, limits, the bounded table and the counts."""

from __future__ import annotations

import pytest

from tsproxy.cache.prefetch import PrefetchPolicy

MIB = 1 << 20
A = b"a" * 16
B = b"b" * 16


def test_a_first_read_is_not_sequential_and_a_continuation_is() -> None:
    p = PrefetchPolicy(16 * MIB)
    s = p.begin(A, 0)
    assert not s.sequential
    p.consumed(A, s, 0, MIB)
    s2 = p.begin(A, MIB)  # starts where the last one stopped
    assert s2 is s and s.sequential


@pytest.mark.parametrize(
    ("first", "sequential"),
    [
        (MIB // 2, True),  # re-reads part of what was consumed (Kafka restarts at the next batch)
        (MIB + 3 * MIB, True),  # skips a little
        (MIB + 5 * MIB, False),  # jumps too far
        (0, False),  # the same start again
    ],
)
def test_forward_slack(first: int, sequential: bool) -> None:
    p = PrefetchPolicy(16 * MIB, forward_slack=4 * MIB)
    s = p.begin(A, 0)
    p.consumed(A, s, 0, MIB)
    assert p.begin(A, first).sequential is sequential


@pytest.mark.parametrize(
    ("first", "sequential"),
    [
        (MIB // 2, True),  # a Kafka fetch: from a batch at or before where the last one ended
        (MIB, True),  # a plugin's next chunk read
        (MIB + 32 * 1024, True),  # a little past
        (MIB + 3 * MIB, False),  # past a read that ended where it meant to: a seek, not a continuation
    ],
)
def test_after_a_read_served_whole_the_next_must_start_about_where_it_ended(
    first: int, sequential: bool
) -> None:
    p = PrefetchPolicy(16 * MIB, forward_slack=4 * MIB, finished_slack=64 * 1024)
    s = p.begin(A, 0)
    p.consumed(A, s, 0, MIB)
    p.finished(s)
    assert p.begin(A, first).sequential is sequential


def test_a_continuation_is_no_longer_finished() -> None:
    p = PrefetchPolicy(16 * MIB, forward_slack=4 * MIB, finished_slack=0)
    s = p.begin(A, 0)
    p.consumed(A, s, 0, MIB)
    p.finished(s)
    assert p.begin(A, MIB) is s and not s.finished  # its read is under way: cut short until it ends
    assert p.begin(A, 3 * MIB).sequential  # a read after one cut short gets the forward slack


def test_objects_are_tracked_apart() -> None:
    p = PrefetchPolicy(16 * MIB)
    s = p.begin(A, 0)
    p.consumed(A, s, 0, MIB)
    assert not p.begin(B, MIB).sequential


def test_several_streams_per_object() -> None:
    p = PrefetchPolicy(16 * MIB, max_streams=2)
    low, high = p.begin(A, 0), p.begin(A, 100 * MIB)
    p.consumed(A, low, 0, MIB)
    p.consumed(A, high, 25, 101 * MIB)
    assert p.begin(A, MIB) is low and low.sequential
    assert p.begin(A, 101 * MIB) is high and high.sequential
    p.begin(A, 500 * MIB)  # a third stream pushes out the least recently used (low)
    assert not p.begin(A, MIB + 1).sequential


def test_windows_go_out_whole_keeping_one_to_two_windows_ahead() -> None:
    p = PrefetchPolicy(16 * MIB)
    s = p.begin(A, 0)
    assert p.want(s, 0, 1000 * MIB) == (0, 16 * MIB)
    p.scheduled(s, 16 * MIB)
    # Nothing more while a whole window lies ahead of the reader ...
    assert p.want(s, 0, 1000 * MIB) is None
    # ... then the whole next window after the frontier, before the reader can catch up with it.
    assert p.want(s, 1, 1000 * MIB) == (16 * MIB, 32 * MIB)
    p.scheduled(s, 32 * MIB)
    assert p.want(s, 16 * MIB, 1000 * MIB) is None
    assert p.want(s, 16 * MIB + 1, 1000 * MIB) == (32 * MIB, 48 * MIB)


def test_never_past_the_limit() -> None:
    p = PrefetchPolicy(16 * MIB)
    s = p.begin(A, 0)
    assert p.want(s, 0, 10 * MIB) == (0, 10 * MIB)
    p.scheduled(s, 10 * MIB)
    assert p.want(s, 9 * MIB, 10 * MIB) is None


def test_a_reader_ahead_of_the_frontier_moves_it() -> None:
    p = PrefetchPolicy(16 * MIB)
    s = p.begin(A, 0)
    p.scheduled(s, 4 * MIB)
    assert p.want(s, 50 * MIB, 1000 * MIB) == (50 * MIB, 66 * MIB)


def test_zero_window_disables_prefetch() -> None:
    p = PrefetchPolicy(0)
    s = p.begin(A, 0)
    assert p.want(s, 0, 1000 * MIB) is None


def test_issued_used_wasted() -> None:
    counts: list[tuple[str, int]] = []
    p = PrefetchPolicy(16 * MIB, on_count=lambda state, n: counts.append((state, n)))
    s = p.begin(A, 0)
    p.issued_ahead(A, [1, 2, 3])
    p.issued_ahead(A, [3])  # already counted
    p.consumed(A, s, 1, 8 * MIB)
    p.consumed(A, s, 1, 8 * MIB)  # a second read of the same chunk is not a second use
    p.consumed(A, s, 0, 4 * MIB)  # never prefetched
    assert (p.issued, p.used, p.wasted) == (3, 1, 0)
    p.forget(A)
    assert (p.issued, p.used, p.wasted) == (3, 1, 2)
    assert counts == [("issued", 3), ("used", 1), ("wasted", 2)]


def test_table_is_bounded_and_drops_the_least_recently_used() -> None:
    p = PrefetchPolicy(16 * MIB, max_objects=3)
    ids = [bytes([i]) * 16 for i in range(5)]
    for oid in ids[:3]:
        p.begin(oid, 0)
        p.issued_ahead(oid, [0])
    p.begin(ids[0], 0)  # ids[0] is now the most recently used
    p.begin(ids[3], 0)
    p.begin(ids[4], 0)
    assert len(p) == 3
    assert p.wasted == 2  # ids[1] and ids[2] went, each with one unread chunk
    s = p.begin(ids[0], 0)
    p.consumed(ids[0], s, 0, MIB)
    assert p.used == 1  # ids[0] survived with its bookkeeping


def test_clear_counts_everything_unread_as_wasted() -> None:
    p = PrefetchPolicy(16 * MIB)
    p.begin(A, 0)
    p.issued_ahead(A, range(4))
    p.begin(B, 0)
    p.issued_ahead(B, range(2))
    p.clear()
    assert (len(p), p.wasted) == (0, 6)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        PrefetchPolicy(16 * MIB, max_objects=0)
