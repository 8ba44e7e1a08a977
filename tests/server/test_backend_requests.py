"""How many backend requests a client request costs, counted by tsproxy's own backend-request metrics.

A cold ranged GET must reach its first byte in at most two backend requests: one suffix GET that gives
the object's size, ETag, metadata and tail, then the chunk. Each case runs over a real SeaweedFS and a
fresh tsproxy instance (empty chunk cache, no prefetch, metadata never cached), so every figure here is
what a cold read costs.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import start_proxy
from tests.server.harness import RunningProxy
from tsproxy.store.base import list_everything


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


READS = ("GetObject", "HeadObject")


def _settled(proxy: RunningProxy, before: dict[str, float], want: dict[str, int]) -> dict[str, int]:
    """The object reads (GETs and HEADs) made since `before`, once they equal `want` or after 10 s.

    Only reads: a first HEAD in a bucket also starts loading the bucket's size catalog (a LIST) in the
    background, which is not part of what the client's request cost.

    A streamed backend read is counted when its reader closes, which can be just after the client has
    the whole body: wait for the count rather than race it (a count above `want` never comes down).
    """
    deadline = time.monotonic() + 10
    while True:
        got = {op: n for op, n in _delta(before, _requests(proxy)).items() if op in READS}
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


@pytest.fixture
def cold(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningProxy]:
    # No janitor: its sweep at start would add requests to the counts taken here.
    running = start_proxy(
        "seaweed", tmp_path, request, prefetch="0", memory_cache_size="0", janitor_interval="0"
    )
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
    service.reads.tail_guess = 64  # shorter than this object's tail, longer than its trailer
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


# -- multipart uploads -------------------------------------------------------------------------------

MIB = 1 << 20


def _upload(s3: object, bucket: str, key: str, parts: list[tuple[int, bytes]]) -> tuple[str, list[dict]]:
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]  # type: ignore[attr-defined]
    done = []
    for no, body in parts:
        etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=no, Body=body)["ETag"]  # type: ignore[attr-defined]
        done.append({"PartNumber": no, "ETag": etag})
    return uid, done


def _complete(s3: object, bucket: str, key: str, uid: str, parts: list[dict]) -> None:
    s3.complete_multipart_upload(  # type: ignore[attr-defined]
        Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": parts}
    )


def upload_objects(proxy: RunningProxy, bucket: str, upload_id: str) -> set[str]:
    """The names of the objects the upload has in the backend now (`state`, `00001.info`, ...)."""
    service = proxy.proxy.objects
    prefix = service.layout.upload(bucket, upload_id)
    listed = proxy.call(list_everything(service.backend, prefix.bucket, prefix.key))
    return {o.key[len(prefix.key) :] for o in listed}


def _upload_costs(proxy: RunningProxy, bodies: list[bytes]) -> dict[str, int]:
    """The backend requests of one in-order upload of `bodies` and its Complete, checked by reading back."""
    s3 = proxy.client()
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    before = _requests(proxy)
    uid, parts = _upload(s3, bucket, "seg.log", list(enumerate(bodies, 1)))
    _complete(s3, bucket, "seg.log", uid, parts)
    spent = _delta(before, _requests(proxy))
    assert s3.get_object(Bucket=bucket, Key="seg.log")["Body"].read() == b"".join(bodies)
    got = s3.get_object(Bucket=bucket, Key="seg.log", Range=f"bytes={6 * MIB - 10}-{6 * MIB + 9}")
    assert got["Body"].read() == b"".join(bodies)[6 * MIB - 10 : 6 * MIB + 10]
    return spent


def test_in_order_parts_go_straight_into_the_backend_upload(cold: RunningProxy) -> None:
    bodies = [os.urandom(6 * MIB), os.urandom(6 * MIB), os.urandom(6 * MIB), os.urandom(300_000)]
    spent = _upload_costs(cold, bodies)
    # Every stored byte sent once, nothing written beside it, read back, listed or deleted: the backend
    # upload begins (its id's ticket stands for a state object), the parts go straight in, the small
    # last one with the tail, and the backend upload completes (the size of what it made is known).
    assert spent == {"CreateMultipartUpload": 1, "UploadPart": len(bodies), "CompleteMultipartUpload": 1}, (
        spent
    )
    assert sum(spent.values()) <= len(bodies) + 3 < 2 * len(bodies) + 5


def test_a_straight_last_part_costs_one_more_part_for_the_tail(cold: RunningProxy) -> None:
    bodies = [os.urandom(6 * MIB), os.urandom(6 * MIB), os.urandom(6 * MIB)]
    spent = _upload_costs(cold, bodies)
    assert spent == {"CreateMultipartUpload": 1, "UploadPart": len(bodies) + 1, "CompleteMultipartUpload": 1}
    assert sum(spent.values()) == len(bodies) + 3


def test_eager_records_are_written_before_each_part_is_answered(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    eager = start_proxy("seaweed", tmp_path, request, janitor_interval="0", upload_records="eager")
    try:
        s3 = eager.client()
        bucket = f"t-{uuid.uuid4().hex[:12]}"
        s3.create_bucket(Bucket=bucket)
        uid = s3.create_multipart_upload(Bucket=bucket, Key="seg.log")["UploadId"]

        def stored() -> set[str]:
            return upload_objects(eager, bucket, uid)

        assert stored() == {"state"}  # eager: as S3 keeps it, listed by every instance at once
        bodies = [os.urandom(6 * MIB), os.urandom(300_000)]
        parts = []
        before = _requests(eager)
        for no, body in enumerate(bodies, 1):
            etag = s3.upload_part(Bucket=bucket, Key="seg.log", UploadId=uid, PartNumber=no, Body=body)[
                "ETag"
            ]
            parts.append({"PartNumber": no, "ETag": etag})
            assert f"{no:05d}.info" in stored()
        _complete(s3, bucket, "seg.log", uid, parts)
        spent = _delta(before, _requests(eager))
        # One record more per part, and the upload's objects go after the completion.
        assert spent["PutObject"] == len(bodies) and spent["DeleteObjects"] == 1, spent
        assert stored() == set()
        assert s3.get_object(Bucket=bucket, Key="seg.log")["Body"].read() == b"".join(bodies)
    finally:
        eager.stop()


@pytest.fixture(params=["local", "seaweed"])
def any_proxy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningProxy]:
    running = start_proxy(str(request.param), tmp_path, request)
    yield running
    running.stop()


def test_parts_compression_shrank_between_straight_parts(any_proxy: RunningProxy) -> None:
    """A middle part that compresses below 5 MiB, out of order, resent, and Completes of subsets."""
    s3 = any_proxy.client()
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    random6, zeros6, other6 = os.urandom(6 * MIB), bytes(6 * MIB), os.urandom(6 * MIB)
    tail = os.urandom(123_456)
    # Out of order, and part 3 resent with other bytes: the last one sent counts.
    uid, parts = _upload(
        s3, bucket, "mixed", [(3, os.urandom(6 * MIB)), (2, zeros6), (1, random6), (3, other6), (4, tail)]
    )
    by_no = {p["PartNumber"]: p for p in parts}  # the resent part 3's last ETag wins
    _complete(s3, bucket, "mixed", uid, [by_no[n] for n in (1, 2, 3, 4)])
    assert s3.get_object(Bucket=bucket, Key="mixed")["Body"].read() == random6 + zeros6 + other6 + tail

    # A subset: the straight parts 1 and 3 around a left-out part 2, ending in a straight part.
    uid, parts = _upload(s3, bucket, "subset", [(1, random6), (2, zeros6), (3, other6), (4, tail)])
    _complete(s3, bucket, "subset", uid, [parts[0], parts[2]])
    assert s3.get_object(Bucket=bucket, Key="subset")["Body"].read() == random6 + other6

    # Compressible parts only: all kept aside, none below the minimum at the backend (EntityTooSmall).
    uid, parts = _upload(s3, bucket, "zeros", [(1, zeros6), (2, zeros6), (3, b"z" * 1000)])
    _complete(s3, bucket, "zeros", uid, parts)
    assert s3.get_object(Bucket=bucket, Key="zeros")["Body"].read() == zeros6 * 2 + b"z" * 1000

    # A small part that is not the last is still the client's error, as in S3.
    uid, parts = _upload(s3, bucket, "small", [(1, random6), (2, b"x" * 1000), (3, other6)])
    with pytest.raises(s3.exceptions.ClientError) as caught:
        _complete(s3, bucket, "small", uid, parts)
    assert caught.value.response["Error"]["Code"] == "EntityTooSmall"
    s3.abort_multipart_upload(Bucket=bucket, Key="small", UploadId=uid)
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket=bucket, Key="small")


def test_more_small_parts_than_are_kept_in_memory(any_proxy: RunningProxy) -> None:
    """Parts kept inside their records beyond the few whose bytes stay in memory are read back by range,
    pinned to their record: stored again uncompressed between straight parts, or copied in."""
    s3 = any_proxy.client()
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    first, last = os.urandom(6 * MIB), os.urandom(6 * MIB)
    middles = [bytes([n]) * (5 * MIB + n) for n in range(10)]  # each compresses to almost nothing
    uploads = [(1, first), *((n + 2, m) for n, m in enumerate(middles)), (12, last)]
    uid, parts = _upload(s3, bucket, "many", uploads)
    service = any_proxy.proxy.service
    assert service is not None
    assert service.uploads.keeper.inline_parts._data  # the newest small parts' bytes, for the completion
    _complete(s3, bucket, "many", uid, parts)
    assert not service.uploads.keeper.inline_parts._data  # not held once their upload has ended
    assert s3.get_object(Bucket=bucket, Key="many")["Body"].read() == first + b"".join(middles) + last
    # Small parts only: the object is assembled by copying ranges of the records.
    uid, parts = _upload(s3, bucket, "copied", [(n + 1, m) for n, m in enumerate(middles)])
    _complete(s3, bucket, "copied", uid, parts)
    assert s3.get_object(Bucket=bucket, Key="copied")["Body"].read() == b"".join(middles)


def test_small_parts_held_for_the_completion_are_let_go_at_an_abort(any_proxy: RunningProxy) -> None:
    s3 = any_proxy.client()
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    middles = [bytes([n]) * (5 * MIB + n) for n in range(3)]  # each compresses to almost nothing
    uid, _ = _upload(
        s3, bucket, "aborted", [(1, os.urandom(6 * MIB)), *((n + 2, m) for n, m in enumerate(middles))]
    )
    service = any_proxy.proxy.service
    assert service is not None
    assert service.uploads.keeper.inline_parts._data
    s3.abort_multipart_upload(Bucket=bucket, Key="aborted", UploadId=uid)
    assert not service.uploads.keeper.inline_parts._data


def test_an_upload_begun_by_an_older_version_completes(cold: RunningProxy) -> None:
    """Its state names no backend upload: every part is kept aside and copied in at completion."""
    s3 = cold.client()
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    # A content type of its own: the upload has a state object (no ticket), as every upload had then.
    uid = s3.create_multipart_upload(Bucket=bucket, Key="old", ContentType="application/x-kafka")["UploadId"]
    service = cold.proxy.service
    assert service is not None
    loc = service.layout.state(bucket, uid)
    _, data = cold.call(service.backend.get_bytes(loc.bucket, loc.key))
    fields = json.loads(data)
    assert fields.pop("backend_upload")
    cold.call(service.backend.put(loc.bucket, loc.key, json.dumps(fields).encode()))
    service.forget_upload(bucket, uid)
    bodies = [os.urandom(6 * MIB), os.urandom(1000)]
    parts = []
    for no, body in enumerate(bodies, 1):
        etag = s3.upload_part(Bucket=bucket, Key="old", UploadId=uid, PartNumber=no, Body=body)["ETag"]
        parts.append({"PartNumber": no, "ETag": etag})
    before = _requests(cold)
    _complete(s3, bucket, "old", uid, parts)
    assert _delta(before, _requests(cold)).get("UploadPartCopy") == 1
    assert s3.get_object(Bucket=bucket, Key="old")["Body"].read() == b"".join(bodies)


@pytest.mark.parametrize("kind", ["local", "seaweed"])
def test_an_upload_spread_over_two_instances_and_a_restart_completes(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Parts through one instance, a part sent again through another, Complete through the first: the
    first's memory of the parts is stale. A backend that keeps only the last upload of a part number (as
    S3 and the local store do) refuses the Complete, and it starts over from what is stored, where the
    other instance writes its record of the part once the upload is quiet there; SeaweedFS keeps each,
    and completes with the one named. Then the instance that took every part of another upload stops
    gracefully (its records are written), a fresh one completes the upload, and a repeated Complete
    through the other instance is answered alike."""
    quick = {"upload_record_delay": "200ms"}
    first = start_proxy(kind, tmp_path, request, **quick)
    shared = {"key_ring": str(tmp_path / "ring.json"), **quick}
    if kind == "local":
        shared["backend"] = f"file://{tmp_path / 'data'}"
    running = [first]
    try:
        (tmp_path / "other").mkdir()
        other = start_proxy(kind, tmp_path / "other", request, **shared)
        running.append(other)
        s3, s3b = first.client(), other.client()
        bucket = f"t-{uuid.uuid4().hex[:12]}"
        s3.create_bucket(Bucket=bucket)
        bodies = [os.urandom(6 * MIB), os.urandom(6 * MIB), os.urandom(200_000)]
        uid, parts = _upload(s3, bucket, "spread", list(enumerate(bodies, 1)))
        # The same bytes again (the same part ETag), stored anew under a fresh salt by the other instance.
        again = s3b.upload_part(Bucket=bucket, Key="spread", UploadId=uid, PartNumber=2, Body=bodies[1])
        assert again["ETag"] == parts[1]["ETag"]
        before = _requests(first)
        _complete(s3, bucket, "spread", uid, parts)
        spent = _delta(before, _requests(first))
        assert s3b.get_object(Bucket=bucket, Key="spread")["Body"].read() == b"".join(bodies)
        if kind == "local":  # refused once, then completed from a listing of what is stored
            assert spent.get("ListObjectsV2", 0) >= 1 and spent.get("GetObject", 0) >= 1, spent

        uid, parts = _upload(s3, bucket, "restarted", list(enumerate(bodies, 1)))
        first.stop()
        running.remove(first)
        (tmp_path / "restarted").mkdir()
        restarted = start_proxy(kind, tmp_path / "restarted", request, **shared)
        running.append(restarted)
        _complete(restarted.client(), bucket, "restarted", uid, parts)
        assert s3b.get_object(Bucket=bucket, Key="restarted")["Body"].read() == b"".join(bodies)
        repeated = s3b.complete_multipart_upload(
            Bucket=bucket, Key="restarted", UploadId=uid, MultipartUpload={"Parts": parts}
        )
        assert repeated["ETag"] == s3b.head_object(Bucket=bucket, Key="restarted")["ETag"]
        assert s3b.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    finally:
        for proxy in reversed(running):
            proxy.stop()
