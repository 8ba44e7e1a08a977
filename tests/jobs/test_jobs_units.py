"""The pure parts of the jobs: token bucket, partition planning, upload leftovers, the streaming chunk
verifier, key attribution and the inventory's mergeable figures. No Spark, no backend."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.jobs.jobhelpers import records
from tsproxy.errors import IntegrityError
from tsproxy.format import KeyRing, TransformSettings, encode_object, open_object
from tsproxy.jobs.checks import ChunkVerifier, Truncated
from tsproxy.jobs.engine import Tally
from tsproxy.jobs.inventory import InventorySummary, attribute
from tsproxy.jobs.plan import Listed, find_uploads, owned_by, partition_count, prefix_of, spread, unowned
from tsproxy.jobs.ratelimit import TokenBucket
from tsproxy.service.leftovers import plan_sweep
from tsproxy.service.uploads.ids import backend_upload_of, straight_upload_id
from tsproxy.store.base import UploadInfo

MIB, GIB = 1 << 20, 1 << 30

# -- token bucket --------------------------------------------------------------------------------------


@given(
    rate=st.floats(0.5, 1000),
    burst=st.floats(1, 50),
    gaps=st.lists(st.floats(0, 2), min_size=1, max_size=200),
)
def test_token_bucket_never_grants_more_than_burst_plus_rate_times_time(
    rate: float, burst: float, gaps: list[float]
) -> None:
    bucket = TokenBucket(rate, burst, now=0.0)
    now, grants = 0.0, []
    for gap in gaps:
        now += gap
        grants.append(now + bucket.reserve(now))
    grants.sort()
    for n, t in enumerate(grants, 1):
        assert n <= burst + rate * t + 1e-6


@given(rate=st.floats(1, 100), count=st.integers(1, 100))
def test_token_bucket_lets_requests_at_its_rate_through_without_waiting(rate: float, count: int) -> None:
    bucket = TokenBucket(rate, 1, now=0.0)
    assert all(bucket.reserve(i / rate) == 0 for i in range(count))


def test_token_bucket_queues_a_burst_in_arrival_order() -> None:
    bucket = TokenBucket(10, 2, now=0.0)
    assert [bucket.reserve(0.0) for _ in range(5)] == pytest.approx([0, 0, 0.1, 0.2, 0.3])
    with pytest.raises(ValueError):
        TokenBucket(0)


# -- planning ------------------------------------------------------------------------------------------


@given(sizes=st.lists(st.integers(0, 10**9), max_size=300), partitions=st.integers(1, 64))
def test_spread_keeps_order_and_makes_non_empty_runs(sizes: list[int], partitions: int) -> None:
    runs = spread(sizes, partitions, lambda s: s)
    assert [s for run in runs for s in run] == sizes
    if sizes:
        assert len(runs) == min(partitions, len(sizes))
        assert all(runs)


def test_spread_balances_by_weight() -> None:
    items = [100] + [1] * 100
    runs = spread(items, 2, lambda s: s)
    assert runs[0] == [100] and len(runs[1]) == 100
    equal = spread(list(range(1000)), 4, lambda s: 1)
    assert [len(r) for r in equal] == [250, 250, 250, 250]


def test_partition_count() -> None:
    assert partition_count(0, 0, 8) == 1
    assert partition_count(3 * MIB, 3, 8) == 3  # never more partitions than objects
    assert partition_count(100 * MIB, 100, 2) == 8  # several per slot
    assert partition_count(1_000_000 * MIB, 1_000_000, 2) == 489  # about 2000 small objects each
    assert partition_count(1000 * GIB, 1000, 2) == 500  # about 2 GiB of data each
    assert partition_count(100 * MIB, 100, 2, requested=5) == 5


def test_prefix_of() -> None:
    assert prefix_of("a/b/c/d", 2) == "a/b/"
    assert prefix_of("a/b/c/d", 1) == "a/"
    assert prefix_of("top", 1) == ""
    assert prefix_of("a/b", 5) == "a/"
    assert prefix_of("a/b", 0) == ""


def test_find_uploads_groups_by_upload_and_sees_staleness() -> None:
    listing = [
        Listed("root/.tsproxy/mpu/u1/state", 100, "e", 1000.0),
        Listed("root/.tsproxy/mpu/u1/00001-ab", 5000, "e", 1010.0),
        Listed("root/.tsproxy/mpu/u1/00001.info", 50, "e", 1011.0),
        Listed("root/.tsproxy/mpu/u2/00003-cd", 70, "e", 5000.0),  # parts without state
        Listed("root/.tsproxy/bucket", 0, "e", 0.0),
        Listed("root/data/x", 1, "e", 0.0),
    ]
    u1, u2 = find_uploads(listing, "root/")
    assert (u1.upload_id, u1.objects, u1.bytes, u1.newest, u1.has_state) == ("u1", 3, 5150, 1011.0, True)
    assert u1.prefix == "root/.tsproxy/mpu/u1/" and len(u1.keys) == 3
    assert not u1.stale(now=1011.0 + 59, stale_after=60) and u1.stale(now=1011.0 + 60, stale_after=60)
    assert (u2.upload_id, u2.has_state) == ("u2", False)
    assert u2.stale(now=5000.0, stale_after=3600)  # can never complete without its state


def test_a_backend_upload_named_by_a_client_upload_goes_with_it_and_only_then() -> None:
    """A straight client upload's backend upload is no leftover while the upload's state is listed,
    goes with the upload once that is idle, and is an old backend upload like any other without it."""
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    live, idle, orphaned = (straight_upload_id(t, f"backend-{t}") for t in ("live", "idle", "orphaned"))
    listing = [
        Listed(f"root/.tsproxy/mpu/{live}/state", 100, "e", t0.timestamp() + 9000),
        Listed(f"root/.tsproxy/mpu/{idle}/state", 100, "e", t0.timestamp()),
        Listed(f"root/.tsproxy/mpu/{orphaned}/00002.info", 50, "e", t0.timestamp()),  # its state is gone
    ]
    backend = [
        UploadInfo("root/seg-live", "backend-live", t0),
        UploadInfo("root/seg-idle", "backend-idle", t0),
        UploadInfo("root/seg-orphaned", "backend-orphaned", t0),
        UploadInfo("root/cut-short", "assembly", t0),
    ]
    assert backend_upload_of(live) == "backend-live" and backend_upload_of("plain-token") is None
    sweep = plan_sweep(listing, "root/", backend, t0.timestamp() + 10_000, 3600, 3600)
    assert [u.upload_id for u in sweep.uploads] == sorted([idle, orphaned])
    assert sweep.attached == {idle: backend[1]}
    assert {b.upload_id for b in sweep.backend_uploads} == {"backend-orphaned", "assembly"}
    uploads = find_uploads(listing, "root/")
    assert owned_by(backend, uploads) == {live: backend[0], idle: backend[1]}
    assert unowned(backend, uploads) == backend[2:]


# -- the streaming chunk verifier ------------------------------------------------------------------------


def _stored(data: bytes, ring: KeyRing | None, chunk: int = 1 << 16) -> tuple[bytes, Any, Any]:
    stored = encode_object(data, TransformSettings(chunk_size=chunk, encryption=ring is not None), ring)
    manifest, ctx = open_object(stored, ring)
    return stored[: manifest.data_size], manifest, ctx


def _feed(verifier: ChunkVerifier, data: bytes, cuts: list[int]) -> None:
    at = 0
    for cut in sorted(c % (len(data) + 1) for c in cuts):
        verifier.feed(data[at:cut])
        at = max(at, cut)
    verifier.feed(data[at:])
    verifier.finish()


@settings(max_examples=30, deadline=None)
@given(
    size=st.integers(0, 300_000), cuts=st.lists(st.integers(0, 10**6), max_size=12), encrypted=st.booleans()
)
def test_verifier_accepts_clean_data_fed_in_any_pieces(size: int, cuts: list[int], encrypted: bool) -> None:
    ring = KeyRing.new() if encrypted else None
    area, manifest, ctx = _stored(records(size, size), ring)
    verifier = ChunkVerifier(manifest, ctx)
    _feed(verifier, area, cuts)
    assert verifier.original_bytes == size and verifier.stored_bytes == len(area)
    assert verifier.chunks == len(manifest.index)


@pytest.mark.parametrize("encrypted", [True, False])
def test_verifier_catches_flips_truncation_and_excess(encrypted: bool) -> None:
    ring = KeyRing.new() if encrypted else None
    area, manifest, ctx = _stored(os.urandom(200_000), ring)
    flipped = bytearray(area)
    flipped[150_000] ^= 1
    with pytest.raises(IntegrityError):
        _feed(ChunkVerifier(manifest, ctx), bytes(flipped), [1000])
    with pytest.raises(Truncated):
        _feed(ChunkVerifier(manifest, ctx), area[:-1], [])
    with pytest.raises(IntegrityError):
        _feed(ChunkVerifier(manifest, ctx), area + b"x", [])


def test_verifier_checks_the_segment_md5_too() -> None:
    # Chunks that authenticate but whose segment MD5 in the manifest is wrong (an unencrypted object,
    # whose chunk CRCs match, with its manifest's MD5 replaced).
    area, manifest, ctx = _stored(records(100_000, 1), None)
    seg = manifest.segments[0]
    bad = manifest.replace(segments=(dataclasses.replace(seg, md5=hashlib.md5(b"other").digest()),), md5=None)
    with pytest.raises(IntegrityError, match="segment 1: MD5 mismatch"):
        _feed(ChunkVerifier(bad, ctx), area, [])


# -- inventory attribution and figures --------------------------------------------------------------------

TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"
SEGMENT_ID = "BBBBBBBBBBBBBBBBBBBBBw"


def test_attribute_aiven_and_logdir_keys() -> None:
    stem = f"orders-{TOPIC_ID}/3/{42:020d}-{SEGMENT_ID}"
    assert attribute(stem + ".log") == ("orders", TOPIC_ID, 3, 42, "segment")
    assert attribute(stem + ".indexes") == ("orders", TOPIC_ID, 3, 42, "index")
    assert attribute(stem + ".rsm-manifest") == ("orders", TOPIC_ID, 3, 42, "manifest")
    assert attribute("pre/" + stem + ".log", "pre/") == ("orders", TOPIC_ID, 3, 42, "segment")
    assert attribute(f"clicks-7/{9:020d}.timeindex") == ("clicks", None, 7, 9, "index")
    assert attribute("notes/readme.txt") == (None, None, None, None, "other")
    assert attribute("no-dot") == (None, None, None, None, "other")


def _row(
    key: str, stored: int, original: int, kek: str | None, modified: int, orphan: bool = False
) -> dict[str, Any]:
    topic, topic_id, partition, offset, role = attribute(key)
    return {
        "key": key,
        "prefix": prefix_of(key, 1),
        "topic": topic,
        "topic_id": topic_id,
        "partition": partition,
        "base_offset": offset,
        "role": role,
        "stored_size": stored,
        "original_size": original,
        "kek_id": kek,
        "last_modified": datetime.fromtimestamp(modified, UTC),
        "orphan": orphan,
        "status": "ok",
    }


@given(
    specs=st.lists(
        st.tuples(
            st.integers(0, 3),
            st.integers(0, 10**6),
            st.integers(0, 10**6),
            st.sampled_from(["a", "b", None]),
            st.integers(0, 10**9),
            st.booleans(),
        ),
        max_size=40,
    ),
    cut=st.integers(0, 40),
)
def test_inventory_summary_merges_like_one_pass(
    specs: list[tuple[int, int, int, str | None, int, bool]], cut: int
) -> None:
    rows = [
        _row(f"orders-{TOPIC_ID}/{p}/{off:020d}-{SEGMENT_ID}.log", s, o, kek, m)
        for p, s, o, kek, m, _ in specs
        for off in [s % 1000]
    ]
    one, left, right = InventorySummary(), InventorySummary(), InventorySummary()
    for r in rows:
        one.add(r)
    for r in rows[:cut]:
        left.add(r)
    for r in rows[cut:]:
        right.add(r)
    left.merge(right)
    assert left == one
    assert one.total.stored_bytes == sum(r["stored_size"] for r in rows)
    for (_, _, partition), group in one.partitions.items():
        mine = [r for r in rows if r["partition"] == partition]
        assert group.objects == group.segments == len(mine)
        assert group.oldest_offset == min(r["base_offset"] for r in mine)
        assert group.newest_segment == max(r["last_modified"] for r in mine)


def test_tally_keeps_counts_bytes_and_a_few_examples() -> None:
    a, b = Tally(frozenset({"bad"}), max_examples=2), Tally(frozenset({"bad"}), max_examples=2)
    for i in range(3):
        a.add({"status": "bad", "size": i, "key": f"a{i}"})
        b.add({"status": "ok", "size": 10})
    a.merge(b)
    assert a.counts == {"bad": 3, "ok": 3} and a.bytes == {"bad": 3, "ok": 30}
    assert [e["key"] for e in a.examples] == ["a0", "a1"] and a.problem_count == 3 and a.total == 6


def test_progress_line_says_how_far_the_job_is() -> None:
    import io

    from tsproxy.jobs.engine import Progress

    out = io.StringIO()
    progress = Progress("verify", objects=100, nbytes=200 << 20, out=out)
    line = progress.line(3, 8, 40, 80 << 20)
    assert line.startswith("[verify] 3/8 partitions, 40/100 objects, 80.0/200.0 MiB, ")
    assert "s left" in line
    progress.stop(final=(8, 8, 100, 200 << 20))
    assert (
        out.getvalue().startswith("[verify] 8/8 partitions, 100/100 objects") and "left" not in out.getvalue()
    )
