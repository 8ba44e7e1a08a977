"""TCP going wrong between tsproxy and a real SeaweedFS (toxiproxy in between): connections reset in the
middle of a body, a store that stalls, latency spikes, the store gone during a multipart upload and
during a forward scan.

In every case: no wrong byte reaches a client (every read is checked), every failure is an S3 error with
its status (503 with Retry-After while the store cannot be reached), retries are bounded, no object is
half visible, readiness stays up, and after a janitor's sweep the store holds only what clients see.
"""

from __future__ import annotations

import os
import time
import urllib.request
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.network.conftest import Via
from tests.network.net_helpers import (
    Background,
    assert_clean,
    assert_unavailable,
    backend_up,
    client,
    read_verified,
    retries,
    store_requests,
    until_store_saw,
)
from tests.support.seaweed import SeaweedFS
from tests.support.toxiproxy import Link
from tests.support.waiting import eventually

MIB = 1 << 20
BUCKET = "network"
NO_CACHE = {"cache_dir": "off", "memory_cache_size": "0", "prefetch": "0"}
pytestmark = pytest.mark.timeout(180)


def _retry_until_back(call: Any, timeout: float = 60) -> Any:
    """`call()` again until the store is back (tsproxy lets a trial request through every few seconds);
    every failure on the way must be the 503 of an unreachable store."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except ClientError as e:
            assert_unavailable(e)
            assert time.monotonic() < deadline, "the store did not come back"
            time.sleep(0.2)


def test_get_bodies_reset_midway_are_resumed_with_the_right_bytes(
    store_link: Link, via: Via, seaweed: SeaweedFS
) -> None:
    running = via(store_link.endpoint, backend_max_attempts="6", **NO_CACHE)
    s3 = client(running)
    s3.create_bucket(Bucket=BUCKET)
    data = os.urandom(3 * MIB)
    s3.put_object(Bucket=BUCKET, Key="k", Body=data)

    # Every connection from the store is cut after 1 MB: a 3 MiB read needs three resumes at least,
    # each from where the last one stopped.
    store_link.add("limit_data", bytes=1_000_000)
    before = retries(running, "GetObject")
    assert s3.get_object(Bucket=BUCKET, Key="k")["Body"].read() == data
    read_verified(s3, BUCKET, "k", data, 500_000, 2_900_000)
    eventually(lambda: retries(running, "GetObject") - before >= 3 * 2, what="fewer resumes than cuts")
    store_link.clear()
    assert_clean(running, seaweed, via.backend_bucket, BUCKET, {"k": data})


@pytest.mark.parametrize("multipart", [False, True], ids=["put", "multipart"])
def test_a_put_body_reset_midway_is_sent_again_and_the_object_appears_once_whole(
    store_link: Link, via: Via, seaweed: SeaweedFS, multipart: bool
) -> None:
    running = via(store_link.endpoint, backend_max_attempts="6", **NO_CACHE)
    s3 = client(running)
    s3.create_bucket(Bucket=BUCKET)
    parts = [os.urandom(5 * MIB), os.urandom(2 * MIB)] if multipart else [os.urandom(2 * MIB)]
    data = b"".join(parts)

    def upload() -> None:
        if not multipart:
            s3.put_object(Bucket=BUCKET, Key="k", Body=data)
            return
        upload_id = s3.create_multipart_upload(Bucket=BUCKET, Key="k")["UploadId"]
        done = []
        for number, body in enumerate(parts, 1):
            answer = s3.upload_part(Bucket=BUCKET, Key="k", UploadId=upload_id, PartNumber=number, Body=body)
            done.append({"PartNumber": number, "ETag": answer["ETag"]})
        s3.complete_multipart_upload(
            Bucket=BUCKET, Key="k", UploadId=upload_id, MultipartUpload={"Parts": done}
        )

    store_link.add("bandwidth", stream="upstream", rate=4000)
    store_link.add("limit_data", stream="upstream", name="cut", bytes=500_000)

    def failed_puts() -> int:
        return store_requests(seaweed, via.backend_bucket, "PUT", failed=True)

    cut = failed_puts()
    sent = Background(upload)
    until_store_saw(failed_puts, cut + 1, sent, "no PUT was cut")
    store_link.remove("cut")
    sent.result()
    # Sent again by tsproxy's retry loop, or by its HTTP client (which sends an idempotent request once
    # more when a kept-alive connection drops): either way, once.
    store_link.clear()
    read_verified(s3, BUCKET, "k", data)
    assert_clean(running, seaweed, via.backend_bucket, BUCKET, {"k": data})


def test_a_stalled_store_costs_bounded_attempts_then_a_503(
    store_link: Link, via: Via, seaweed: SeaweedFS
) -> None:
    running = via(store_link.endpoint, backend_max_attempts="2", backend_read_timeout="1s", **NO_CACHE)
    s3 = client(running)
    s3.create_bucket(Bucket=BUCKET)
    data = os.urandom(MIB)
    s3.put_object(Bucket=BUCKET, Key="k", Body=data)

    # The store takes requests and never answers: each attempt waits one read timeout.
    store_link.add("timeout", name="stall", timeout=0)
    before = retries(running, "GetObject")
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=BUCKET, Key="k")
    assert_unavailable(exc)
    # A read of an object not cached makes at most two backend reads (its tail, its data), each tried
    # twice here and no more.
    assert 1 <= retries(running, "GetObject") - before <= 2
    late = os.urandom(300_000)
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=BUCKET, Key="late", Body=late)
    assert_unavailable(exc)
    with urllib.request.urlopen(f"{running.metrics_url}/readyz", timeout=10) as ready:
        assert ready.status == 200

    store_link.remove("stall")
    read_verified(s3, BUCKET, "k", data) if backend_up(running) else _retry_until_back(
        lambda: read_verified(s3, BUCKET, "k", data)
    )
    # The store may have taken the PUT whose answer never came (as S3 may): then it is there whole.
    visible = {"k": data}
    try:
        s3.head_object(Bucket=BUCKET, Key="late")
        visible["late"] = late
    except ClientError as e:
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert_clean(running, seaweed, via.backend_bucket, BUCKET, visible)


def test_latency_spikes_below_the_timeout_never_fail_a_request(
    store_link: Link, via: Via, seaweed: SeaweedFS
) -> None:
    running = via(store_link.endpoint)
    s3 = client(running)
    s3.create_bucket(Bucket=BUCKET)
    store_link.add("latency", latency=400, jitter=350)
    objects = {f"k{n}": os.urandom(size) for n, size in enumerate((1000, 700_000, 3 * MIB))}
    for key, data in objects.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=data)
    for key, data in objects.items():
        read_verified(s3, BUCKET, key, data)
        read_verified(s3, BUCKET, key, data, len(data) // 3, len(data) // 2 + 1)
    store_link.clear()
    assert backend_up(running) == 1
    assert_clean(running, seaweed, via.backend_bucket, BUCKET, objects)


@pytest.mark.slow
def test_the_store_gone_during_a_multipart_upload(store_link: Link, via: Via, seaweed: SeaweedFS) -> None:
    running = via(store_link.endpoint, **NO_CACHE)
    s3 = client(running)
    s3.create_bucket(Bucket=BUCKET)
    parts = [os.urandom(5 * MIB), os.urandom(5 * MIB), os.urandom(MIB)]
    kept = s3.create_multipart_upload(Bucket=BUCKET, Key="kept")["UploadId"]
    dropped = s3.create_multipart_upload(Bucket=BUCKET, Key="dropped")["UploadId"]
    etags = [s3.upload_part(Bucket=BUCKET, Key="kept", UploadId=kept, PartNumber=1, Body=parts[0])["ETag"]]
    s3.upload_part(Bucket=BUCKET, Key="dropped", UploadId=dropped, PartNumber=1, Body=parts[0])

    store_link.disable()
    # Several times the breaker's trial period: refusals are fast, each a 503 with Retry-After.
    outage_ends = time.monotonic() + 8
    while time.monotonic() < outage_ends:
        with pytest.raises(ClientError) as exc:
            s3.upload_part(Bucket=BUCKET, Key="kept", UploadId=kept, PartNumber=2, Body=parts[1])
        assert_unavailable(exc)
        time.sleep(0.3)
    assert backend_up(running) == 0
    with pytest.raises(ClientError) as exc:
        s3.complete_multipart_upload(
            Bucket=BUCKET, Key="kept", UploadId=kept,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etags[0]}]},
        )  # fmt: skip
    assert_unavailable(exc)
    with pytest.raises(ClientError) as exc:
        s3.abort_multipart_upload(Bucket=BUCKET, Key="dropped", UploadId=dropped)
    assert_unavailable(exc)
    with urllib.request.urlopen(f"{running.metrics_url}/readyz", timeout=10) as ready:
        assert ready.status == 200

    store_link.enable()
    for number, body in enumerate(parts[1:], 2):
        answer = _retry_until_back(
            lambda n=number, b=body: s3.upload_part(
                Bucket=BUCKET, Key="kept", UploadId=kept, PartNumber=n, Body=b
            )
        )
        etags.append(answer["ETag"])
    s3.complete_multipart_upload(
        Bucket=BUCKET, Key="kept", UploadId=kept,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]},
    )  # fmt: skip
    s3.abort_multipart_upload(Bucket=BUCKET, Key="dropped", UploadId=dropped)
    data = b"".join(parts)
    read_verified(s3, BUCKET, "kept", data, 5 * MIB - 100, 10 * MIB + 100)
    assert_clean(running, seaweed, via.backend_bucket, BUCKET, {"kept": data})


@pytest.mark.slow
def test_the_store_gone_during_a_forward_scan(store_link: Link, via: Via, seaweed: SeaweedFS) -> None:
    # A long metadata_ttl: this is about chunks, not about re-checking the object (test_stale_if_error).
    running = via(store_link.endpoint, metadata_ttl="1h", prefetch="1MiB")
    s3 = client(running)
    s3.create_bucket(Bucket=BUCKET)
    data = os.urandom(6 * MIB)
    s3.put_object(Bucket=BUCKET, Key="segment", Body=data)
    fetch = 256 << 10
    position = 0
    while position < 2 * MIB:
        position += len(read_verified(s3, BUCKET, "segment", data, position, position + fetch))

    store_link.disable()
    served = refused = 0
    for start in range(position, len(data), fetch):
        try:
            read_verified(s3, BUCKET, "segment", data, start, start + fetch)
            served += 1
        except ClientError as e:
            assert_unavailable(e)
            refused += 1
    assert refused > 0  # 4 MiB past a 1 MiB prefetch cannot all be cached
    with urllib.request.urlopen(f"{running.metrics_url}/readyz", timeout=10) as ready:
        assert ready.status == 200

    store_link.enable()
    while position < len(data):
        start = position
        position += len(
            _retry_until_back(lambda s=start: read_verified(s3, BUCKET, "segment", data, s, s + fetch))
        )
    eventually(lambda: backend_up(running) == 1, what="the store not seen back")
    assert_clean(running, seaweed, via.backend_bucket, BUCKET, {"segment": data})
