"""How many backend requests a client request costs, counted by tsproxy's own backend-request metrics.

A cold ranged GET must reach its first byte in at most two backend requests: one suffix GET that gives
the object's size, ETag, metadata and tail, then the chunk. Each case runs over a real SeaweedFS and a
fresh tsproxy instance (empty chunk cache, no prefetch, metadata never cached), so every figure here is
what a cold read costs.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import start_proxy
from tests.server.harness import RunningProxy
from tsproxy.service.reads import ReadOps


def _requests(proxy: RunningProxy) -> dict[str, float]:
    """tsproxy_backend_requests_total now, by operation."""
    counts: dict[str, float] = {}
    for metric in proxy.proxy.metrics.registry.collect():
        if metric.name != "tsproxy_backend_requests":
            continue
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                op = sample.labels["operation"]
                counts[op] = counts.get(op, 0.0) + sample.value
    return counts


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    return {op: int(n - before.get(op, 0.0)) for op, n in after.items() if n - before.get(op, 0.0)}


def _settled(proxy: RunningProxy, before: dict[str, float], want: dict[str, int]) -> dict[str, int]:
    """The requests made since `before`, once they equal `want` or after 10 s.

    A streamed backend read is counted when its reader closes, which can be just after the client has
    the whole body: wait for the count rather than race it (a count above `want` never comes down).
    """
    deadline = time.monotonic() + 10
    while True:
        got = _delta(before, _requests(proxy))
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


@pytest.fixture
def cold(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningProxy]:
    running = start_proxy("seaweed", tmp_path, request, prefetch="0", memory_cache_size="0")
    yield running
    running.stop()


def test_cold_ranged_get_takes_two_backend_requests(cold: RunningProxy) -> None:
    s3 = cold.client()
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    data = os.urandom(3 << 20)  # twelve 256 KiB chunks, streamed: no tail length in its metadata
    s3.put_object(Bucket=bucket, Key="seg.log", Body=data)
    before = _requests(cold)
    got = s3.get_object(Bucket=bucket, Key="seg.log", Range="bytes=1000000-1001023")["Body"].read()
    assert got == data[1_000_000:1_001_024]
    assert _settled(cold, before, {"GetObject": 2}) == {"GetObject": 2}


def test_a_tail_longer_than_the_guess_takes_one_more_read(cold: RunningProxy) -> None:
    s3 = cold.client()
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    data = os.urandom(3 << 20)
    s3.put_object(Bucket=bucket, Key="seg.log", Body=data, Metadata={"origin": "x" * 200})
    service = cold.proxy.service
    assert isinstance(service, ReadOps)
    service.tail_guess = 64  # shorter than this object's tail, longer than its trailer
    before = _requests(cold)
    got = s3.get_object(Bucket=bucket, Key="seg.log", Range="bytes=-5")
    assert got["Body"].read() == data[-5:]
    assert got["Metadata"] == {"origin": "x" * 200}
    assert _settled(cold, before, {"GetObject": 3}) == {"GetObject": 3}


def test_passthrough_and_empty_objects_resolve_in_one_request(cold: RunningProxy, seaweed: object) -> None:
    direct = seaweed.boto3_client()  # type: ignore[attr-defined]
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    direct.create_bucket(Bucket=bucket)
    data = os.urandom(200_000)
    direct.put_object(Bucket=bucket, Key="old.log", Body=data, Metadata={"origin": "before"})
    direct.put_object(Bucket=bucket, Key="empty", Body=b"")
    s3 = cold.client()

    before = _requests(cold)
    head = s3.head_object(Bucket=bucket, Key="old.log")
    assert head["ContentLength"] == len(data) and head["Metadata"] == {"origin": "before"}
    assert _settled(cold, before, {"GetObject": 1}) == {"GetObject": 1}

    before = _requests(cold)
    got = s3.get_object(Bucket=bucket, Key="old.log", Range="bytes=150000-150099")["Body"].read()
    assert got == data[150_000:150_100]
    assert _settled(cold, before, {"GetObject": 2}) == {"GetObject": 2}

    # An empty object has no suffix to serve: a HEAD says what it is.
    assert s3.get_object(Bucket=bucket, Key="empty")["Body"].read() == b""
    assert s3.head_object(Bucket=bucket, Key="empty")["ContentLength"] == 0
    s3.put_object(Bucket=bucket, Key="empty-too", Body=b"")
    assert s3.get_object(Bucket=bucket, Key="empty-too")["Body"].read() == b""


def test_missing_keys_and_buckets_keep_their_errors(cold: RunningProxy) -> None:
    s3 = cold.client()
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket=bucket, Key="nothing", Range="bytes=0-9")
    with pytest.raises(s3.exceptions.NoSuchBucket):
        s3.get_object(Bucket=f"{bucket}-gone", Key="nothing")
