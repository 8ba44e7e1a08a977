"""Fixtures: a tsproxy server over the embedded local backend and one over a real SeaweedFS."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.server.harness import RunningProxy
from tsproxy.format import KeyRing
from tsproxy.store.local import LocalBackend


def write_straight_to_backend(
    kind: str, tmp: Path, request: pytest.FixtureRequest, bucket: str, objects: dict[str, bytes]
) -> None:
    """Objects written into `start_proxy`'s backend past tsproxy, under backend keys as given."""
    if kind == "seaweed":
        weed = request.getfixturevalue("seaweed")
        client = boto3.client(
            "s3",
            endpoint_url=weed.endpoint,
            aws_access_key_id=weed.access_key,
            aws_secret_access_key=weed.secret_key,
            region_name="us-east-1",
        )
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
