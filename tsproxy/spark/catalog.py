"""The driver's side of a read: list the segments, load the indexes planning needs, plan the pieces.

Only the key listing and small index objects are read here, never segment data. Index loads run on a
small thread pool, since a topic can have thousands of segments.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tsproxy import errors
from tsproxy.kafka.indexes import AbortedTxn, parse_offset_index, parse_time_index, parse_txn_index
from tsproxy.kafka.layout import LAYOUT_AIVEN, SegmentObject, group_segments, parse_rsm_manifest
from tsproxy.kafka.manifest import IndexRange, RsmManifest

from .bucket import Bucket
from .options import MIN_SPLIT_BYTES, Bound, ReadOptions
from .planning import (
    NEEDS_ALL,
    NEEDS_NONE,
    Indexes,
    Piece,
    PlanError,
    Segment,
    index_needs,
    order_segments,
    plan_partition,
)

log = logging.getLogger("tsproxy.spark")

INDEX_THREADS = 16


@dataclass(frozen=True)
class ListedSegment:
    """A segment object found in the listing, with its companions and its listed size."""

    obj: SegmentObject
    size: int

    @property
    def segment(self) -> Segment:
        o = self.obj
        return Segment(o.key, o.topic, o.partition, o.base_offset, self.size)


def list_segments(
    bucket: Bucket, options: ReadOptions, topics: Iterable[str] | None = None
) -> dict[tuple[str, int], list[ListedSegment]]:
    """The subscribed topics' segments, by (topic, partition); incomplete uploads left out."""
    prefix = options.store.prefix
    wanted = list(topics) if topics is not None else list(options.topics)
    # Listing each named topic's own prefix keeps the listing small in a shared bucket.
    prefixes = [f"{prefix}{t}-" for t in sorted(wanted)] if wanted and not options.topic_pattern else [prefix]
    sizes: dict[str, int] = {}
    for p in prefixes:
        sizes.update(bucket.list(p))
    found: dict[tuple[str, int], list[ListedSegment]] = defaultdict(list)
    for obj in group_segments(sizes, prefix):
        if obj.layout != options.layout or not options.wants_topic(obj.topic):
            continue
        if obj.layout == LAYOUT_AIVEN and obj.manifest_key is None:
            log.warning("skipping %s: no .rsm-manifest (an upload that did not finish)", bucket.uri(obj.key))
            continue
        found[(obj.topic, obj.partition)].append(ListedSegment(obj, sizes[obj.key]))
    return dict(found)


# Parsed .rsm-manifests by key, shared by the index and transaction-index loads of one planning run
# so that each manifest is fetched once. Each key is loaded by one job at a time.
Manifests = dict[str, RsmManifest]


def _manifest(bucket: Bucket, key: str, manifests: Manifests | None) -> RsmManifest:
    found = manifests.get(key) if manifests is not None else None
    if found is None:
        found = parse_rsm_manifest(bucket.read(key), object_name=bucket.uri(key))
        if manifests is not None:
            manifests[key] = found
    return found


def load_indexes(
    bucket: Bucket, listed: ListedSegment, need: int, manifests: Manifests | None = None
) -> Indexes:
    """The offset index (and the time index when need is NEEDS_ALL) of a segment; None where missing."""
    obj = listed.obj
    want_times = need == NEEDS_ALL
    try:
        if obj.manifest_key is not None:
            manifest = _manifest(bucket, obj.manifest_key, manifests)
            ranges = {"offset": manifest.index("offset"), "timestamp": manifest.index("timestamp")}
            if manifest.segment_indexes is not None and obj.indexes_key is not None:
                return _from_indexes_object(bucket, listed, ranges, want_times)
        offsets = _read_index(bucket, obj.offset_index_key)
        times = _read_index(bucket, obj.time_index_key) if want_times else None
    except errors.NoSuchKey:
        log.warning("%s: an index object vanished; reading the segment whole", bucket.uri(obj.key))
        return Indexes()
    name = bucket.uri(obj.key)
    return Indexes(
        offsets=None if offsets is None else parse_offset_index(offsets, obj.base_offset, object_name=name),
        times=None if times is None else parse_time_index(times, obj.base_offset, object_name=name),
    )


def load_aborted(
    bucket: Bucket, listed: ListedSegment, manifests: Manifests | None = None
) -> list[AbortedTxn]:
    """The transactions aborted in a segment, from its transaction index ([] when it has none).

    A read_committed read cannot do without them, so an index that vanished is an error here.
    """
    obj = listed.obj
    try:
        if obj.manifest_key is not None:
            manifest = _manifest(bucket, obj.manifest_key, manifests)
            if manifest.segment_indexes is not None:
                found = manifest.index("transaction")
                if found is None or found.size == 0:
                    return []
                if obj.indexes_key is None:
                    raise PlanError(f"{bucket.uri(obj.key)}: the .indexes object is missing")
                data = bucket.read(obj.indexes_key, found.position, found.position + found.size)
                return parse_txn_index(data, object_name=bucket.uri(obj.indexes_key))
        if obj.txn_index_key is None:
            return []
        return parse_txn_index(bucket.read(obj.txn_index_key), object_name=bucket.uri(obj.txn_index_key))
    except errors.NoSuchKey as exc:
        raise PlanError(
            f"{bucket.uri(obj.key)}: an index object vanished while planning, so its aborted "
            f"transactions are unknown ({exc})"
        ) from None


def aborted_transactions(
    bucket: Bucket,
    found: Mapping[tuple[str, int], list[ListedSegment]],
    starts: Mapping[tuple[str, int], Bound] | None = None,
    manifests: Manifests | None = None,
) -> dict[tuple[str, int], list[AbortedTxn]]:
    """Each partition's aborted transactions, from the transaction indexes of its segments.

    An aborted transaction is listed in the segment holding its abort marker, which is the segment of
    its first records or a later one, so only segments from the first one read on (by ``starts``, an
    offset bound per partition) are looked at.
    """
    wanted: list[tuple[tuple[str, int], ListedSegment]] = []
    for tp, listed in found.items():
        by_key = {s.obj.key: s for s in listed}
        start = (starts or {}).get(tp)
        for seg, upper in order_segments([s.segment for s in listed]):
            if start is None or not start.is_offset or upper is None or upper >= start.value:
                wanted.append((tp, by_key[seg.key]))
    result: dict[tuple[str, int], list[AbortedTxn]] = {tp: [] for tp in found}
    with ThreadPoolExecutor(INDEX_THREADS, thread_name_prefix="tsproxy-txnindex") as pool:
        loads = pool.map(lambda job: load_aborted(bucket, job[1], manifests), wanted)
        for (tp, _), txns in zip(wanted, loads, strict=True):
            result[tp] += txns
    return result


def _read_index(bucket: Bucket, key: str | None) -> bytes | None:
    return None if key is None else bucket.read(key)


def _from_indexes_object(
    bucket: Bucket, listed: ListedSegment, ranges: Mapping[str, IndexRange | None], want_times: bool
) -> Indexes:
    obj = listed.obj
    assert obj.indexes_key is not None
    off, ts = ranges["offset"], ranges["timestamp"] if want_times else None
    present = [r for r in (off, ts) if r is not None]
    if not present:
        return Indexes(offsets=None if off is None else [], times=None if ts is None else [])
    lo = min(r.position for r in present)
    hi = max(r.position + r.size for r in present)
    data = bucket.read(obj.indexes_key, lo, hi) if hi > lo else b""
    name = bucket.uri(obj.indexes_key)

    def part(r: IndexRange) -> bytes:
        return data[r.position - lo : r.position - lo + r.size]

    return Indexes(
        offsets=None if off is None else parse_offset_index(part(off), obj.base_offset, object_name=name),
        times=None if ts is None else parse_time_index(part(ts), obj.base_offset, object_name=name),
    )


def split_target(options: ReadOptions, total_bytes: int) -> int:
    """Bytes per piece: maxBytesPerPartition, smaller when minPartitions asks for more pieces."""
    target = options.max_bytes_per_partition
    if options.min_partitions:
        target = min(target, max(MIN_SPLIT_BYTES, total_bytes // options.min_partitions))
    return target


def plan_read(bucket: Bucket, options: ReadOptions) -> list[Piece]:
    """Every piece of the read, ordered by topic, partition and offset."""
    found = list_segments(bucket, options)
    for topic in options.topics:
        if not any(t == topic for t, _ in found):
            log.warning("topic %s: no tiered segments under %s", topic, bucket.uri(options.store.prefix))
    total = sum(s.size for segs in found.values() for s in segs)
    target = split_target(options, total)
    bounds: dict[tuple[str, int], tuple[Bound, Bound]] = {
        tp: (options.start.for_partition(*tp), options.end.for_partition(*tp)) for tp in found
    }
    # Which index loads planning needs, decided per segment before any is made.
    jobs: list[tuple[ListedSegment, int]] = []
    manifests: Manifests = {}
    for tp, listed in found.items():
        by_key = {s.obj.key: s for s in listed}
        start, end = bounds[tp]
        for seg, upper in order_segments([s.segment for s in listed]):
            need = index_needs(seg, upper, start, end, target)
            if need != NEEDS_NONE:
                jobs.append((by_key[seg.key], need))
    with ThreadPoolExecutor(INDEX_THREADS, thread_name_prefix="tsproxy-index") as pool:
        loaded = dict(
            zip(
                (listed.obj.key for listed, _ in jobs),
                pool.map(lambda job: load_indexes(bucket, job[0], job[1], manifests), jobs),
                strict=True,
            )
        )
    aborted = (
        aborted_transactions(bucket, found, {tp: start for tp, (start, _) in bounds.items()}, manifests)
        if options.read_committed
        else {}
    )
    pieces: list[Piece] = []
    for tp in sorted(found):
        start, end = bounds[tp]
        segments = [s.segment for s in found[tp]]
        pieces += plan_partition(segments, start, end, loaded, target, aborted.get(tp))
    return pieces
