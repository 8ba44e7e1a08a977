"""Fixtures: a tsproxy server over the embedded local backend and one over a real SeaweedFS."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.harness import RunningProxy
from tsproxy.format import KeyRing
from tsproxy.store.local import LocalBackend

LISTING_OPERATIONS = ("ListObjectsV2", "GetObject", "HeadObject")


def backend_requests(proxy: RunningProxy, operation: str | None = None) -> float:
    """Backend requests a listing can cause (not the periodic health probes), or of one operation."""
    total = 0.0
    for metric in proxy.proxy.metrics.registry.collect():
        if metric.name != "tsproxy_backend_requests":
            continue
        for sample in metric.samples:
            op = sample.labels.get("operation")
            if sample.name.endswith("_total") and (
                op == operation or (operation is None and op in LISTING_OPERATIONS)
            ):
                total += sample.value
    return total


def write_straight_to_backend(
    kind: str, tmp: Path, request: pytest.FixtureRequest, bucket: str, objects: dict[str, bytes]
) -> None:
    """Objects written into `start_proxy`'s backend past tsproxy, under backend keys as given."""
    if kind == "seaweed":
        client = request.getfixturevalue("seaweed").boto3_client()
        for key, body in objects.items():
            client.put_object(Bucket=bucket, Key=key, Body=body)
        return

    # Straight into the directory, through the backend itself rather than through tsproxy.
    async def put() -> None:
        backend = LocalBackend(tmp / "data")
        await backend.start()
        try:
            for key, body in objects.items():
                await backend.put(bucket, key, body)
        finally:
            await backend.close()

    asyncio.run(put())


def _ring(tmp: Path) -> Path:
    path = tmp / "ring.json"
    if not path.exists():
        KeyRing.new().save(path)
    return path


def start_proxy(kind: str, tmp: Path, request: pytest.FixtureRequest, **settings: Any) -> RunningProxy:
    """Start tsproxy on `kind` ("local" or "seaweed") with test settings."""
    base: dict[str, Any] = {
        "cache_dir": str(tmp / "cache"),
        "key_ring": str(_ring(tmp)),
        "chunk_size": "256KiB",
        "cache_size": "64MiB",
        "metadata_ttl": "0s",
    }
    if kind == "local":
        base["backend"] = f"file://{tmp / 'data'}"
    else:
        weed = request.getfixturevalue("seaweed")
        base.update(
            backend=weed.endpoint, backend_access_key=weed.access_key, backend_secret_key=weed.secret_key
        )
    base.update(settings)
    return RunningProxy(base)


@pytest.fixture(params=["local", "seaweed"])
def proxy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningProxy]:
    running = start_proxy(request.param, tmp_path, request)
    yield running
    running.stop()


@pytest.fixture
def local_proxy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningProxy]:
    running = start_proxy("local", tmp_path, request)
    yield running
    running.stop()


@pytest.fixture
def weed_proxy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningProxy]:
    running = start_proxy("seaweed", tmp_path, request)
    yield running
    running.stop()


@pytest.fixture
def bucket(proxy: RunningProxy) -> str:
    name = f"t-{uuid.uuid4().hex[:16]}"
    proxy.client().create_bucket(Bucket=name)
    return name
