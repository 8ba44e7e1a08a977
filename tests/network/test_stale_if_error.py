"""A store outage is not an object change (DESIGN.md, invariant 10): an object whose manifest and chunks
are cached stays readable for as long as the store cannot be asked whether it changed, while writes and
reads of what is not cached fail fast with 503 and Retry-After. The outage here lasts several times
`metadata_ttl`, the point at which a cached manifest is due to be checked again."""

from __future__ import annotations

import os
import time
import urllib.request

import pytest
from botocore.exceptions import ClientError

from tests.network.conftest import Via
from tests.network.net_helpers import assert_unavailable, backend_up, client, read_verified
from tests.support.toxiproxy import Link
from tests.support.waiting import eventually

BUCKET = "stale"
TTL = 1.0
OUTAGE = 6 * TTL


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_cached_object_stays_readable_through_an_outage_longer_than_metadata_ttl(
    store_link: Link, via: Via
) -> None:
    running = via(store_link.endpoint, metadata_ttl=f"{TTL}s", prefetch="0")
    s3 = client(running)
    s3.create_bucket(Bucket=BUCKET)
    warm, cold = os.urandom(1 << 20), os.urandom(300_000)
    s3.put_object(Bucket=BUCKET, Key="warm", Body=warm)
    s3.put_object(Bucket=BUCKET, Key="cold", Body=cold)
    read_verified(s3, BUCKET, "warm", warm)  # its manifest and every chunk now cached

    store_link.disable()
    ends = time.monotonic() + OUTAGE
    reads = 0
    while time.monotonic() < ends:
        read_verified(s3, BUCKET, "warm", warm, 1000 + reads, 200_000 + reads)
        reads += 1
        time.sleep(0.25)
    read_verified(s3, BUCKET, "warm", warm)
    for fails_fast in (
        lambda: s3.get_object(Bucket=BUCKET, Key="cold")["Body"].read(),
        lambda: s3.put_object(Bucket=BUCKET, Key="new", Body=b"n" * 1000),
    ):
        with pytest.raises(ClientError) as exc:
            fails_fast()
        assert_unavailable(exc)
    with urllib.request.urlopen(f"{running.metrics_url}/readyz", timeout=10) as ready:
        assert ready.status == 200

    store_link.enable()
    deadline = time.monotonic() + 30
    while True:
        try:
            read_verified(s3, BUCKET, "cold", cold)
            break
        except ClientError as e:
            assert_unavailable(e)
            assert time.monotonic() < deadline, "the store did not come back"
            time.sleep(0.2)
    eventually(lambda: backend_up(running) == 1, what="the store not seen back")
