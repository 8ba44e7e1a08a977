"""Multipart uploads whose part records are written late, and whose ids carry a ticket.

Real servers over the local store and SeaweedFS, two instances on one store where it matters. Every wait
is for a condition (a record written, an answer), never for a length of time.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.server.conftest import start_proxy
from tests.server.harness import RunningProxy
from tests.server.test_backend_requests import upload_objects
from tsproxy.format import ObjectContext
from tsproxy.service.uploads import tickets
from tsproxy.service.uploads.ids import backend_upload_of, straight_upload_id, ticket_of, upload_token

MIB = 1 << 20
QUICK = {"upload_record_delay": "200ms", "janitor_interval": "0"}


def _wait_for(condition: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.05)
    return found


def _code(call: Callable[[], Any]) -> str:
    with pytest.raises(ClientError) as caught:
        call()
    return str(caught.value.response["Error"]["Code"])


class Pair:
    """Two instances on one store (and one key ring)."""

    def __init__(self, kind: str, tmp: Path, request: pytest.FixtureRequest, **settings: Any) -> None:
        self.first = start_proxy(kind, tmp, request, **settings)
        shared = {"key_ring": str(tmp / "ring.json"), **settings}
        if kind == "local":
            shared["backend"] = f"file://{tmp / 'data'}"
        (tmp / "second").mkdir()
        try:
            self.second = start_proxy(kind, tmp / "second", request, **shared)
        except BaseException:
            self.first.stop()
            raise

    def stop(self) -> None:
        self.second.stop()
        self.first.stop()


@pytest.fixture(params=["local", "seaweed"])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pair]:
    running = Pair(str(request.param), tmp_path, request, **QUICK)
    yield running
    running.stop()


def _bucket(proxy: RunningProxy) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    proxy.client().create_bucket(Bucket=name)
    return name


def _part(s3: Any, bucket: str, key: str, uid: str, no: int, body: bytes) -> dict[str, Any]:
    etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=no, Body=body)["ETag"]
    return {"PartNumber": no, "ETag": etag}


def test_a_part_sent_through_another_instance_is_waited_for(pair: Pair) -> None:
    """Parts 1 and 3 through the first instance, 2 through the second: the first lists and completes
    once the second has written the record of its part (when the upload went quiet there)."""
    s3, other = pair.first.client(), pair.second.client()
    bucket = _bucket(pair.first)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="seg.log")["UploadId"]
    assert ticket_of(uid) is not None
    bodies = [os.urandom(6 * MIB), os.urandom(6 * MIB), os.urandom(100_000)]
    parts = [
        _part(s3, bucket, "seg.log", uid, 1, bodies[0]),
        _part(other, bucket, "seg.log", uid, 2, bodies[1]),
        _part(s3, bucket, "seg.log", uid, 3, bodies[2]),
    ]
    listed = s3.list_parts(Bucket=bucket, Key="seg.log", UploadId=uid)["Parts"]
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in listed] == [
        (p["PartNumber"], p["ETag"], len(b)) for p, b in zip(parts, bodies, strict=True)
    ]
    s3.complete_multipart_upload(Bucket=bucket, Key="seg.log", UploadId=uid, MultipartUpload={"Parts": parts})
    assert other.get_object(Bucket=bucket, Key="seg.log")["Body"].read() == b"".join(bodies)
    # The records the second instance wrote went with the upload.
    assert _wait_for(lambda: upload_objects(pair.first, bucket, uid) == set(), "the upload's objects to go")


def test_an_upload_with_its_own_metadata_keeps_a_state_object(pair: Pair) -> None:
    """Ids of the older forms (`<token>.<backend upload>`, with a state object) still work anywhere."""
    s3, other = pair.first.client(), pair.second.client()
    bucket = _bucket(pair.first)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="x.json", ContentType="application/json")["UploadId"]
    assert uid.count(".") == 1 and upload_objects(pair.first, bucket, uid) == {"state"}
    body = os.urandom(6 * MIB)
    parts = [_part(other, bucket, "x.json", uid, 1, body), _part(s3, bucket, "x.json", uid, 2, b"end")]
    other.complete_multipart_upload(
        Bucket=bucket, Key="x.json", UploadId=uid, MultipartUpload={"Parts": parts}
    )
    got = s3.get_object(Bucket=bucket, Key="x.json")
    assert got["Body"].read() == body + b"end" and got["ContentType"] == "application/json"


@pytest.mark.parametrize("content_type", ["binary/octet-stream", "application/octet-stream"])
def test_the_sdks_default_content_types_ride_in_the_ticket(pair: Pair, content_type: str) -> None:
    s3, other = pair.first.client(), pair.second.client()
    bucket = _bucket(pair.first)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="seg.log", ContentType=content_type)["UploadId"]
    assert ticket_of(uid) is not None and upload_objects(pair.first, bucket, uid) == set()
    parts = [_part(other, bucket, "seg.log", uid, 1, b"all of it")]
    other.complete_multipart_upload(
        Bucket=bucket, Key="seg.log", UploadId=uid, MultipartUpload={"Parts": parts}
    )
    assert s3.head_object(Bucket=bucket, Key="seg.log")["ContentType"] == content_type


def test_quiet_uploads_are_written_for_every_instance(pair: Pair) -> None:
    s3, other = pair.first.client(), pair.second.client()
    bucket = _bucket(pair.first)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="seg.log")["UploadId"]
    bodies = [os.urandom(6 * MIB), os.urandom(1000)]
    parts = [_part(s3, bucket, "seg.log", uid, n, b) for n, b in enumerate(bodies, 1)]
    want = {"state", "00001.info", "00002.info"}
    _wait_for(lambda: upload_objects(pair.first, bucket, uid) == want, "the records of a quiet upload")
    uploads = other.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in uploads] == [("seg.log", uid)]
    listed = other.list_parts(Bucket=bucket, Key="seg.log", UploadId=uid)["Parts"]
    assert [(p["PartNumber"], p["ETag"]) for p in listed] == [(p["PartNumber"], p["ETag"]) for p in parts]
    other.complete_multipart_upload(
        Bucket=bucket, Key="seg.log", UploadId=uid, MultipartUpload={"Parts": parts}
    )
    assert s3.get_object(Bucket=bucket, Key="seg.log")["Body"].read() == b"".join(bodies)
    assert upload_objects(pair.first, bucket, uid) == set()


def test_a_crash_loses_held_records_and_the_complete_fails_cleanly(pair: Pair) -> None:
    """The first instance takes every part and dies before the upload goes quiet: the second cannot
    complete it (InvalidPart, after waiting for records that never come), and no object appears."""
    s3, other = pair.first.client(), pair.second.client()
    bucket = _bucket(pair.first)
    service = pair.first.proxy.objects
    # The crash comes before the upload goes quiet, however slow the machine: the first instance's
    # flusher never finds it quiet (the second's short delay is the one its completion waits out).
    service.uploads.keeper.upload_record_delay = 3600.0
    uid = s3.create_multipart_upload(Bucket=bucket, Key="seg.log")["UploadId"]
    parts = [
        _part(s3, bucket, "seg.log", uid, 1, os.urandom(6 * MIB)),
        _part(s3, bucket, "seg.log", uid, 2, b"x"),
    ]
    for held in service.pending:  # what kill -9 does to the memory of the parts
        service.pending.close(held)
    assert upload_objects(pair.first, bucket, uid) == set()

    complete = {"Bucket": bucket, "Key": "seg.log", "UploadId": uid, "MultipartUpload": {"Parts": parts}}
    assert _code(lambda: other.complete_multipart_upload(**complete)) == "InvalidPart"
    assert _code(lambda: other.head_object(Bucket=bucket, Key="seg.log")) == "404"
    # The client starts over (as a broker's copy of the segment is retried): a new upload succeeds.
    other.abort_multipart_upload(Bucket=bucket, Key="seg.log", UploadId=uid)
    assert (
        _code(lambda: other.abort_multipart_upload(Bucket=bucket, Key="seg.log", UploadId=uid))
        == "NoSuchUpload"
    )
    assert _code(lambda: s3.list_parts(Bucket=bucket, Key="seg.log", UploadId=uid)) == "NoSuchUpload"
    again = other.create_multipart_upload(Bucket=bucket, Key="seg.log")["UploadId"]
    parts = [_part(other, bucket, "seg.log", again, 1, b"whole")]
    other.complete_multipart_upload(
        Bucket=bucket, Key="seg.log", UploadId=again, MultipartUpload={"Parts": parts}
    )
    assert s3.get_object(Bucket=bucket, Key="seg.log")["Body"].read() == b"whole"


def _retick(upload_id: str, ticket: bytes) -> str:
    backend = backend_upload_of(upload_id)
    assert backend is not None
    return straight_upload_id(upload_token(upload_id), backend, ticket)


def test_a_tampered_ticket_names_no_upload(pair: Pair) -> None:
    s3 = pair.second.client()  # an instance that did not create the upload: it has only the ticket
    bucket = _bucket(pair.first)
    uid = pair.first.client().create_multipart_upload(Bucket=bucket, Key="seg.log")["UploadId"]
    ticket = ticket_of(uid)
    assert ticket is not None
    opened = tickets.decode(ticket)
    assert opened.settings.encryption
    # Encryption stripped: a well-formed unencrypted ticket for this very upload, its check recomputed.
    plain_ctx = ObjectContext(os.urandom(16))
    plain = tickets.UploadTicket(
        plain_ctx.to_state(), dataclasses.replace(opened.settings, encryption=False), None, opened.initiated
    )
    stripped = _retick(uid, tickets.seal(plain, plain_ctx, bucket, "seg.log", uid.rpartition(".")[0]))
    flipped = [
        _retick(uid, ticket[:i] + bytes([ticket[i] ^ 1]) + ticket[i + 1 :])
        for i in (1, 5, 20, len(ticket) - 1)
    ]
    for bad in [stripped, *flipped, uid + "x", uid.rpartition(".")[0] + "." + "A" * 40]:
        assert (
            _code(
                lambda b=bad: s3.upload_part(
                    Bucket=bucket, Key="seg.log", UploadId=b, PartNumber=1, Body=b"x"
                )
            )
            == "NoSuchUpload"
        )
        assert _code(lambda b=bad: s3.list_parts(Bucket=bucket, Key="seg.log", UploadId=b)) == "NoSuchUpload"
    # Another key, another bucket.
    assert (
        _code(lambda: s3.upload_part(Bucket=bucket, Key="other", UploadId=uid, PartNumber=1, Body=b"x"))
        == "NoSuchUpload"
    )
    elsewhere = _bucket(pair.first)
    assert (
        _code(lambda: s3.upload_part(Bucket=elsewhere, Key="seg.log", UploadId=uid, PartNumber=1, Body=b"x"))
        == "NoSuchUpload"
    )
    done = {"Parts": [{"PartNumber": 1, "ETag": '"' + "0" * 32 + '"'}]}
    assert (
        _code(
            lambda: s3.complete_multipart_upload(
                Bucket=bucket, Key="seg.log", UploadId=stripped, MultipartUpload=done
            )
        )
        == "NoSuchUpload"
    )
    assert (
        _code(lambda: s3.abort_multipart_upload(Bucket=bucket, Key="seg.log", UploadId=flipped[0]))
        == "NoSuchUpload"
    )
    # The upload itself is untouched.
    parts = [_part(s3, bucket, "seg.log", uid, 1, b"intact")]
    s3.complete_multipart_upload(Bucket=bucket, Key="seg.log", UploadId=uid, MultipartUpload={"Parts": parts})
    assert s3.get_object(Bucket=bucket, Key="seg.log")["Body"].read() == b"intact"


def test_the_bound_on_held_records_writes_them_at_once(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    proxy = start_proxy("local", tmp_path, request, upload_record_delay="10m", janitor_interval="0")
    try:
        s3 = proxy.client()
        bucket = _bucket(proxy)
        service = proxy.proxy.objects
        held = s3.create_multipart_upload(Bucket=bucket, Key="held")["UploadId"]
        _part(s3, bucket, "held", held, 1, b"kept here")
        # Held, not written: listed by this instance all the same.
        assert upload_objects(proxy, bucket, held) == set()
        assert [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=bucket)["Uploads"]] == [held]
        service.pending.max_bytes = 0
        uid = s3.create_multipart_upload(Bucket=bucket, Key="bound")["UploadId"]
        parts = [_part(s3, bucket, "bound", uid, n, b) for n, b in ((1, os.urandom(6 * MIB)), (2, b"tail"))]
        assert upload_objects(proxy, bucket, uid) == {"state", "00001.info", "00002.info"}
        s3.complete_multipart_upload(
            Bucket=bucket, Key="bound", UploadId=uid, MultipartUpload={"Parts": parts}
        )
        assert upload_objects(proxy, bucket, uid) == set()
        assert s3.get_object(Bucket=bucket, Key="bound")["Body"].read().endswith(b"tail")
    finally:
        proxy.stop()


def test_a_compressed_middle_part_kept_in_its_record_is_written_at_once(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A part that compression shrank below the backend's minimum part size is kept in its record; one
    such record is held per upload (the newest, most likely the last part): when another comes, the
    older one is written, stored bytes and all, so a compressible upload does not hold them all."""
    proxy = start_proxy("local", tmp_path, request, upload_record_delay="10m", janitor_interval="0")
    try:
        s3 = proxy.client()
        bucket = _bucket(proxy)
        service = proxy.proxy.objects
        squeezed = b"".join(b"%08d,clicked,page-%d\n" % (i, i % 7) for i in range(6 * MIB // 24))
        assert len(squeezed) >= 5 * MIB
        uid = s3.create_multipart_upload(Bucket=bucket, Key="seg")["UploadId"]
        parts = [_part(s3, bucket, "seg", uid, 1, squeezed)]
        assert upload_objects(proxy, bucket, uid) == set()  # held: it may be the last part
        held = service.pending.held_bytes
        assert held > len(squeezed) // 100  # its stored bytes (it compresses very well)
        parts.append(_part(s3, bucket, "seg", uid, 2, b"the last part"))
        assert upload_objects(proxy, bucket, uid) == {"state", "00001.info"}  # the older one written
        assert 0 < service.pending.held_bytes < held  # the newest, small, is held
        s3.complete_multipart_upload(Bucket=bucket, Key="seg", UploadId=uid, MultipartUpload={"Parts": parts})
        assert s3.get_object(Bucket=bucket, Key="seg")["Body"].read() == squeezed + b"the last part"
    finally:
        proxy.stop()


def test_an_id_with_a_garbled_ticket_is_no_upload_once_the_state_is_written(pair: Pair) -> None:
    s3 = pair.first.client()
    bucket = _bucket(pair.first)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="seg.log")["UploadId"]
    _part(s3, bucket, "seg.log", uid, 1, b"x")
    _wait_for(lambda: "state" in upload_objects(pair.first, bucket, uid), "the quiet upload's state written")
    for garbled in (uid + "x", uid + "AA", uid[:-1] + "-x"):
        for proxy in (pair.first, pair.second):
            client = proxy.client()
            got = _code(
                lambda g=garbled, c=client: c.upload_part(  # type: ignore[misc]
                    Bucket=bucket, Key="seg.log", UploadId=g, PartNumber=2, Body=b"y"
                )
            )
            assert got == "NoSuchUpload", garbled
