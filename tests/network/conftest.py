"""A network between tsproxy and a real SeaweedFS: toxiproxy for what TCP does (latency, resets, stalls,
the store gone), the faulty HTTP layer for what the store answers (SlowDown, 500s, bodies cut short).

- `toxiproxy` (session): one toxiproxy server for the run.
- `store_link`: a toxiproxy link to `seaweed`, without toxics; removed after the test.
- `tsproxy_via(backend, tmp, request, **settings)`: a tsproxy on `seaweed` reached through `backend`.
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
FAST_RETRIES = {
    "backend_max_attempts": "4",
    "backend_backoff_base": "20ms",
    "backend_backoff_cap": "200ms",
    "backend_read_timeout": "3s",
    "backend_connect_timeout": "2s",
}


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


def tsproxy_via(backend: str, tmp: Path, request: pytest.FixtureRequest, **settings: Any) -> RunningProxy:
    """tsproxy on the test session's SeaweedFS, its backend requests sent to `backend` (a link or a
    faulty proxy in front of SeaweedFS), with fast bounded retries unless `settings` say otherwise."""
    return start_proxy("seaweed", tmp, request, backend=backend, **{**FAST_RETRIES, **settings})
