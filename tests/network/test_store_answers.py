"""What a store under strain answers, played by the faulty HTTP layer in front of a real SeaweedFS: bursts
of 503 SlowDown and 500 InternalError, and bodies cut short. tsproxy retries a bounded number of times,
waits longer after SlowDown, never takes throttling for an outage, and never passes a wrong byte on."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.network.conftest import Via
from tests.network.net_helpers import assert_clean, backend_up, client, read_verified, retries, s3_error
from tests.support.faulty_proxy import FaultyProxy
from tests.support.seaweed import SeaweedFS

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
