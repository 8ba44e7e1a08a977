"""The janitor against real stores: old leftovers go, live uploads (and what belongs to them) stay.

Age is simulated two ways: a janitor whose clock runs hours ahead (everything looks old), and a tiny
`leftover_age` with real waits, for what must look old and live at the same time. Stores keep whole
seconds, so the waits are a few seconds and the live uploads are touched far more often than that.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import start_proxy
from tests.server.harness import RunningProxy
from tsproxy.service.janitor import Janitor, JanitorRun
from tsproxy.store.base import multipart_of

MIB = 1 << 20
HOURS = 3600.0


def _metric(running: RunningProxy, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(f"{running.metrics_url}/metrics", timeout=10).read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series == (f"{name}{{{want}}}" if want else name):
            return float(value)
    raise AssertionError(f"no series {name}{{{want}}} in the scrape")


def _janitor(running: RunningProxy, age: float, ahead: float = 0.0) -> Janitor:
    return Janitor(
        running.proxy.objects,
        leftover_age=age,
        metrics=running.proxy.metrics,
        clock=lambda: time.time() + ahead,
    )


def _sweep(running: RunningProxy, janitor: Janitor) -> JanitorRun:
    run: JanitorRun = running.call(janitor.run_once())
    assert run.failures == []
    return run


def _backend_uploads(running: RunningProxy, bucket: str) -> set[tuple[str, str]]:
    root = running.proxy.objects.ns.root(bucket)
    store = multipart_of(running.proxy.store)
    return {(u.key, u.upload_id) for u in running.call(store.list_multipart_uploads(root.bucket, root.key))}


def _internal(running: RunningProxy, bucket: str) -> list[str]:
    loc = running.proxy.objects.ns.internal(bucket, "")
    page = running.call(running.proxy.store.list(loc.bucket, prefix=loc.key, max_keys=1000))
    return [o.key for o in page.objects]


@pytest.fixture(params=["local", "seaweed"])
def quiet_proxy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningProxy]:
    """A proxy whose own janitor is off (the tests run theirs); on SeaweedFS all client buckets live in
    one backend bucket of their own, so no sweep reaches another test's buckets."""
    settings: dict[str, Any] = {"janitor_interval": "0s"}
    if request.param == "seaweed":
        settings["backend_bucket"] = request.getfixturevalue("seaweed").new_bucket("jan")
    running = start_proxy(request.param, tmp_path, request, **settings)
    yield running
    running.stop()


def test_old_leftovers_of_every_kind_go_and_fresh_ones_stay(quiet_proxy: RunningProxy) -> None:
    running = quiet_proxy
    s3 = running.client()
    bucket = f"j-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    # An upload abandoned after two parts (its state, the record of a small part, which keeps the part,
    # and the data object of a part kept as an object of its own, as a big one is) ...
    abandoned = s3.create_multipart_upload(Bucket=bucket, Key="abandoned")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="abandoned", UploadId=abandoned, PartNumber=1, Body=b"a" * 1000)
    store = running.proxy.store
    service = running.proxy.objects
    ns = service.ns
    # Written as an upload gone quiet is (held records are live: the janitor leaves them alone).
    running.call(service.flush_records())
    kept = service.layout.upload(bucket, abandoned, "00002-0123456789abcdef")
    running.call(store.put(kept.bucket, kept.key, b"stored part"))
    # ... a completed one (the object names its upload; nothing of it stays), the completion record of
    # an upload that an older version completed (it stays for an hour) ...
    done = s3.create_multipart_upload(Bucket=bucket, Key="done")["UploadId"]
    part = s3.upload_part(Bucket=bucket, Key="done", UploadId=done, PartNumber=1, Body=b"d" * 1000)
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="done",
        UploadId=done,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
    )
    record = ns.internal(bucket, "mpu-done/0123456789abcdef")
    running.call(store.put(record.bucket, record.key, b'{"key": "old"}'))
    # ... an assembly cut short (a backend upload at a client key, and one under the reserved namespace
    # of an upload that no longer exists) and the probe object of an interrupted `serve --check`.
    cut_short = ns.object(bucket, "assembled")
    running.call(multipart_of(store).create_multipart(cut_short.bucket, cut_short.key))
    stray = ns.internal(bucket, "mpu/gone/00001-0123456789abcdef")
    running.call(multipart_of(store).create_multipart(stray.bucket, stray.key))
    probe = ns.internal(bucket, "probe-0123456789abcdef")
    running.call(store.put(probe.bucket, probe.key, b"probe"))
    temporary = 0
    if running.cfg.local_backend:  # a file the embedded store was writing when it was killed
        (running.cfg.backend_path() / bucket / ".tmp-0123456789abcdef").write_bytes(b"half")
        temporary = 1
    kinds = ("backend_upload", "upload_state", "temporary")
    before = {k: _metric(running, "tsproxy_janitor_removed_total", kind=k) for k in kinds}

    # Everything is younger than a day: nothing goes.
    assert _sweep(running, _janitor(running, 24 * HOURS)).removed == {}
    started = _backend_uploads(running, bucket)
    # The two started above, and the one the abandoned upload's in-order parts would have gone into.
    assert {k for k, _ in started} == {cut_short.key, stray.key, ns.object(bucket, "abandoned").key}

    # Two days later, everything is left over.
    run = _sweep(running, _janitor(running, 24 * HOURS, ahead=48 * HOURS))
    assert run.removed == {"upload_state": 4, "backend_upload": len(started), "temporary": 1 + temporary}
    assert _internal(running, bucket) == ([ns.internal(bucket, "bucket").key] if ns.mapped else [])
    assert _backend_uploads(running, bucket) == set()
    with pytest.raises(s3.exceptions.NoSuchUpload):
        s3.list_parts(Bucket=bucket, Key="abandoned", UploadId=abandoned)
    assert s3.get_object(Bucket=bucket, Key="done")["Body"].read() == b"d" * 1000
    if running.cfg.local_backend:
        assert not (running.cfg.backend_path() / bucket / ".tmp-0123456789abcdef").exists()
    after = {k: _metric(running, "tsproxy_janitor_removed_total", kind=k) for k in before}
    assert {k: after[k] - before[k] for k in before} == {
        "backend_upload": len(started),
        "upload_state": 4,
        "temporary": 1 + temporary,
    }
    assert _metric(running, "tsproxy_janitor_runs_total", outcome="ok") == 2
    assert _metric(running, "tsproxy_janitor_runs_total", outcome="error") == 0


def test_backend_uploads_of_a_live_client_upload_stay_however_old(quiet_proxy: RunningProxy) -> None:
    running = quiet_proxy
    s3 = running.client()
    bucket = f"j-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    ns = running.proxy.objects.ns
    store = multipart_of(running.proxy.store)
    live = s3.create_multipart_upload(Bucket=bucket, Key="live")["UploadId"]
    # Backend uploads as a completion (at the upload's key) and a part upload (under its prefix) make
    # them, and one of an upload that is gone.
    at_key = ns.object(bucket, "live")
    under = running.proxy.objects.layout.upload(bucket, live, "00001-0123456789abcdef")
    elsewhere = ns.object(bucket, "unrelated")
    for loc in (at_key, under, elsewhere):
        running.call(store.create_multipart(loc.bucket, loc.key))
    time.sleep(3.5)  # the backend uploads are now older than the age below ...
    body = os.urandom(MIB)
    part = s3.upload_part(Bucket=bucket, Key="live", UploadId=live, PartNumber=1, Body=body)  # ... not it

    run = _sweep(running, _janitor(running, 2.0))

    assert run.removed == {"backend_upload": 1}
    assert {k for k, _ in _backend_uploads(running, bucket)} == {at_key.key, under.key}
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="live",
        UploadId=live,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
    )
    assert s3.get_object(Bucket=bucket, Key="live")["Body"].read() == body


def test_a_slow_upload_survives_a_janitor_sweeping_all_along(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The server's own janitor sweeps several times a second with a 4 s age, while a client uploads
    parts (re-sending one again and again) for longer than that; an abandoned upload beside it goes."""
    weed = request.getfixturevalue("seaweed")
    running = start_proxy(
        "seaweed",
        tmp_path,
        request,
        backend_bucket=weed.new_bucket("jan"),
        leftover_age="4s",
        janitor_interval="300ms",
    )
    try:
        s3 = running.client()
        bucket = f"j-{uuid.uuid4().hex[:12]}"
        s3.create_bucket(Bucket=bucket)
        service = running.proxy.objects
        abandoned = s3.create_multipart_upload(Bucket=bucket, Key="abandoned")["UploadId"]
        s3.upload_part(Bucket=bucket, Key="abandoned", UploadId=abandoned, PartNumber=1, Body=b"x" * 1000)
        stray = service.layout.upload(bucket, abandoned, "00002-0123456789abcdef")
        weed.boto3_client().create_multipart_upload(Bucket=stray.bucket, Key=stray.key)

        key = "segment.log"
        upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        parts: dict[int, tuple[str, bytes]] = {}

        def send(no: int, size: int) -> None:
            body = os.urandom(size)
            etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=no, Body=body)["ETag"]
            parts[no] = (etag, body)

        send(1, 5 * MIB)
        send(3, 300_000)
        runs_before = _metric(running, "tsproxy_janitor_runs_total", outcome="ok")
        deadline = time.monotonic() + 120
        resent = 0
        # Keep the upload busy (part 2 sent over and over, a part taking a while each time) until the
        # abandoned upload is gone and the janitor has swept many times meanwhile.
        while resent < 5 or service.layout.state(bucket, abandoned).key in _internal(running, bucket):
            assert time.monotonic() < deadline, "the abandoned upload was never removed"
            send(2, 5 * MIB)
            resent += 1
            time.sleep(0.2)
        assert _metric(running, "tsproxy_janitor_runs_total", outcome="ok") - runs_before >= 3
        # The sweep that removed the upload's state aborts the stray backend upload a moment later.
        while any(k.startswith(stray.key) for k, _ in _backend_uploads(running, bucket)):
            assert time.monotonic() < deadline, "the stray backend upload was never aborted"
            time.sleep(0.1)

        # The live upload lost nothing; completing it, with the janitor still sweeping, gives its bytes.
        listed = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload)["Parts"]
        assert [(p["PartNumber"], p["ETag"]) for p in listed] == [(n, parts[n][0]) for n in (1, 2, 3)]
        done = threading.Event()
        result: dict[str, Any] = {}

        def complete() -> None:
            result["etag"] = s3.complete_multipart_upload(
                Bucket=bucket,
                Key=key,
                UploadId=upload,
                MultipartUpload={"Parts": [{"PartNumber": n, "ETag": parts[n][0]} for n in (1, 2, 3)]},
            )["ETag"]
            done.set()

        thread = threading.Thread(target=complete)
        thread.start()
        thread.join(120)
        assert done.is_set()
        expected = b"".join(parts[n][1] for n in (1, 2, 3))
        got = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(expected).hexdigest()
        # The abandoned upload's state and its part's record (which keeps the small part), and the
        # stray backend upload under its prefix with the one its parts would have gone straight into.
        assert _metric(running, "tsproxy_janitor_removed_total", kind="upload_state") >= 2
        assert _metric(running, "tsproxy_janitor_removed_total", kind="backend_upload") >= 2
        assert _metric(running, "tsproxy_janitor_runs_total", outcome="error") == 0
    finally:
        running.stop()
