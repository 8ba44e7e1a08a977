"""What every network fault test checks afterwards, and small helpers to watch tsproxy while it works."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.server.harness import ACCESS_KEY, SECRET_KEY, RunningProxy
from tests.support.seaweed import SeaweedFS
from tests.support.waiting import eventually
from tsproxy.service.janitor import Janitor

DAY = 86400.0


def client(running: RunningProxy) -> Any:
    """A boto3 client of `running` that tries each request once (botocore's `max_attempts` counts
    retries, so the harness's client sends a failed request twice), so what the store sees is tsproxy's."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=running.endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}, read_timeout=120),
    )


def s3_error(exc: pytest.ExceptionInfo[ClientError] | ClientError) -> tuple[int, str, str | None]:
    """(HTTP status, S3 error code, Retry-After) of a client error."""
    error = exc.value if isinstance(exc, pytest.ExceptionInfo) else exc
    meta = error.response["ResponseMetadata"]
    return meta["HTTPStatusCode"], error.response["Error"]["Code"], meta["HTTPHeaders"].get("retry-after")


def assert_unavailable(exc: pytest.ExceptionInfo[ClientError] | ClientError) -> None:
    """The answer a client gets while tsproxy cannot reach the store: 503 with Retry-After."""
    status, code, retry_after = s3_error(exc)
    assert (status, code) == (503, "ServiceUnavailable") and retry_after is not None, (status, code)


def retries(running: RunningProxy, operation: str) -> float:
    value = running.proxy.metrics.registry.get_sample_value(
        "tsproxy_backend_retries_total", {"operation": operation}
    )
    return value or 0.0


def backend_up(running: RunningProxy) -> float:
    return running.proxy.metrics.registry.get_sample_value("tsproxy_backend_up") or 0.0


class Background:
    """`work()` on a thread of its own; `result()` waits for it and returns (or raises) what it did."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self._outcome: list[Any] = []
        self._error: list[BaseException] = []

        def run() -> None:
            try:
                self._outcome.append(work())
            except BaseException as e:
                self._error.append(e)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = 120) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the request in the background did not end"
        if self._error:
            raise self._error[0]
        return self._outcome[0]


def store_requests(weed: SeaweedFS, bucket: str, method: str, *, failed: bool = False) -> int:
    """Requests of `method` SeaweedFS has answered for `bucket` now (`failed`: with a status not 2xx).
    A request is counted when it ends, also one whose connection was cut."""
    total = 0.0
    for labels, value in weed.request_samples():
        if labels.get("type") == method and labels.get("bucket") == bucket:
            if not failed or not labels.get("code", "").startswith("2"):
                total += value
    return int(total)


def until_store_saw(count: Callable[[], int], target: int, work: Background, what: str) -> None:
    """Wait until `count()` reaches `target` while `work` still runs (the store saw the request the
    test waits for end before the client's did)."""
    eventually(lambda: count() >= target or work.done, timeout=60, what=what)
    assert count() >= target, f"{what}: the client's request ended first"


def assert_clean(
    running: RunningProxy, weed: SeaweedFS, backend_bucket: str, bucket: str, visible: dict[str, bytes]
) -> None:
    """After the faults: readiness up; every object a client sees reads back whole; and once a janitor
    that takes everything for old has swept, the store holds the bucket's marker, its size catalog and
    those objects, and no multipart upload."""
    with urllib.request.urlopen(f"{running.metrics_url}/readyz", timeout=10) as ready:
        assert ready.status == 200
    s3 = client(running)
    listed = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])}
    assert listed == set(visible)
    for key, data in visible.items():
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data, key
    janitor = Janitor(
        running.proxy.objects,
        leftover_age=60.0,
        metrics=running.proxy.metrics,
        clock=lambda: time.time() + DAY,
    )
    run = running.call(janitor.run_once())
    assert run.failures == []
    store = weed.boto3_client()
    stored = {o["Key"] for o in store.list_objects_v2(Bucket=backend_bucket).get("Contents", [])}
    # The size catalog (service/catalog.py) is state that stays, compacted as it grows; not a leftover.
    stored = {key for key in stored if not key.startswith(f"{bucket}/.tsproxy/catalog/")}
    expected = {f"{bucket}/.tsproxy/bucket"} | {f"{bucket}/{key}" for key in visible}
    assert stored == expected, (sorted(stored - expected), sorted(expected - stored))
    assert store.list_multipart_uploads(Bucket=backend_bucket).get("Uploads", []) == []


def read_verified(
    s3: Any, bucket: str, key: str, data: bytes, start: int = 0, end: int | None = None
) -> bytes:
    """Bytes [start, end) of an object, checked against `data`; a wrong byte fails the test."""
    end = len(data) if end is None else end
    got: bytes = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")["Body"].read()
    assert got == data[start:end], f"bytes {start}-{end - 1} of {key} read back wrong"
    return got
