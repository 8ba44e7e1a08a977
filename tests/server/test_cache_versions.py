"""Cached chunks belong to one stored version: two completions of one upload never share entries.

Both completions of one multipart upload seal their chunks under the upload's object id, so the object
id alone does not tell their versions apart when a part was re-sent between them. A store that holds
each completion at its last step lets the test order them: the first lands and is read (filling the
chunk caches), then the second, with the re-sent part, replaces it and must read as itself.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.server.conftest import _ring
from tests.server.harness import RunningProxy
from tsproxy.server import Proxy, create_metrics_app, create_runner
from tsproxy.store.base import ObjectInfo
from tsproxy.store.local import LocalBackend

MIB = 1 << 20


class HeldCompletions(LocalBackend):
    """The local store, holding the first two CompleteMultipartUploads of `key` (one per client
    completion) until the test lets each go; any later one (the second completion building its object
    anew after the first took the upload's backend upload) goes through."""

    def __init__(self, root: Path, key: str) -> None:
        super().__init__(root)
        self.key = key
        self.arrived = threading.Semaphore(0)
        self.held: list[threading.Event] = []

    async def complete_multipart(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        parts: Sequence[tuple[int, str]],
        *,
        size: int | None = None,
    ) -> ObjectInfo:
        if key == self.key and len(self.held) < 2:
            go = threading.Event()
            self.held.append(go)
            self.arrived.release()
            await asyncio.to_thread(go.wait, 60)
        return await super().complete_multipart(bucket, key, upload_id, parts, size=size)


class HeldProxy(RunningProxy):
    """A running tsproxy over a given store (the harness opens its own otherwise)."""

    def __init__(self, settings: dict[str, Any], store: HeldCompletions) -> None:
        self.store = store
        super().__init__(settings)

    async def _start(self) -> Proxy:
        proxy = Proxy(self.cfg, backend=self.store)
        await proxy.start()
        self._runner = create_runner(proxy, shutdown_timeout=5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        self._metrics_runner = web.AppRunner(create_metrics_app(proxy), access_log=None)
        await self._metrics_runner.setup()
        await web.TCPSite(self._metrics_runner, "127.0.0.1", self.metrics_port).start()
        return proxy


@pytest.fixture(params=[True, False], ids=["encrypted", "plain"])
def held(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HeldProxy]:
    key = "topic-0/00000000000000000000.log"
    store = HeldCompletions(tmp_path / "data", key)
    running = HeldProxy(
        {
            "backend": f"file://{tmp_path / 'data'}",
            "cache_dir": str(tmp_path / "cache"),
            "key_ring": str(_ring(tmp_path)),
            "encryption": request.param,
            "chunk_size": "256KiB",
            "metadata_ttl": "0s",
            "janitor_interval": "0s",
        },
        store,
    )
    yield running
    for go in store.held:
        go.set()
    running.stop()


def test_overlapping_completions_with_a_resent_part_never_read_each_others_bytes(held: HeldProxy) -> None:
    store = held.store
    s3 = held.client()
    bucket, key = f"c-{uuid.uuid4().hex[:12]}", store.key
    s3.create_bucket(Bucket=bucket)
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    first, second_a, second_b = os.urandom(5 * MIB), os.urandom(300_000), os.urandom(300_000)

    def send(no: int, body: bytes) -> str:
        etag: str = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=no, Body=body)["ETag"]
        return etag

    e1, e2a = send(1, first), send(2, second_a)
    answers: dict[str, str] = {}

    def complete(name: str, etag2: str) -> None:
        answers[name] = s3.complete_multipart_upload(
            Bucket=bucket,
            Key=key,
            UploadId=upload,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": etag2}]},
        )["ETag"]

    a = threading.Thread(target=complete, args=("a", e2a))
    a.start()
    assert store.arrived.acquire(timeout=60)  # completion A has assembled, and waits to land
    e2b = send(2, second_b)  # the part re-sent, while A is in flight
    b = threading.Thread(target=complete, args=("b", e2b))
    b.start()
    assert store.arrived.acquire(timeout=60)  # completion B, with the new part, waits too

    store.held[0].set()
    a.join(60)
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == first + second_a  # cached now
    store.held[1].set()
    b.join(60)

    assert answers["a"] != answers["b"]
    winner = s3.head_object(Bucket=bucket, Key=key)["ETag"]
    expected = {answers["a"]: first + second_a, answers["b"]: first + second_b}[winner]
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == expected
    tail = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={len(first)}-")["Body"].read()
    assert tail == expected[len(first) :]
