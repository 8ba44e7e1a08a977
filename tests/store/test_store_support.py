"""The test support everyone relies on: SeaweedFS instances side by side, the proxy, free ports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.faulty_proxy import FaultyProxy
from tests.support.ports import _ephemeral_low, free_port, free_port_pair, free_ports_with_offset, is_free
from tests.support.seaweed import GRPC_OFFSET, SeaweedFS

ROOT = Path(__file__).resolve().parents[2]


def test_free_ports() -> None:
    port = free_port()
    assert is_free(port)
    low, high = free_port_pair(10000)
    assert high == low + 10000 and is_free(low) and is_free(high)
    assert high < _ephemeral_low()
    ports = free_ports_with_offset(4)
    taken = set(ports) | {p + 10000 for p in ports}
    assert len(taken) == 8


def test_a_second_seaweed_runs_beside_the_first(seaweed: SeaweedFS) -> None:
    with SeaweedFS.start() as other:
        assert not set(other.ports.values()) & set(seaweed.ports.values())
        bucket = other.new_bucket()
        before = other.request_count("PUT", bucket=bucket)
        other.boto3_client().put_object(Bucket=bucket, Key="k", Body=b"only here")
        names = [b["Name"] for b in seaweed.boto3_client().list_buckets().get("Buckets", [])]
        assert bucket not in names
        assert other.request_count("PUT", bucket=bucket) == before + 1
        # Signatures are checked.
        stranger = other.boto3_client(readonly=True)
        with pytest.raises(Exception, match="AccessDenied"):
            stranger.put_object(Bucket=bucket, Key="k2", Body=b"x")
        process, base_dir, ports = other.process, other.base_dir, dict(other.ports)
    assert process.poll() is not None
    assert not base_dir.exists()
    tmp = Path(tempfile.gettempdir())
    for port in ports.values():
        assert not list(tmp.glob(f"seaweedfs-*-{port}.sock"))
        assert not list(tmp.glob(f"seaweedfs-*-{port + GRPC_OFFSET}.sock"))
    assert seaweed.running


def test_seaweed_dies_with_a_killed_test_process(tmp_path: Path) -> None:
    """A test run killed outright (no atexit, no fixture teardown) leaves no SeaweedFS behind."""
    info = tmp_path / "weed.json"
    script = textwrap.dedent(
        f"""
        import json, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from tests.support.seaweed import SeaweedFS
        weed = SeaweedFS.start(base_dir=__import__("pathlib").Path({str(tmp_path / "weed")!r}))
        open({str(info)!r}, "w").write(json.dumps({{"pid": weed.process.pid}}))
        time.sleep(600)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 120
        while not info.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert info.exists(), "the child did not start SeaweedFS"
        weed_pid = json.loads(info.read_text())["pid"]
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
        deadline = time.monotonic() + 30
        while _alive(weed_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(weed_pid)
    finally:
        if child.poll() is None:
            child.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_threaded_proxy_for_synchronous_clients(seaweed: SeaweedFS, seaweed_bucket: str) -> None:
    with FaultyProxy.threaded(seaweed.endpoint) as proxy:
        client = seaweed.boto3_client(proxy.endpoint, retries={"total_max_attempts": 3, "mode": "standard"})
        proxy.inject("slowdown", method="PUT", path=r"/k$", times=1)
        client.put_object(Bucket=seaweed_bucket, Key="k", Body=b"through the proxy")
        proxy.inject("delay", method="GET", delay=0.01)
        body = client.get_object(Bucket=seaweed_bucket, Key="k")["Body"].read()
        assert body == b"through the proxy"
        assert proxy.count("PUT", fault="slowdown") == 1 and proxy.count("PUT", fault=None) == 1
        assert proxy.count("GET", fault="delay") == 1
        # The Host header went through unchanged, which is what lets the signature pass.
        assert {s.headers["host"] for s in proxy.seen} == {proxy.endpoint.removeprefix("http://")}
        proxy.clear()
        assert proxy.seen == [] and proxy.rules == []
