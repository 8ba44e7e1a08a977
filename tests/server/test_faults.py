"""Backend failures seen from a client of tsproxy: retried when transient, a clean S3 error when not,
and never a half-written object or wrong bytes. A fault-injecting proxy sits in front of a real
SeaweedFS; the server is never replaced."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.server.conftest import start_proxy
from tests.server.harness import RunningProxy
from tests.support.faulty_proxy import FaultyProxy
from tests.support.waiting import eventually


@pytest.fixture
def faulty(seaweed: Any) -> Iterator[FaultyProxy]:
    with FaultyProxy.threaded(seaweed.endpoint) as fp:
        yield fp


@pytest.fixture
def proxy_via_faults(
    faulty: FaultyProxy, tmp_path: Path, request: pytest.FixtureRequest, seaweed: Any
) -> Iterator[RunningProxy]:
    running = start_proxy(
        "seaweed", tmp_path, request, backend=faulty.endpoint, backend_max_attempts="4", cache_dir="off"
    )
    yield running
    running.stop()


def test_transient_backend_errors_are_retried(proxy_via_faults: RunningProxy, faulty: FaultyProxy) -> None:
    s3 = proxy_via_faults.client()
    s3.create_bucket(Bucket="faults-retry")
    data = os.urandom(700_000)
    # The faults are aimed at the object: tsproxy's own background requests (it lists a bucket's
    # internal prefix and open uploads when it first meets the bucket) are GETs too, and one of them
    # taking the 500 would move its retry out of this read.
    obj = r"^/faults-retry/k(\?|$)"
    faulty.inject("slowdown", method="PUT", path=obj, times=2)
    s3.put_object(Bucket="faults-retry", Key="k", Body=data)
    assert faulty.count(fault="slowdown") == 2
    faulty.inject("internal_error", method="GET", path=obj, times=1)
    faulty.inject("drop", method="GET", path=obj, times=1)
    assert s3.get_object(Bucket="faults-retry", Key="k")["Body"].read() == data
    assert faulty.count(path=obj, fault="internal_error") == 1
    assert faulty.count(path=obj, fault="drop") == 1
    registry = proxy_via_faults.proxy.metrics.registry

    def retried(operation: str) -> float:
        return registry.get_sample_value("tsproxy_backend_retries_total", {"operation": operation}) or 0.0

    assert retried("PutObject") == 2
    # A streamed GET reports its call when its reader closes, which may come just after the client has
    # its last byte. The 500 is retried by tsproxy; a dropped keep-alive connection may be retried by
    # the HTTP client below it, unseen.
    eventually(lambda: retried("GetObject") >= 1, timeout=10, what="the GET's 500 was not counted as a retry")


def test_persistent_backend_failure_is_a_clean_error(
    proxy_via_faults: RunningProxy, faulty: FaultyProxy
) -> None:
    s3 = proxy_via_faults.client()
    s3.create_bucket(Bucket="faults-hard")
    faulty.inject("internal_error", method="PUT", times=100)
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket="faults-hard", Key="k", Body=b"x" * 1000)
    status = exc.value.response["ResponseMetadata"]["HTTPStatusCode"]
    assert status in (500, 503) and exc.value.response["Error"]["Code"] in (
        "InternalError",
        "ServiceUnavailable",
    )
    faulty.clear()
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket="faults-hard", Key="k")
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404  # nothing half-written


def test_truncated_backend_body_never_becomes_wrong_bytes(
    proxy_via_faults: RunningProxy, faulty: FaultyProxy
) -> None:
    s3 = proxy_via_faults.client()
    s3.create_bucket(Bucket="faults-cut")
    data = os.urandom(900_000)
    s3.put_object(Bucket="faults-cut", Key="k", Body=data)
    faulty.inject("truncate", method="GET", truncate_at=1000, times=100)
    try:
        got = s3.get_object(Bucket="faults-cut", Key="k")["Body"].read()
    except Exception:  # an error or a cut response are both honest answers
        return
    assert got == data
