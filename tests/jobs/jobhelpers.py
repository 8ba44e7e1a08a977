"""Helpers of the jobs tests: job options for the test SeaweedFS, and test data."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.support.seaweed import SeaweedFS
from tsproxy.config import Config
from tsproxy.jobs.options import JobOptions


def weed_options(
    weed: SeaweedFS,
    bucket: str,
    ring: Path | None,
    *,
    settings: Mapping[str, Any] | None = None,
    **job: Any,
) -> JobOptions:
    """Job options for a bucket in the test SeaweedFS; `settings` are Config values, `job` the job's own."""
    cfg = Config(
        backend=weed.endpoint,
        key_ring=ring,
        backend_region=weed.region,
        backend_access_key=weed.access_key,
        backend_secret_key=weed.secret_key,
        backend_max_attempts=2,
        **(settings or {}),
    )
    return JobOptions.from_config(cfg, bucket, **job)


def records(size: int, seed: int) -> bytes:
    """Compressible, Kafka-like bytes (JSON lines), different per seed."""
    rng = random.Random(seed)
    out = bytearray()
    i = 0
    while len(out) < size:
        out += b'{"offset":%d,"user":"u%05d","amount":%d}\n' % (i, rng.randrange(99999), rng.randrange(10**6))
        i += 1
    return bytes(out[:size])
