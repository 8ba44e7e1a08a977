"""The hostile suite: tsproxy probed as a hostile S3 client and a hostile neighbour on its node.

Each test replays one attack against real parts (SeaweedFS from tests/support, the local directory
backend, a real tsproxy in a thread) and fails if the attack works again. Attacks that already held
when this suite was written are kept where they were first tested, not copied here:

- internal keys spelled with `/`, `//`, `./`, `..`, `%2F` and the reserved names, driven through every
  object operation: tests/server/test_reserved_namespace.py (with `\\` spellings added there too);
- the key mapping's properties (injective, reversible, never reserved): tests/service/test_namespace.py;
- forged, replayed and foreign upload tickets: tests/service/test_tickets.py;
- spliced, swapped, moved and truncated chunks, foreign tails: tests/format/test_format_tamper.py;
- cache entries swapped between keys or bit-flipped: tests/cache/test_cache_chunks.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import start_proxy
from tests.server.harness import RunningProxy


class Restartable:
    """A tsproxy that can be stopped and started again on the same backend, key ring and cache."""

    def __init__(self, kind: str, tmp: Path, request: pytest.FixtureRequest, **settings: Any) -> None:
        self.kind, self.tmp, self.request, self.settings = kind, tmp, request, settings
        tmp.mkdir(parents=True, exist_ok=True)
        self.running: RunningProxy | None = start_proxy(kind, tmp, request, **settings)

    @property
    def proxy(self) -> RunningProxy:
        assert self.running is not None
        return self.running

    def client(self, **config: Any) -> Any:
        return self.proxy.client(**config)

    def restart(self) -> None:
        self.stop()
        self.running = start_proxy(self.kind, self.tmp, self.request, **self.settings)

    def stop(self) -> None:
        if self.running is not None:
            self.running.stop()
            self.running = None


@pytest.fixture
def restartable(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A factory of Restartable proxies, all stopped after the test."""
    started: list[Restartable] = []

    def make(kind: str, **settings: Any) -> Restartable:
        proxy = Restartable(kind, tmp_path / f"{kind}-{len(started)}", request, **settings)
        started.append(proxy)
        return proxy

    yield make
    for proxy in started:
        proxy.stop()
