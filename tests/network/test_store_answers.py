"""What a store under strain answers, played by the faulty HTTP layer in front of a real SeaweedFS: bursts
of 503 SlowDown and 500 InternalError, bodies cut short, and a store that answers 500 to everything.
tsproxy retries a bounded number of times, waits longer after SlowDown, never takes throttling for an
outage, takes a store that only answers server errors for one, and never passes a wrong byte on."""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.network.conftest import Via
from tests.network.net_helpers import (
    assert_clean,
    assert_unavailable,
    backend_up,
    client,
    read_verified,
    retries,
    s3_error,
)
from tests.support.faulty_proxy import FaultyProxy
from tests.support.seaweed import SeaweedFS
from tests.support.waiting import eventually

BUCKET = "answers"
NO_CACHE = {"cache_dir": "off", "memory_cache_size": "0", "prefetch": "0"}
ATTEMPTS = 4
pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def faulty(seaweed: SeaweedFS) -> Iterator[FaultyProxy]:
    with FaultyProxy.threaded(seaweed.endpoint) as proxy:
        yield proxy


def _object_path(via: Via, key: str) -> str:
    """The backend path of a client object (aimed at, so tsproxy's own requests are left alone)."""
    return rf"^/{via.backend_bucket}/{BUCKET}/{key}(\?|$)"


def test_slowdown_bursts_are_retried_and_a_longer_one_is_passed_on_as_slowdown(
    faulty: FaultyProxy, via: Via, seaweed: SeaweedFS
) -> None:
    running = via(faulty.endpoint, backend_max_attempts=str(ATTEMPTS), **NO_CACHE)
    s3 = client(running)
    s3.create_bucket(Bucket=BUCKET)
    data = os.urandom(700_000)
    faulty.inject("slowdown", method="PUT", path=_object_path(via, "k"), times=2)
    s3.put_object(Bucket=BUCKET, Key="k", Body=data)
    faulty.inject("slowdown", method="GET", path=_object_path(via, "k"), times=2)
    read_verified(s3, BUCKET, "k", data)
    assert faulty.count(fault="slowdown") == 4
    assert retries(running, "PutObject") == 2

    # Throttled beyond the attempts: the client is told to slow down too, after exactly ATTEMPTS tries.
    faulty.inject("slowdown", method="PUT", path=_object_path(via, "other"), times=100)
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=BUCKET, Key="other", Body=b"x" * 1000)
    status, code, retry_after = s3_error(exc)
    assert (status, code) == (503, "SlowDown") and retry_after is not None
    assert faulty.count(path=_object_path(via, "other"), fault="slowdown") == ATTEMPTS
    # Throttling is the store answering: not an outage, so nothing is refused for it afterwards.
    assert backend_up(running) == 1
    read_verified(s3, BUCKET, "k", data, 1000, 2000)
    faulty.clear()
    assert_clean(running, seaweed, via.backend_bucket, BUCKET, {"k": data})


def test_internal_error_bursts_are_retried_and_a_longer_one_is_a_clean_500(
    faulty: FaultyProxy, via: Via, seaweed: SeaweedFS
) -> None:
    running = via(faulty.endpoint, backend_max_attempts=str(ATTEMPTS), **NO_CACHE)
    s3 = client(running)
    s3.create_bucket(Bucket=BUCKET)
    data = os.urandom(900_000)
    faulty.inject("internal_error", method="PUT", path=_object_path(via, "k"), times=ATTEMPTS - 1)
    s3.put_object(Bucket=BUCKET, Key="k", Body=data)
    faulty.inject("internal_error", method="GET", path=_object_path(via, "k"), times=ATTEMPTS - 1)
    read_verified(s3, BUCKET, "k", data)

    faulty.inject("internal_error", method="PUT", path=_object_path(via, "never"), times=100)
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=BUCKET, Key="never", Body=os.urandom(10_000))
    assert s3_error(exc)[:2] == (500, "InternalError")
    assert faulty.count(path=_object_path(via, "never"), fault="internal_error") == ATTEMPTS
    faulty.clear()
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=BUCKET, Key="never")
    assert s3_error(exc)[0] == 404  # nothing half written
    assert_clean(running, seaweed, via.backend_bucket, BUCKET, {"k": data})


def test_bodies_cut_short_are_resumed_or_refused_never_wrong(
    faulty: FaultyProxy, via: Via, seaweed: SeaweedFS
) -> None:
    running = via(faulty.endpoint, backend_max_attempts=str(ATTEMPTS), **NO_CACHE)
    s3 = client(running)
    s3.create_bucket(Bucket=BUCKET)
    data = os.urandom(2_000_000)
    s3.put_object(Bucket=BUCKET, Key="k", Body=data)

    # Cut once: the read picks up where the body stopped.
    faulty.inject("truncate", method="GET", path=_object_path(via, "k"), truncate_at=300_000, times=1)
    read_verified(s3, BUCKET, "k", data)
    assert faulty.count(fault="truncate") == 1

    # Cut every time: the client gets an error or a short body, never a wrong byte.
    faulty.inject("truncate", method="GET", path=_object_path(via, "k"), truncate_at=300_000, times=100)
    outcome: Any
    try:
        outcome = s3.get_object(Bucket=BUCKET, Key="k")["Body"].read()
    except ClientError as e:
        outcome = s3_error(e)
        assert outcome[0] in (500, 503), outcome
    except Exception as e:  # a response cut short after its head: the only honest signal left
        outcome = type(e).__name__
    else:
        assert outcome == data
    assert (
        faulty.count(fault="truncate") <= 1 + 2 * ATTEMPTS
    )  # bounded: each backend read tried ATTEMPTS times
    faulty.clear()
    assert_clean(running, seaweed, via.backend_bucket, BUCKET, {"k": data})


def _object_requests(faulty: FaultyProxy, via: Via) -> int:
    """Requests tsproxy sent for objects (anything under the backend bucket), not the probes' bucket HEADs."""
    return faulty.count(path=rf"^/{via.backend_bucket}/")


def _probes_refused(faulty: FaultyProxy, via: Via) -> int:
    return faulty.count(method="HEAD", path=rf"^/{via.backend_bucket}$", fault="internal_error")


def test_a_store_that_answers_500_to_everything_is_down_until_it_serves_again(
    faulty: FaultyProxy, via: Via, seaweed: SeaweedFS
) -> None:
    """Its S3 gateway up, its volumes down: it answers, and serves nothing. `tsproxy_backend_up` stays 0
    while every probe gets a 500, and clients get a 503 with Retry-After without a backend request."""
    running = via(faulty.endpoint, backend_max_attempts=str(ATTEMPTS), backend_check="1s", **NO_CACHE)
    s3 = client(running)
    s3.create_bucket(Bucket=BUCKET)
    data = os.urandom(500_000)
    s3.put_object(Bucket=BUCKET, Key="k", Body=data)
    assert backend_up(running) == 1
    health = running.proxy.health
    health.trial_every = 3600.0  # no trial request but the one the test lets through

    faulty.inject("internal_error", times=10**6)
    eventually(lambda: backend_up(running) == 0, timeout=60, what="a probe answered 500 marks the store down")

    # A trial request gets the store's 500 after its retries: the store stays down, and the client gets
    # the 503 every other request gets (before, any answer counted as the store being back).
    sent = _object_requests(faulty, via)
    health.trial_every = 0.0
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=BUCKET, Key="k")
    health.trial_every = 3600.0
    assert_unavailable(exc)
    assert _object_requests(faulty, via) - sent == ATTEMPTS
    assert backend_up(running) == 0

    # Down: reads and writes are refused at once, without a backend request; the probes go on, get
    # 500s, and the store stays down.
    probes = _probes_refused(faulty, via)
    sent = _object_requests(faulty, via)
    for _ in range(3):
        with pytest.raises(ClientError) as exc:
            s3.get_object(Bucket=BUCKET, Key="k", Range="bytes=0-99")
        assert_unavailable(exc)
        assert "answers 500" in exc.value.response["Error"]["Message"]
        with pytest.raises(ClientError) as exc:
            s3.put_object(Bucket=BUCKET, Key="new", Body=b"n" * 10_000)
        assert_unavailable(exc)
    assert _object_requests(faulty, via) == sent
    eventually(
        lambda: _probes_refused(faulty, via) >= probes + 2 * ATTEMPTS,
        timeout=60,
        what="two more probes answered 500",
    )
    assert backend_up(running) == 0
    with urllib.request.urlopen(f"{running.metrics_url}/readyz", timeout=10) as ready:
        assert ready.status == 200  # tsproxy itself serves: the broker beside it stays in service

    # The store serves again: the next probes find it so, and requests go through.
    faulty.clear()
    eventually(lambda: backend_up(running) == 1, timeout=60, what="the store marked up again")
    read_verified(s3, BUCKET, "k", data)
    assert_clean(running, seaweed, via.backend_bucket, BUCKET, {"k": data})


def test_a_store_that_answers_its_bucket_but_fails_every_object_request_is_down(
    faulty: FaultyProxy, via: Via, seaweed: SeaweedFS
) -> None:
    """The probes ask about the bucket, which such a store answers: requests trip the store down, and a
    passing probe does not bring it back while requests keep failing."""
    running = via(faulty.endpoint, backend_max_attempts=str(ATTEMPTS), backend_check="0", **NO_CACHE)
    s3 = client(running)
    s3.create_bucket(Bucket=BUCKET)
    data = os.urandom(300_000)
    s3.put_object(Bucket=BUCKET, Key="k", Body=data)
    health = running.proxy.health
    health.trial_every = 3600.0
    probe = running.proxy.probe_backend

    faulty.inject("internal_error", path=rf"^/{via.backend_bucket}/", times=10**6)
    outcomes = []
    for _ in range(health.trip_after):
        sent = _object_requests(faulty, via)
        with pytest.raises(ClientError) as exc:
            s3.get_object(Bucket=BUCKET, Key="k")
        outcomes.append(s3_error(exc)[:2])
        assert _object_requests(faulty, via) - sent == ATTEMPTS  # each waited out its retries
    # Two clean 500s, then the third trips the breaker and is the first 503.
    assert outcomes == [(500, "InternalError")] * 2 + [(503, "ServiceUnavailable")]
    assert backend_up(running) == 0
    sent = _object_requests(faulty, via)
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=BUCKET, Key="new", Body=b"n" * 1000)
    assert_unavailable(exc)
    assert _object_requests(faulty, via) == sent

    assert all(f.ok for f in running.call(probe(write=False)))  # the bucket answers ...
    assert backend_up(running) == 0  # ... but requests failed since the probe before
    health.trial_every = 0.0
    with pytest.raises(ClientError) as exc:  # a trial, still failing
        s3.get_object(Bucket=BUCKET, Key="k")
    health.trial_every = 3600.0
    assert_unavailable(exc)
    running.call(probe(write=False))
    assert backend_up(running) == 0

    # The store serves again: the first trial request that succeeds marks it up.
    faulty.clear()
    health.trial_every = 0.0
    read_verified(s3, BUCKET, "k", data)
    assert backend_up(running) == 1
    assert_clean(running, seaweed, via.backend_bucket, BUCKET, {"k": data})
