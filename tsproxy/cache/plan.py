"""Fetch planning: which backend ranged GETs bring in a set of missing chunks. Pure, no I/O.

Backend requests cost far more than bytes (a round trip, a request charge, a slot in the connection
pool), so missing chunks that lie next to each other in the stored object are fetched with one GET, and
a short stretch of chunks that are not needed (cached, or already on the way) is downloaded and thrown
away when that is cheaper than a second request: `max_gap_bytes` says how many bytes a request may
carry that way. A run too large for one request is cut into the fewest requests of at most
`max_request_bytes`, sized as evenly as chunk boundaries allow, which also lets them run in parallel; only
a single chunk larger than that limit makes a request of its own beyond it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class StoredExtent(Protocol):
    """Where a chunk lies in the stored object (ChunkRef provides it)."""

    @property
    def stored_offset(self) -> int: ...
    @property
    def stored_len(self) -> int: ...


@dataclass(frozen=True)
class FetchRequest:
    """One ranged GET: stored bytes stored_start..stored_end (exclusive) and the needed chunks within."""

    stored_start: int
    stored_end: int
    positions: tuple[int, ...]  # indexes into the planned sequence of chunks, ascending

    @property
    def size(self) -> int:
        """Bytes the request downloads."""
        return self.stored_end - self.stored_start


def plan_fetches(
    chunks: Sequence[StoredExtent],
    missing: Sequence[bool],
    *,
    max_gap_bytes: int,
    max_request_bytes: int,
) -> list[FetchRequest]:
    """Ranged GETs covering exactly the chunks flagged missing, in stored order, never overlapping.

    `chunks` must be in ascending stored order without overlaps (as a chunk index yields them).
    """
    if len(chunks) != len(missing):
        raise ValueError("one missing flag per chunk")
    if max_gap_bytes < 0 or max_request_bytes <= 0:
        raise ValueError("max_gap_bytes must be >= 0 and max_request_bytes > 0")
    requests: list[FetchRequest] = []
    for run in _runs(chunks, missing, max_gap_bytes):
        requests.extend(_split(chunks, run, max_request_bytes))
    return requests


def _end(c: StoredExtent) -> int:
    return c.stored_offset + c.stored_len


def _runs(chunks: Sequence[StoredExtent], missing: Sequence[bool], max_gap: int) -> list[list[int]]:
    """Missing chunk positions grouped so that the bytes between neighbours never exceed max_gap."""
    runs: list[list[int]] = []
    for i, wanted in enumerate(missing):
        if not wanted:
            continue
        if runs:
            gap = chunks[i].stored_offset - _end(chunks[runs[-1][-1]])
            if 0 <= gap <= max_gap:
                runs[-1].append(i)
                continue
        runs.append([i])
    return runs


def _split(chunks: Sequence[StoredExtent], run: list[int], max_size: int) -> list[FetchRequest]:
    """Cut one run into the fewest requests of at most max_size bytes, as even as chunk boundaries allow."""
    pieces = _greedy(chunks, run, max_size)  # greedy cutting gives the fewest pieces
    if len(pieces) > 1:
        # The smallest cap that still needs no more pieces spreads the bytes evenly over them.
        lo, hi = 1, max_size
        while lo < hi:
            mid = (lo + hi) // 2
            if len(_greedy(chunks, run, mid)) <= len(pieces):
                hi = mid
            else:
                lo = mid + 1
        pieces = _greedy(chunks, run, lo)
    return [
        FetchRequest(chunks[run[a]].stored_offset, _end(chunks[run[b]]), tuple(run[a : b + 1]))
        for a, b in pieces
    ]


def _greedy(chunks: Sequence[StoredExtent], run: list[int], cap: int) -> list[tuple[int, int]]:
    """(first, last) positions in run of pieces filled up to cap bytes; a chunk over cap goes alone."""
    pieces: list[tuple[int, int]] = []
    pos = 0
    while pos < len(run):
        start = chunks[run[pos]].stored_offset
        last = pos
        while last + 1 < len(run) and _end(chunks[run[last + 1]]) - start <= cap:
            last += 1
        pieces.append((pos, last))
        pos = last + 1
    return pieces
