"""Fixtures of the jobs tests: one SparkSession (local[2]) for the whole run, and job options for a
bucket in the session's SeaweedFS or in a local directory."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.seaweed import SeaweedFS
from tsproxy.format import KeyRing
from tsproxy.jobs.options import JobOptions


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession shared by every jobs test (the JVM takes seconds to start)."""
    from tsproxy.jobs.session import spark_session

    session = spark_session("local[2]", app_name="tsproxy-jobs-tests", conf={"spark.ui.enabled": "false"})
    yield session
    session.stop()


@pytest.fixture
def ring_path(tmp_path: Path) -> Path:
    """A key ring file holding one key, "kek-a", active."""
    path = tmp_path / "ring.json"
    KeyRing.new(key_id="kek-a").save(path)
    return path


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
