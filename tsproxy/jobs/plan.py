"""Planning on the driver, pure: listed keys, how they are spread over partitions, multipart leftovers.

The driver lists a bucket once; everything here works on that listing without further requests. What
multipart uploads leave behind is found by service.leftovers (shared with the server's janitor) and
re-exported here.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import TypeVar

from tsproxy.service.leftovers import (
    UPLOADS,
    Listed,
    UploadLeftover,
    find_uploads,
    internal_part,
    owned_by,
    unowned,
)
from tsproxy.service.namespace import INTERNAL

__all__ = [
    "INTERNAL",
    "OBJECT_WEIGHT",
    "PARTITION_WEIGHT",
    "UPLOADS",
    "Listed",
    "UploadLeftover",
    "default_weight",
    "find_uploads",
    "internal_part",
    "owned_by",
    "partition_count",
    "prefix_of",
    "spread",
    "unowned",
]

T = TypeVar("T")

# A fixed per-object cost, in bytes-equivalent, so that many small objects weigh as much as their
# requests cost and not only as much as their bytes.
OBJECT_WEIGHT = 1 << 20
PARTITION_WEIGHT = 2 << 30


def default_weight(item: Listed) -> int:
    """Work of an object for jobs that read it all: its bytes plus a per-request share."""
    return OBJECT_WEIGHT + item.size


def partition_count(total_weight: int, objects: int, slots: int, requested: int = 0) -> int:
    """How many partitions to cut a listing into.

    Enough for every slot to have several (stragglers even out, progress moves in small steps) and
    for no partition to weigh much more than PARTITION_WEIGHT (about 2,000 small objects, or two
    GiB of data to read); never more than there are objects. Each task costs a backend client and a
    key ring load (a tenth of a second or so), so partitions are not made smaller than that.
    """
    if objects <= 0:
        return 1
    n = requested if requested > 0 else max(4 * max(slots, 1), -(-total_weight // PARTITION_WEIGHT))
    return max(1, min(n, objects))


def spread(items: Sequence[T], partitions: int, weight: Callable[[T], int]) -> list[list[T]]:
    """Cut items, in order, into at most `partitions` non-empty contiguous runs of about equal weight.

    Listing order is kept so neighbouring keys (one topic partition's segments) stay together. An item
    goes to the run its weight's midpoint falls in; cuts are then nudged so that no run is empty.
    """
    if partitions < 1:
        raise ValueError("partitions must be at least 1")
    if not items:
        return [[]]
    n = min(partitions, len(items))
    weights = [max(0, weight(i)) for i in items]
    if not sum(weights):
        weights = [1] * len(items)
    mids = [c - w / 2 for c, w in zip(accumulate(weights), weights, strict=True)]
    total = sum(weights)
    cuts = [0]
    for r in range(1, n):
        cut = bisect.bisect_left(mids, total * r / n)
        cut = min(max(cut, cuts[-1] + 1), len(items) - (n - r))
        cuts.append(cut)
    cuts.append(len(items))
    return [list(items[a:b]) for a, b in itertools.pairwise(cuts)]


def prefix_of(key: str, depth: int) -> str:
    """The first `depth` path levels of a key, with their slash ("a/b/" of "a/b/c/d" at depth 2).

    Keys with fewer levels give everything up to their last slash ("" for a key without one).
    """
    if depth <= 0:
        return ""
    end = -1
    for _ in range(depth):
        nxt = key.find("/", end + 1)
        if nxt < 0:
            break
        end = nxt
    return key[: end + 1]
