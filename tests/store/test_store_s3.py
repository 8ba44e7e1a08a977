"""The S3 backend against a real SeaweedFS, with faults injected by a proxy in between.

Retries are checked by what the proxy saw and by what the backend reported to `on_request`, never by
how long anything took.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from tests.support.faulty_proxy import FaultyProxy
from tests.support.ports import free_port
from tests.support.seaweed import SeaweedFS
from tsproxy import errors
from tsproxy.store import s3 as s3_module
from tsproxy.store import s3errors
from tsproxy.store.base import MIB, StoreFault
from tsproxy.store.s3 import S3Backend

MAX_ATTEMPTS = 4


@dataclass
class Recorder:
    """Collects on_request reports: (operation, outcome, retries, bytes_in, bytes_out)."""

    calls: list[tuple[str, str, int, int, int]] = field(default_factory=list)

    def __call__(self, op: str, outcome: str, seconds: float, retries: int, b_in: int, b_out: int) -> None:
        assert seconds >= 0
        self.calls.append((op, outcome, retries, b_in, b_out))

    def ops(self) -> list[str]:
        return [c[0] for c in self.calls]

    def last(self, op: str) -> tuple[str, str, int, int, int]:
        return [c for c in self.calls if c[0] == op][-1]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


async def started(weed: SeaweedFS, endpoint: str, recorder: Recorder, **options: Any) -> S3Backend:
    settings: dict[str, Any] = {"max_attempts": MAX_ATTEMPTS, "backoff_base": 0.001, "backoff_cap": 0.01}
    settings.update(options)
    backend = S3Backend(**weed.backend_options(endpoint, on_request=recorder, **settings))
    await backend.start()
    return backend


@pytest.fixture
async def proxied(
    seaweed: SeaweedFS, faulty_proxy: FaultyProxy, recorder: Recorder
) -> AsyncIterator[S3Backend]:
    """An S3Backend that talks to SeaweedFS through the faulty proxy."""
    backend = await started(seaweed, faulty_proxy.endpoint, recorder)
    yield backend
    await backend.close()


async def pieces(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


# -- retried faults -----------------------------------------------------------------------------------


async def test_slowdown_is_retried_and_counted(
    proxied: S3Backend, faulty_proxy: FaultyProxy, recorder: Recorder, seaweed_bucket: str
) -> None:
    faulty_proxy.inject("slowdown", method="PUT", times=2)
    info = await proxied.put(seaweed_bucket, "k", b"payload")
    assert info.etag == hashlib.md5(b"payload").hexdigest()
    assert faulty_proxy.count("PUT", fault="slowdown") == 2
    assert faulty_proxy.count("PUT", fault=None) == 1
    assert recorder.last("PutObject") == ("PutObject", "ok", 2, 0, 7)
    assert (await proxied.get_bytes(seaweed_bucket, "k"))[1] == b"payload"


async def test_internal_error_and_dropped_connections_are_retried(
    proxied: S3Backend, faulty_proxy: FaultyProxy, recorder: Recorder, seaweed_bucket: str
) -> None:
    # aiohttp itself resends an idempotent request (GET, HEAD, PUT, DELETE) once when its pooled
    # connection turns out closed, so for those a dropped connection costs this backend one retry
    # or none; three drops in a row cost at least one. A POST is never resent by aiohttp.
    await proxied.put(seaweed_bucket, "k", b"0123456789")
    faulty_proxy.inject("internal_error", method="GET", times=2)
    faulty_proxy.inject("drop", method="GET", times=1)
    assert (await proxied.get_bytes(seaweed_bucket, "k", 2, 5))[1] == b"2345"
    _, outcome, retries, b_in, b_out = recorder.last("GetObject")
    assert (outcome, b_in, b_out) == ("ok", 4, 0) and retries in (2, 3)
    for method, operation in (("HEAD", "HeadObject"), ("PUT", "PutObject")):
        faulty_proxy.inject("drop", method=method, times=3)
        if method == "HEAD":
            assert (await proxied.head(seaweed_bucket, "k")).size == 10
        else:
            await proxied.put(seaweed_bucket, "k2", b"x" * 100_000)
        assert recorder.last(operation)[1] == "ok" and 1 <= recorder.last(operation)[2] <= 3
    faulty_proxy.inject("drop", method="POST", path=r"\?delete", times=1)
    assert await proxied.delete_many(seaweed_bucket, ["k", "k2"]) == []
    assert recorder.last("DeleteObjects")[1:3] == ("ok", 1)
    assert faulty_proxy.count(fault="drop") == 8
    assert faulty_proxy.count(fault="internal_error") == 2
    assert (await proxied.list(seaweed_bucket)).objects == []


async def test_truncated_body_resumes_from_the_same_version(
    proxied: S3Backend, faulty_proxy: FaultyProxy, recorder: Recorder, seaweed_bucket: str
) -> None:
    data = os.urandom(3 * MIB)
    info = await proxied.put(seaweed_bucket, "big", data)
    faulty_proxy.inject("truncate", method="GET", truncate_at=MIB + 123, times=2)
    async with await proxied.get(seaweed_bucket, "big", 100, None) as reader:
        body = b"".join([piece async for piece in reader])
    assert body == data[100:]
    gets = [s for s in faulty_proxy.seen if s.method == "GET"]
    assert [s.fault for s in gets] == ["truncate", "truncate", None]
    # Each resumption asks for exactly what is missing, of the version first read.
    for seen in gets[1:]:
        first = int(seen.headers["range"].removeprefix("bytes=").split("-")[0])
        assert 100 < first < len(data) and seen.headers["range"].endswith(f"-{len(data) - 1}")
        assert seen.headers["if-match"] == f'"{info.etag}"'
    assert recorder.last("GetObject") == ("GetObject", "ok", 2, len(data) - 100, 0)


async def test_object_replaced_during_resumption_is_an_error(
    proxied: S3Backend, faulty_proxy: FaultyProxy, seaweed_bucket: str
) -> None:
    await proxied.put(seaweed_bucket, "k", os.urandom(2 * MIB))
    faulty_proxy.inject("truncate", method="GET", truncate_at=MIB, times=1)
    reader = await proxied.get(seaweed_bucket, "k")
    pieces_read = [await anext(aiter(reader))]
    await proxied.put(seaweed_bucket, "k", b"another version")
    with pytest.raises(errors.InternalError):
        async for piece in reader:
            pieces_read.append(piece)
    await reader.close()


# -- persistent faults end in a clean S3 error --------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("slowdown", errors.SlowDown),
        ("internal_error", StoreFault),  # an InternalError to clients, the store down to its health
        ("drop", errors.ServiceUnavailable),
    ],
)
async def test_persistent_fault_gives_clean_error_after_max_attempts(
    proxied: S3Backend,
    faulty_proxy: FaultyProxy,
    recorder: Recorder,
    seaweed_bucket: str,
    fault: str,
    expected: type[errors.S3Error],
) -> None:
    await proxied.put(seaweed_bucket, "k", b"x")
    faulty_proxy.inject(fault, method="GET", times=1000)
    with pytest.raises(expected) as raised:
        await proxied.get_bytes(seaweed_bucket, "k")
    assert type(raised.value) is expected
    assert recorder.last("GetObject") == ("GetObject", expected.code, MAX_ATTEMPTS - 1, 0, 0)
    # (aiohttp may resend a request whose pooled connection was dropped, once per attempt.)
    assert (
        MAX_ATTEMPTS <= faulty_proxy.count("GET", fault=fault) <= (2 if fault == "drop" else 1) * MAX_ATTEMPTS
    )


async def test_a_listing_cut_short_is_retried_whole(
    proxied: S3Backend, faulty_proxy: FaultyProxy, recorder: Recorder, seaweed_bucket: str
) -> None:
    """Listings skip botocore's second XML parse; a listing cut short must still be retried, not read."""
    for i in range(30):
        await proxied.put(seaweed_bucket, f"list/{i:02d}", b"x" * i)
    faulty_proxy.inject("truncate", method="GET", path=r"list-type=2", truncate_at=700, times=1)
    page = await proxied.list(seaweed_bucket, prefix="list/")
    assert [o.key for o in page.objects] == [f"list/{i:02d}" for i in range(30)]
    assert [o.size for o in page.objects] == list(range(30))
    assert [s.fault for s in faulty_proxy.seen if "list-type=2" in s.path] == ["truncate", None]
    head = await proxied.head(seaweed_bucket, "list/07")
    listed = page.objects[7]
    # Timestamps parsed by the standard library: aware, UTC, the same instant HEAD reports (to the second).
    assert listed.last_modified.tzinfo is not None and listed.last_modified.utcoffset() == timedelta(0)
    assert abs((listed.last_modified - head.last_modified).total_seconds()) < 1


async def test_persistent_truncation_gives_clean_error(
    proxied: S3Backend, faulty_proxy: FaultyProxy, seaweed_bucket: str
) -> None:
    await proxied.put(seaweed_bucket, "k", os.urandom(MIB))
    faulty_proxy.inject("truncate", method="GET", truncate_at=1000, times=1000)
    async with await proxied.get(seaweed_bucket, "k") as reader:
        with pytest.raises(errors.ServiceUnavailable):
            await reader.read()
    assert faulty_proxy.count("GET") == MAX_ATTEMPTS


async def test_client_errors_are_not_retried(
    proxied: S3Backend, faulty_proxy: FaultyProxy, recorder: Recorder, seaweed_bucket: str
) -> None:
    with pytest.raises(errors.NoSuchKey):
        await proxied.get(seaweed_bucket, "absent")
    with pytest.raises(errors.NoSuchKey):
        await proxied.head(seaweed_bucket, "absent")
    assert faulty_proxy.count() == 2
    assert recorder.calls == [("GetObject", "NoSuchKey", 0, 0, 0), ("HeadObject", "NoSuchKey", 0, 0, 0)]


async def test_unreachable_store_is_service_unavailable(seaweed: SeaweedFS, recorder: Recorder) -> None:
    backend = await started(seaweed, f"http://127.0.0.1:{free_port()}", recorder, max_attempts=2)
    try:
        with pytest.raises(errors.ServiceUnavailable):
            await backend.ping()
        with pytest.raises(errors.ServiceUnavailable):
            await backend.put("any-bucket", "k", b"x")
        assert recorder.last("PutObject") == ("PutObject", "ServiceUnavailable", 1, 0, 0)
    finally:
        await backend.close()


async def test_wrong_credentials_are_a_server_fault(
    seaweed: SeaweedFS, faulty_proxy: FaultyProxy, recorder: Recorder, seaweed_bucket: str
) -> None:
    backend = await started(seaweed, faulty_proxy.endpoint, recorder, secret_key="wrong-secret")
    try:
        with pytest.raises(s3errors.BackendRefused) as exc:
            await backend.get_bytes(seaweed_bucket, "k")
        assert (exc.value.code, exc.value.status) == ("ServiceUnavailable", 503)  # the store, not the client
        assert "refused tsproxy's credentials" in str(exc.value)
        assert faulty_proxy.count() == 1  # not retried
    finally:
        await backend.close()


async def test_read_only_credentials_get_access_denied(
    seaweed: SeaweedFS, recorder: Recorder, seaweed_bucket: str
) -> None:
    backend = await started(
        seaweed, seaweed.endpoint, recorder, access_key=seaweed.readonly_access_key,
        secret_key=seaweed.readonly_secret_key,
    )  # fmt: skip
    try:
        with pytest.raises(errors.AccessDenied):
            await backend.put(seaweed_bucket, "k", b"x")
        await backend.ping()  # a store that answers, even "no", is up
    finally:
        await backend.close()


# -- multipart, failure and recovery ------------------------------------------------------------------


async def test_failed_part_aborts_the_upload(
    seaweed: SeaweedFS, faulty_proxy: FaultyProxy, recorder: Recorder, seaweed_bucket: str
) -> None:
    backend = await started(seaweed, faulty_proxy.endpoint, recorder, part_size=5 * MIB)
    try:
        faulty_proxy.inject("internal_error", method="PUT", path=r"[?&]partNumber=2(&|$)", times=1000)
        with pytest.raises(errors.InternalError):
            await backend.put(seaweed_bucket, "k", pieces(os.urandom(12 * MIB), MIB))
        assert faulty_proxy.count("DELETE", path=r"\?uploadId=") == 1
        client = seaweed.boto3_client()
        assert client.list_multipart_uploads(Bucket=seaweed_bucket).get("Uploads", []) == []
        assert client.list_objects_v2(Bucket=seaweed_bucket).get("KeyCount") == 0
    finally:
        await backend.close()


async def test_lost_completion_answer_is_recognised(
    seaweed: SeaweedFS, faulty_proxy: FaultyProxy, recorder: Recorder, seaweed_bucket: str
) -> None:
    backend = await started(seaweed, faulty_proxy.endpoint, recorder, part_size=5 * MIB)
    try:
        # The store completes the upload, but its answer never arrives.
        faulty_proxy.inject("truncate", method="POST", path=r"\?uploadId=", truncate_at=0, times=1)
        data = os.urandom(11 * MIB)
        info = await backend.put(seaweed_bucket, "k", pieces(data, MIB))
        assert info.size == len(data) and info.etag.endswith("-3")
        assert recorder.last("CompleteMultipartUpload")[1:3] == ("ok", 1)
        assert (await backend.get_bytes(seaweed_bucket, "k"))[1] == data
    finally:
        await backend.close()


@pytest.mark.parametrize(
    ("size", "etag_suffix"),
    [(0, ""), (5 * MIB - 1, ""), (5 * MIB, ""), (5 * MIB + 1, "-2"), (10 * MIB, "-2"), (11 * MIB, "-3")],
)
async def test_streamed_puts_use_one_put_up_to_a_part(
    seaweed: SeaweedFS, recorder: Recorder, seaweed_bucket: str, size: int, etag_suffix: str
) -> None:
    backend = await started(seaweed, seaweed.endpoint, recorder, part_size=5 * MIB)
    try:
        data = os.urandom(size)
        info = await backend.put(seaweed_bucket, "k", pieces(data, 700_000))
        assert info.size == size
        if etag_suffix:
            assert info.etag.endswith(etag_suffix)
            assert recorder.ops().count("UploadPart") == int(etag_suffix[1:])
        else:
            assert info.etag == hashlib.md5(data).hexdigest()
            assert recorder.ops() == ["PutObject"]
        assert (await backend.get_bytes(seaweed_bucket, "k"))[1] == data
    finally:
        await backend.close()


async def test_a_bytes_body_over_a_part_is_uploaded_in_parts(
    seaweed: SeaweedFS, recorder: Recorder, seaweed_bucket: str
) -> None:
    backend = await started(seaweed, seaweed.endpoint, recorder, part_size=5 * MIB)
    try:
        data = os.urandom(11 * MIB)
        info = await backend.put(seaweed_bucket, "k", memoryview(data), metadata={"m": "1"})
        assert recorder.ops() == ["CreateMultipartUpload", "UploadPart", "UploadPart", "UploadPart",
                                  "CompleteMultipartUpload", "HeadObject"]  # fmt: skip
        assert info.size == len(data) and info.etag.endswith("-3") and info.metadata == {"m": "1"}
        assert (await backend.get_bytes(seaweed_bucket, "k"))[1] == data
    finally:
        await backend.close()


async def test_uploads_carry_content_md5_and_no_flexible_checksums(
    proxied: S3Backend, faulty_proxy: FaultyProxy, seaweed_bucket: str
) -> None:
    body = os.urandom(1000)
    await proxied.put(seaweed_bucket, "k", body)
    upload_id = await proxied.create_multipart(seaweed_bucket, "mp")
    await proxied.upload_part(seaweed_bucket, "mp", upload_id, 1, body)
    await proxied.abort_multipart(seaweed_bucket, "mp", upload_id)
    puts = [s for s in faulty_proxy.seen if s.method == "PUT"]
    assert len(puts) == 2
    for seen in puts:
        assert seen.headers["content-md5"] == base64.b64encode(hashlib.md5(body).digest()).decode()
        assert seen.headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
        assert "aws-chunked" not in seen.headers.get("content-encoding", "")
        assert not [h for h in seen.headers if h.startswith("x-amz-checksum-") or h == "x-amz-trailer"]
        # A bytes body goes as it is, without first waiting for a 100 Continue.
        assert seen.headers.get("expect") is None


async def test_a_corrupted_upload_is_refused_by_content_md5(
    seaweed: SeaweedFS, recorder: Recorder, seaweed_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = await started(seaweed, seaweed.endpoint, recorder)
    try:
        real_md5 = backend._md5

        async def wrong_md5(data: bytes | bytearray, known: bytes | None = None) -> str | None:
            return await real_md5(bytes(data) + b"!")  # as if the body changed on the way

        monkeypatch.setattr(backend, "_md5", wrong_md5)
        with pytest.raises(errors.BadDigest):
            await backend.put(seaweed_bucket, "k", b"payload")
        with pytest.raises(errors.NoSuchKey):
            await backend.head(seaweed_bucket, "k")
    finally:
        await backend.close()


async def test_large_copy_goes_part_by_part(
    seaweed: SeaweedFS, recorder: Recorder, seaweed_bucket: str
) -> None:
    backend = await started(
        seaweed, seaweed.endpoint, recorder, copy_threshold=6 * MIB, copy_part_size=5 * MIB
    )
    try:
        data = os.urandom(12 * MIB + 17)
        await backend.put(seaweed_bucket, "src", data, metadata={"a": "1"}, content_type="app/x")
        recorder.calls.clear()
        copied = await backend.copy(seaweed_bucket, "src", seaweed_bucket, "dst")
        assert recorder.ops().count("UploadPartCopy") == 3 and "CopyObject" not in recorder.ops()
        assert copied.size == len(data)
        head = await backend.head(seaweed_bucket, "dst")
        assert head.metadata == {"a": "1"} and head.content_type == "app/x"
        assert (await backend.get_bytes(seaweed_bucket, "dst"))[1] == data
        small = await backend.copy(seaweed_bucket, "src", seaweed_bucket, "dst2", metadata={"b": "2"})
        assert small.metadata == {"b": "2"}
    finally:
        await backend.close()


# -- batching -----------------------------------------------------------------------------------------


async def test_delete_many_batches_and_handles_keys_xml_cannot_carry(
    proxied: S3Backend, faulty_proxy: FaultyProxy, seaweed_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_module, "DELETE_BATCH", 3)
    keys = [f"k{i}" for i in range(7)] + ["\uffff", "tab\x01"]
    for key in keys:
        await proxied.put(seaweed_bucket, key, b"x")
    assert await proxied.delete_many(seaweed_bucket, keys) == []
    assert faulty_proxy.count("POST", path=r"\?delete") == 3
    assert (await proxied.list(seaweed_bucket)).objects == []


async def test_on_request_reports_bytes_and_operations(
    proxied: S3Backend, recorder: Recorder, seaweed_bucket: str
) -> None:
    await proxied.put(seaweed_bucket, "k", b"12345")
    await proxied.get_bytes(seaweed_bucket, "k", 1, 3)
    await proxied.list(seaweed_bucket)
    await proxied.delete(seaweed_bucket, "k")
    assert recorder.calls == [
        ("PutObject", "ok", 0, 0, 5),
        ("GetObject", "ok", 0, 3, 0),
        ("ListObjectsV2", "ok", 0, 0, 0),
        ("DeleteObject", "ok", 0, 0, 0),
    ]


@dataclass
class Admissions:
    """A request observer that records each request it lets go, and passes reports to a Recorder."""

    recorder: Recorder
    admitted: list[str] = field(default_factory=list)

    async def before(self, operation: str) -> None:
        self.admitted.append(operation)

    def after(self, op: str, outcome: str, seconds: float, retries: int, b_in: int, b_out: int) -> None:
        self.recorder(op, outcome, seconds, retries, b_in, b_out)


async def test_every_request_the_store_sees_was_admitted_first(
    seaweed: SeaweedFS, faulty_proxy: FaultyProxy, recorder: Recorder, seaweed_bucket: str
) -> None:
    admissions = Admissions(recorder)
    backend = await started(seaweed, faulty_proxy.endpoint, admissions, part_size=5 * MIB)  # type: ignore[arg-type]
    try:
        data = os.urandom(11 * MIB)
        await backend.put(seaweed_bucket, "big", pieces(data, MIB))  # multipart, HEAD after completion
        faulty_proxy.inject("slowdown", method="GET", times=1)
        faulty_proxy.inject("truncate", method="GET", truncate_at=MIB + 5, times=2)
        assert (await backend.get_bytes(seaweed_bucket, "big"))[1] == data  # one retry, two resumptions
        await backend.copy(seaweed_bucket, "big", seaweed_bucket, "copy")  # HEAD, then CopyObject
        await backend.delete_many(seaweed_bucket, ["big", "copy"])
    finally:
        await backend.close()
    assert len(admissions.admitted) == len(faulty_proxy.seen)
    assert admissions.admitted.count("GetObject") == faulty_proxy.count("GET") == 4
    assert admissions.admitted.count("HeadObject") == faulty_proxy.count("HEAD") == 2
    # Reports stay one per operation, its retries and resumptions counted in it.
    assert recorder.last("GetObject") == ("GetObject", "ok", 3, len(data), 0)
    assert recorder.ops().count("HeadObject") == 2


async def test_seaweed_counts_the_requests_it_served(
    seaweed: SeaweedFS, seaweed_backend: S3Backend, seaweed_bucket: str
) -> None:
    """The fixture's own promise: request_count sees each backend GET (others rely on it)."""
    await seaweed_backend.put(seaweed_bucket, "k", b"x")
    before = seaweed.request_count("GET", bucket=seaweed_bucket)
    for _ in range(3):
        await seaweed_backend.get_bytes(seaweed_bucket, "k")
    assert seaweed.request_count("GET", bucket=seaweed_bucket) - before == 3
