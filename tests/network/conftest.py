"""A network between tsproxy and a real SeaweedFS: toxiproxy for what TCP does (latency, resets, stalls,
the store gone), the faulty HTTP layer for what the store answers (SlowDown, 500s, bodies cut short).

- `toxiproxy` (session): one toxiproxy server for the run.
- `store_link`: a toxiproxy link to `seaweed`, without toxics; removed after the test.
- `via`: `via(endpoint, **settings)` starts a tsproxy whose backend requests go to `endpoint` (a link or a
  faulty proxy in front of `seaweed`), with fast bounded retries, its own janitor off, and every client
  bucket in one fresh SeaweedFS bucket (`via.backend_bucket`), so the test can see all it left behind.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import start_proxy
from tests.server.harness import RunningProxy
from tests.support.seaweed import SeaweedFS
from tests.support.toxiproxy import Link, Toxiproxy, ToxiproxyError

# Fast, bounded retries: a test of a store that never answers ends within seconds.
FAST_RETRIES = {"backend_max_attempts": "4", "backend_read_timeout": "3s", "backend_connect_timeout": "2s"}


@pytest.fixture(scope="session")
def toxiproxy() -> Iterator[Toxiproxy]:
    server = Toxiproxy.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def store_link(toxiproxy: Toxiproxy, seaweed: SeaweedFS) -> Iterator[Link]:
    link = toxiproxy.link("store-" + uuid.uuid4().hex[:8], seaweed.endpoint)
    yield link
    try:
        link.delete()
    except ToxiproxyError:
        pass


class Via:
    """Starts tsproxy instances over one backend bucket; stops them after the test."""

    def __init__(self, seaweed: SeaweedFS, tmp: Path, request: pytest.FixtureRequest) -> None:
        self.backend_bucket = seaweed.new_bucket("net")
        self._tmp, self._request = tmp, request
        self.started: list[RunningProxy] = []

    def __call__(self, endpoint: str, **settings: Any) -> RunningProxy:
        base = {**FAST_RETRIES, "backend_bucket": self.backend_bucket, "janitor_interval": "0s"}
        where = self._tmp / f"proxy-{len(self.started)}"
        where.mkdir()
        running = start_proxy("seaweed", where, self._request, backend=endpoint, **{**base, **settings})
        self.started.append(running)
        return running


@pytest.fixture
def via(seaweed: SeaweedFS, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Via]:
    made = Via(seaweed, tmp_path, request)
    yield made
    for running in made.started:
        running.stop()
    seaweed.remove_bucket(made.backend_bucket)
