"""Helpers of the jobs tests: job options for the test SeaweedFS, and test data."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from tests.support.seaweed import SeaweedFS
from tsproxy.jobs.options import JobOptions


def weed_options(weed: SeaweedFS, bucket: str, ring: Path | None, **changes: Any) -> JobOptions:
    """Job options for a bucket in the test SeaweedFS."""
    return JobOptions(
        backend=weed.endpoint,
        bucket=bucket,
        key_ring=str(ring) if ring else None,
        region=weed.region,
        access_key=weed.access_key,
        secret_key=weed.secret_key,
        max_attempts=2,
        **changes,
    )


def records(size: int, seed: int) -> bytes:
    """Compressible, Kafka-like bytes (JSON lines), different per seed."""
    rng = random.Random(seed)
    out = bytearray()
    i = 0
    while len(out) < size:
        out += b'{"offset":%d,"user":"u%05d","amount":%d}\n' % (i, rng.randrange(99999), rng.randrange(10**6))
        i += 1
    return bytes(out[:size])
