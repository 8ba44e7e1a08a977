"""A quiet server gives back the free memory its heaps kept for the next upload (tsproxy/memory.py)."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest

from tests.server.conftest import start_proxy
from tests.server.harness import RunningProxy


def releases(running: RunningProxy) -> float:
    text = urllib.request.urlopen(running.metrics_url + "/metrics").read().decode()
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("tsproxy_memory_releases_total{")
    )


def wait_for_releases(running: RunningProxy, count: float, limit: float = 30) -> None:
    deadline = time.monotonic() + limit
    while releases(running) < count:
        assert time.monotonic() < deadline, f"no memory release {limit}s after the server went quiet"
        time.sleep(0.05)


def test_a_quiet_spell_after_requests_releases_once(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    running = start_proxy("local", tmp_path, request, malloc_idle_release="200ms")
    try:
        client = running.client()
        time.sleep(0.6)  # quiet, but no request has run yet: nothing to give back
        assert releases(running) == 0
        client.create_bucket(Bucket="quiet")
        client.put_object(Bucket="quiet", Key="k", Body=b"x" * (3 << 20))
        wait_for_releases(running, 1)
        time.sleep(0.6)  # three quiet periods more, no request in them
        assert releases(running) == 1
        assert client.get_object(Bucket="quiet", Key="k")["Body"].read() == b"x" * (3 << 20)
        wait_for_releases(running, 2)
    finally:
        running.stop()


def test_zero_turns_it_off(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    running = start_proxy("local", tmp_path, request, malloc_idle_release="0")
    try:
        assert running.proxy.idle is None
        running.client().create_bucket(Bucket="quiet")
        assert releases(running) == 0
    finally:
        running.stop()
