"""An object store that is down or refuses tsproxy: tsproxy stays up and ready, says why (a log line and
`tsproxy_backend_up`), and clients get a fast 503 with Retry-After that names the store, never their
own AccessDenied. A fault-injecting proxy in front of a real SeaweedFS plays the outage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import urllib3
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from tests.server.conftest import start_proxy
from tests.server.harness import RunningProxy, free_port
from tests.support.faulty_proxy import FaultyProxy
from tsproxy.format import KeyRing

http = urllib3.PoolManager(retries=False)


def _gauge(metrics_url: str, name: str = "tsproxy_backend_up") -> float:
    text = http.request("GET", f"{metrics_url}/metrics").data.decode()
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


def _wait_for(predicate: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _error(exc: pytest.ExceptionInfo[ClientError]) -> tuple[int, str, str, str | None]:
    resp = exc.value.response
    meta = resp["ResponseMetadata"]
    return (
        meta["HTTPStatusCode"],
        resp["Error"]["Code"],
        resp["Error"].get("Message", ""),
        meta["HTTPHeaders"].get("retry-after"),
    )


# -- a wrong backend secret, through the real `tsproxy serve` ------------------------------------------------


def test_wrong_backend_secret_is_a_503_naming_the_store(tmp_path: Path, seaweed: Any) -> None:
    KeyRing.new().save(tmp_path / "ring.json")
    port, metrics_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TSPROXY_")}
    env.update(
        TSPROXY_ACCESS_KEY="client",
        TSPROXY_SECRET_KEY="client-secret",
        TSPROXY_BACKEND=seaweed.endpoint,
        TSPROXY_BACKEND_ACCESS_KEY=seaweed.access_key,
        TSPROXY_BACKEND_SECRET_KEY="not-the-secret",
    )
    log_path = tmp_path / "stderr.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tsproxy.cli", "serve", "--key-ring", "ring.json",
             "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=log_file, text=True,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["msg"] == "tsproxy serving S3"

        def complaint() -> list[dict[str, Any]]:
            lines = [json.loads(x) for x in log_path.read_text().splitlines() if x.startswith("{")]
            return [x for x in lines if x.get("check") == "credentials"]

        _wait_for(complaint, "the start probe's log line")
        (line,) = complaint()
        assert line["level"] == "error"
        assert line["msg"].startswith(f"backend {seaweed.endpoint} refused tsproxy's credentials")
        _wait_for(lambda: _gauge(f"http://127.0.0.1:{metrics_port}") == 0, "tsproxy_backend_up 0")
        assert proc.poll() is None  # a backend problem never stops the server
        ready = http.request("GET", f"http://127.0.0.1:{metrics_port}/readyz")
        assert ready.status == 200, ready.data

        s3 = boto3.client(
            "s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
            aws_access_key_id="client", aws_secret_access_key="client-secret",
            config=BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )  # fmt: skip
        with pytest.raises(ClientError) as exc:
            s3.put_object(Bucket="any", Key="k", Body=b"x")
        status, code, message, retry_after = _error(exc)
        assert (status, code) == (503, "ServiceUnavailable")
        assert "object store behind tsproxy" in message and retry_after is not None
    finally:
        proc.kill()
        proc.wait()


def test_backend_access_denied_reaches_clients_as_503(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Read-only backend keys: the store answers AccessDenied to a write, the client a 503."""
    weed = request.getfixturevalue("seaweed")
    running = start_proxy(
        "seaweed", tmp_path, request,
        backend_access_key=weed.readonly_access_key, backend_secret_key=weed.readonly_secret_key,
        backend_check="0",
    )  # fmt: skip
    try:
        bucket = weed.new_bucket()
        with pytest.raises(ClientError) as exc:
            running.client().put_object(Bucket=bucket, Key="k", Body=b"x")
        status, code, message, retry_after = _error(exc)
        assert (status, code) == (503, "ServiceUnavailable"), message
        assert "refused tsproxy's credentials (AccessDenied)" in message and retry_after == "1"
    finally:
        running.stop()


# -- an outage, played by a proxy that drops every connection -----------------------------------------------


@pytest.fixture
def faulty(seaweed: Any) -> Iterator[FaultyProxy]:
    with FaultyProxy.threaded(seaweed.endpoint) as fp:
        yield fp


@pytest.fixture
def behind_faults(
    faulty: FaultyProxy, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[RunningProxy]:
    running = start_proxy(
        "seaweed", tmp_path, request, backend=faulty.endpoint, backend_max_attempts="2",
        backend_check="0", metadata_ttl="1h",
    )  # fmt: skip
    yield running
    running.stop()


def test_outage_fails_fast_with_retry_after_and_keeps_readiness(
    behind_faults: RunningProxy, faulty: FaultyProxy
) -> None:
    running, s3 = behind_faults, behind_faults.client()
    health = running.proxy.health
    bucket = "outage"
    s3.create_bucket(Bucket=bucket)
    warm, cold = os.urandom(600_000), os.urandom(300_000)
    s3.put_object(Bucket=bucket, Key="warm", Body=warm)
    s3.put_object(Bucket=bucket, Key="cold", Body=cold)
    assert s3.get_object(Bucket=bucket, Key="warm")["Body"].read() == warm  # now cached
    assert _gauge(running.metrics_url) == 1

    faulty.inject("drop", times=10**6)
    health.trial_every = 3600.0  # no trial request during the test: every refusal below is the breaker's
    for _ in range(health.trip_after):
        with pytest.raises(ClientError) as exc:
            s3.get_object(Bucket=bucket, Key="cold")
        status, code, _, retry_after = _error(exc)
        assert (status, code) == (503, "ServiceUnavailable") and retry_after == "1"
    assert _gauge(running.metrics_url) == 0

    # Down: uncached reads and uploads are refused without a backend request.
    seen = faulty.count()
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="cold")
    status, code, message, retry_after = _error(exc)
    assert (status, code, retry_after) == (503, "ServiceUnavailable", "1")
    assert "object store behind tsproxy is unavailable" in message
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="new", Body=b"y" * 1000)
    assert _error(exc)[:2] == (503, "ServiceUnavailable")
    assert faulty.count() == seen
    # What is cached is still served, and readiness stays up.
    assert s3.get_object(Bucket=bucket, Key="warm", Range="bytes=1000-1999")["Body"].read() == warm[1000:2000]
    ready = http.request("GET", f"{running.metrics_url}/readyz")
    assert ready.status == 200, ready.data

    # The store comes back: the next probe marks it up and requests go through again.
    faulty.clear()
    findings = running.call(running.proxy.probe_backend(write=False))
    assert all(f.ok for f in findings), findings
    assert _gauge(running.metrics_url) == 1
    assert s3.get_object(Bucket=bucket, Key="cold")["Body"].read() == cold


def test_a_trial_request_while_down_closes_the_breaker(
    behind_faults: RunningProxy, faulty: FaultyProxy
) -> None:
    running, s3 = behind_faults, behind_faults.client()
    s3.create_bucket(Bucket="trial")
    s3.put_object(Bucket="trial", Key="k", Body=b"data")
    faulty.inject("drop", times=10**6)
    running.call(running.proxy.probe_backend(write=False))
    assert _gauge(running.metrics_url) == 0
    faulty.clear()
    running.proxy.health.trial_every = 0.0  # the next request is a trial
    assert s3.get_object(Bucket="trial", Key="k")["Body"].read() == b"data"
    assert _gauge(running.metrics_url) == 1
