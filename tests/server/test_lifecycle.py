"""The real `tsproxy serve` process: dev defaults, config errors, health, graceful shutdown on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import urllib3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from tests.support.ports import free_port

http = urllib3.PoolManager(retries=False)


class Served:
    def __init__(
        self, proc: subprocess.Popen[str], cwd: Path, port: int, metrics_port: int, banner: str
    ) -> None:
        self.proc, self.cwd, self.port, self.metrics_port, self.banner = proc, cwd, port, metrics_port, banner
        self.endpoint = f"http://127.0.0.1:{port}"


def _serve(cwd: Path, *args: str, env: dict[str, str] | None = None) -> Served:
    port, metrics_port = free_port(), free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TSPROXY_")}
    environment.update(env or {})
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tsproxy.cli",
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics-listen",
            f"127.0.0.1:{metrics_port}",
            *args,
        ],
        cwd=cwd,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    banner = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        banner.append(line)
        if '"msg": "tsproxy serving S3"' in line:
            return Served(proc, cwd, port, metrics_port, "".join(banner))
    proc.kill()
    raise AssertionError("tsproxy did not start: " + "".join(banner))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = _serve(tmp_path, "--cache-size", "64MiB")
    yield s
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait()


def _client(s: Served) -> object:
    return boto3.client(
        "s3",
        endpoint_url=s.endpoint,
        aws_access_key_id="tsproxy-dev",
        aws_secret_access_key="tsproxy-dev-secret-key",
        region_name="us-east-1",
        config=BotoConfig(retries={"max_attempts": 1}),
    )


def test_dev_defaults_print_how_to_connect(served: Served, tmp_path: Path) -> None:
    start = json.loads(served.banner.splitlines()[-1])  # one JSON log line
    assert start["logger"] == "tsproxy.server" and start["level"] == "info"
    assert "AWS_ACCESS_KEY_ID=tsproxy-dev" in start["development_defaults"]
    assert start["key_ring_state"].startswith("generated")
    assert served.endpoint in served.banner
    s3 = _client(served)
    s3.create_bucket(Bucket="demo")  # type: ignore[attr-defined]
    s3.put_object(Bucket="demo", Key="hello", Body=b"world")  # type: ignore[attr-defined]
    assert s3.get_object(Bucket="demo", Key="hello")["Body"].read() == b"world"  # type: ignore[attr-defined]
    assert (tmp_path / "tsproxy-data-dev-keyring.json").exists()
    assert http.request("GET", f"http://127.0.0.1:{served.metrics_port}/healthz").status == 200
    ready = http.request("GET", f"http://127.0.0.1:{served.metrics_port}/readyz")
    assert ready.status == 200, ready.data
    metrics = http.request("GET", f"http://127.0.0.1:{served.metrics_port}/metrics").data.decode()
    assert 'tsproxy_requests_total{operation="PutObject",status="200"} 1.0' in metrics


def _free_ports() -> list[str]:
    return ["--listen", f"127.0.0.1:{free_port()}", "--metrics-listen", f"127.0.0.1:{free_port()}"]


def test_bad_config_is_one_clear_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tsproxy.cli", "serve", *_free_ports(), "--chunk-size", "12KiB"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "tsproxy: config: chunk_size (--chunk-size): must be between 64KiB and 64MiB"
    ]
    (tmp_path / "bad.toml").write_text("cache_size = 'lots'\n")
    proc = subprocess.run(
        [sys.executable, "-m", "tsproxy.cli", "serve", *_free_ports(), "--config", "bad.toml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        proc.returncode == 2 and "cache_size (bad.toml)" in proc.stderr and len(proc.stderr.splitlines()) == 1
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tsproxy.cli", "serve", *_free_ports(), "--backend", "http://127.0.0.1:1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "credentials" in proc.stderr


def test_sigterm_during_upload_is_clean(served: Served) -> None:
    """A PUT in flight when SIGTERM arrives either completes whole or fails cleanly: never half-written."""
    s3 = _client(served)
    s3.create_bucket(Bucket="drain")  # type: ignore[attr-defined]
    outcome: dict[str, object] = {}
    data = os.urandom(48 << 20)

    def slow_body() -> Iterator[bytes]:
        for i in range(0, len(data), 1 << 20):
            time.sleep(0.02)
            yield data[i : i + (1 << 20)]

    def upload() -> None:
        conn = urllib3.PoolManager(retries=False)
        url = s3.generate_presigned_url("put_object", Params={"Bucket": "drain", "Key": "big"}, ExpiresIn=300)  # type: ignore[attr-defined]
        try:
            resp = conn.request(
                "PUT", url, body=slow_body(), headers={"Content-Length": str(len(data))}, preload_content=True
            )
            outcome["status"] = resp.status
        except Exception as e:  # a cut connection is a clean failure for the client
            outcome["error"] = e

    t = threading.Thread(target=upload)
    t.start()
    time.sleep(0.4)
    served.proc.send_signal(signal.SIGTERM)
    t.join(120)
    assert served.proc.wait(60) == 0
    # Start again on the same data directory and look at what is there.
    again = _serve(served.cwd, "--cache-size", "64MiB")
    try:
        s3b = _client(again)
        try:
            got = s3b.get_object(Bucket="drain", Key="big")["Body"].read()  # type: ignore[attr-defined]
        except (ClientError, BotoCoreError):
            got = None
        if outcome.get("status") == 200:
            assert got == data
        else:
            assert got is None or got == data
    finally:
        again.proc.kill()
        again.proc.wait()


def test_sighup_reloads_the_key_ring(tmp_path: Path) -> None:
    """With the periodic check off, SIGHUP alone makes a newly activated key the one new objects use."""
    from tsproxy.format import KeyRing

    ring = KeyRing.new(key_id="kek-a")
    ring.save(tmp_path / "ring.json")
    s = _serve(tmp_path, "--key-ring", "ring.json", env={"TSPROXY_KEY_RING_CHECK": "0"})
    try:
        metrics_url = f"http://127.0.0.1:{s.metrics_port}/metrics"

        def reloads() -> str:
            text = http.request("GET", metrics_url).data.decode()
            return next(
                line
                for line in text.splitlines()
                if line.startswith('tsproxy_key_ring_reloads_total{outcome="ok"}')
            )

        ring.add(key_id="kek-b")
        ring.activate("kek-b")
        ring.save(tmp_path / "ring.json")
        time.sleep(0.3)
        assert reloads().endswith(" 0.0")  # nothing looks at the file by itself
        s.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while not reloads().endswith(" 1.0"):
            assert time.monotonic() < deadline, "SIGHUP did not reload the key ring"
            time.sleep(0.05)
        assert s.proc.poll() is None  # SIGHUP does not stop the server
        s3 = _client(s)
        s3.create_bucket(Bucket="hup")  # type: ignore[attr-defined]
        s3.put_object(Bucket="hup", Key="k", Body=b"after the reload")  # type: ignore[attr-defined]
        files = [f for f in (tmp_path / "tsproxy-data" / "hup").iterdir() if not f.name.startswith(".")]
        assert len(files) == 1
        stored = files[0].read_bytes()
        assert b"kek-b" in stored and b"kek-a" not in stored  # the manifest names the KEK that wraps its DEK
        assert s3.get_object(Bucket="hup", Key="k")["Body"].read() == b"after the reload"  # type: ignore[attr-defined]
    finally:
        s.proc.kill()
        s.proc.wait()
