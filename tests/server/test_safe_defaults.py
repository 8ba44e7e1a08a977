"""Safe by default, against real servers: the chunk cache holds no plaintext and is private, a damaged
cache never stops `tsproxy serve`, secrets stay out of the access log however they are spelled, and a
key ring that others may read is refused."""

from __future__ import annotations

import io
import json
import logging
import os
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import urllib3
from botocore.config import Config as BotoConfig

from tests.server.conftest import start_proxy
from tests.server.harness import ACCESS_KEY, SECRET_KEY, RunningProxy, free_port, start_local
from tsproxy.cache.chunks import ChunkCache, ChunkKey
from tsproxy.format import KeyRing
from tsproxy.logs import JsonFormatter

http = urllib3.PoolManager(retries=False)


def _tree(root: Path) -> list[Path]:
    return [root, *sorted(root.rglob("*"))]


def _hits(p: RunningProxy) -> tuple[float, float]:
    m = p.proxy.metrics.cache_requests
    return m.labels("hit")._value.get(), m.labels("miss")._value.get()


# -- §3: the chunk cache at rest ----------------------------------------------------------------------


def test_cache_is_sealed_private_and_survives_a_restart(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Encryption on (the default): no cached byte is plaintext (entries are the stored chunks, sealed
    under the object's DEK), every file is 0600 and every directory 0700 even under umask 000, and a
    restarted server reads the same cache back."""
    marker = b"tsproxy-plaintext-marker:"
    data = b"".join(marker + b"%08d " % i for i in range(60_000))  # ~2 MiB, 8 chunks of 256 KiB
    old_umask = os.umask(0)
    try:
        p = start_proxy("seaweed", tmp_path, request, prefetch="0", memory_cache_size="0")
        try:
            assert p.proxy.cache is not None
            s3 = p.client()
            s3.create_bucket(Bucket="sealed")
            s3.put_object(Bucket="sealed", Key="seg", Body=data)
            assert s3.get_object(Bucket="sealed", Key="seg")["Body"].read() == data
            deadline = time.monotonic() + 20
            while len(p.proxy.cache) < 8:  # cache writes finish after the response
                assert time.monotonic() < deadline, "chunks did not reach the disk cache"
                time.sleep(0.02)
        finally:
            p.stop()
    finally:
        os.umask(old_umask)
    cache_dir = tmp_path / "cache"
    files = [f for f in _tree(cache_dir) if f.is_file()]
    assert len([f for f in files if f.suffix == ".val"]) == 8
    for f in files:
        assert marker not in f.read_bytes(), f
    for path in _tree(cache_dir):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))

    again = start_proxy("seaweed", tmp_path, request, prefetch="0", memory_cache_size="0")
    try:
        assert again.client().get_object(Bucket="sealed", Key="seg")["Body"].read() == data
        assert _hits(again) == (8, 0)  # every chunk from the disk cache, none refetched
        assert again.proxy.metrics.cache_corrupt._value.get() == 0
    finally:
        again.stop()


def test_a_kek_rotation_keeps_the_cache(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Cached chunks are sealed under their object's DEK, not under a key of the cache's own: after
    another KEK is activated and tsproxy restarts, every entry still serves, none counts as damage."""
    data = os.urandom(1 << 20)  # 4 chunks of 256 KiB
    p = start_proxy("local", tmp_path, request, prefetch="0", memory_cache_size="0")
    try:
        s3 = p.client()
        s3.create_bucket(Bucket="rotated")
        s3.put_object(Bucket="rotated", Key="seg", Body=data)
        assert s3.get_object(Bucket="rotated", Key="seg")["Body"].read() == data
        cache = p.proxy.cache
        assert cache is not None
        deadline = time.monotonic() + 20
        while len(cache) < 4:  # cache writes finish after the response
            assert time.monotonic() < deadline, "chunks did not reach the disk cache"
            time.sleep(0.02)
    finally:
        p.stop()
    ring_path = tmp_path / "ring.json"
    ring = KeyRing.load(ring_path)
    ring.activate(ring.add(key_id="kek-next"))
    ring.save(ring_path)

    again = start_proxy("local", tmp_path, request, prefetch="0", memory_cache_size="0")
    try:
        assert again.proxy.keyring is not None and again.proxy.keyring.active_id == "kek-next"
        assert again.client().get_object(Bucket="rotated", Key="seg")["Body"].read() == data
        assert _hits(again) == (4, 0)
        assert again.proxy.metrics.cache_corrupt._value.get() == 0
    finally:
        again.stop()


# -- §4: a damaged cache ------------------------------------------------------------------------------


def _spawn(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], int, int]:
    port, metrics_port = free_port(), free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TSPROXY_")}
    environment.update(env or {})
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "tsproxy.cli", "serve"),
            *("--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}"),
            *args,
        ],
        cwd=cwd,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=open(cwd / "stderr.log", "w"),  # the child holds it
        text=True,
    )
    return proc, port, metrics_port


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[object]:
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int, int]:
        proc, port, metrics_port = _spawn(tmp_path, *args, env=env)
        procs.append(proc)
        assert proc.stdout is not None
        for line in proc.stdout:
            if "tsproxy serving S3" in line:  # the JSON start line
                return proc, port, metrics_port
        proc.wait(30)
        raise AssertionError(f"tsproxy exited {proc.returncode}: {(tmp_path / 'stderr.log').read_text()}")

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _dev_client(port: int) -> object:
    return boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        aws_access_key_id="tsproxy-dev",
        aws_secret_access_key="tsproxy-dev-secret-key",
        region_name="us-east-1",
        config=BotoConfig(retries={"max_attempts": 1}),
    )


def test_damaged_cache_database_is_moved_aside_and_the_server_serves(tmp_path: Path, serve: object) -> None:
    cache_dir = tmp_path / "tsproxy-cache"
    cache = ChunkCache(cache_dir, 64 << 20)
    for n in range(3):
        cache._put_sync(ChunkKey(b"o" * 16, 1, n), os.urandom(100_000))
    cache.close()
    (cache_dir / "cache.db").write_bytes(os.urandom(64 << 10))  # garbage over the database

    _, port, metrics_port = serve("--cache-size", "64MiB")  # type: ignore[operator]
    s3 = _dev_client(port)
    s3.create_bucket(Bucket="after")  # type: ignore[attr-defined]
    s3.put_object(Bucket="after", Key="k", Body=b"served" * 1000)  # type: ignore[attr-defined]
    assert s3.get_object(Bucket="after", Key="k")["Body"].read() == b"served" * 1000  # type: ignore[attr-defined]
    metrics = http.request("GET", f"http://127.0.0.1:{metrics_port}/metrics").data.decode()
    assert 'tsproxy_cache_resets_total{reason="damaged"} 1.0' in metrics

    (aside,) = tmp_path.glob("tsproxy-cache.damaged-*")
    assert sorted(f.name for f in aside.iterdir()) == ["cache.db"]  # kept to look at; no chunk files
    assert (cache_dir / "cache.db").exists()
    logged = [json.loads(line) for line in (tmp_path / "stderr.log").read_text().splitlines()]
    resets = [r for r in logged if r["msg"].startswith("chunk cache damaged")]
    assert len(resets) == 1
    assert resets[0]["level"] == "error" and resets[0]["reason"] == "damaged"
    assert resets[0]["moved_to"] == str(aside) and resets[0]["cache_dir"] == str(cache_dir)


# -- §5: secrets in the access log --------------------------------------------------------------------


@pytest.fixture
def access_log() -> Iterator[io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tsproxy.access")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield out
    logger.removeHandler(handler)
    logger.setLevel(level)


def _presigned(proxy: RunningProxy, signature_version: str) -> str:
    client = boto3.client(
        "s3",
        endpoint_url=proxy.endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
        config=BotoConfig(signature_version=signature_version, s3={"addressing_style": "path"}),
    )
    return str(client.generate_presigned_url("get_object", Params={"Bucket": "logs", "Key": "k"}))


def _logged_gets(access_log: io.StringIO, path: str, want: int) -> list[dict[str, object]]:
    """The access log's GET lines for path, once there are `want` of them (or after 10 s).

    The line is written when the handler returns, which can be just after the client has read the
    whole body: the test waits for the log rather than race it.
    """
    deadline = time.monotonic() + 10
    while True:
        lines = [json.loads(line) for line in access_log.getvalue().splitlines()]
        gets = [r for r in lines if r["method"] == "GET" and r["path"] == path]
        if len(gets) >= want or time.monotonic() > deadline:
            return gets
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("signature_version", "param", "respelled"),
    [("s3v4", "X-Amz-Signature", "X-Amz-Signatur%65"), ("s3", "Signature", "Signatur%65")],
)
def test_presigned_signature_never_reaches_the_access_log(
    local_proxy: RunningProxy, access_log: io.StringIO, signature_version: str, param: str, respelled: str
) -> None:
    local_proxy.client().create_bucket(Bucket="logs")
    local_proxy.client().put_object(Bucket="logs", Key="k", Body=b"body")
    url = _presigned(local_proxy, signature_version)
    signature = url.split(f"{param}=", 1)[1].split("&", 1)[0]
    respelled_url = url.replace(f"{param}=", f"{respelled}=")
    for target in (url, respelled_url):
        response = http.request("GET", target)
        assert response.status == 200, response.data  # S3 decodes the name: this is a signed request
        assert response.data == b"body"
    gets = _logged_gets(access_log, "/logs/k", want=2)
    assert len(gets) == 2
    text = access_log.getvalue()
    assert signature not in text and signature.lower() not in text.lower()
    for r in gets:
        assert f"{param}=***" in r["query"]
        assert r["status"] == 200 and r["access_key"] == ACCESS_KEY
    if signature_version == "s3v4":
        assert "X-Amz-Credential=***" in gets[0]["query"]
    else:
        assert "AWSAccessKeyId=***" in gets[0]["query"]


# -- §6: key ring file permissions --------------------------------------------------------------------


def _ring(path: Path, mode: int) -> Path:
    KeyRing.new().save(path)
    os.chmod(path, mode)
    return path


def _run_serve(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TSPROXY_")}
    environment.update(env or {})
    return subprocess.run(
        [
            *(sys.executable, "-m", "tsproxy.cli", "serve", "--listen", f"127.0.0.1:{free_port()}"),
            *("--metrics-listen", f"127.0.0.1:{free_port()}", *args),
        ],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_world_readable_key_ring_is_refused_in_one_line(tmp_path: Path) -> None:
    ring = _ring(tmp_path / "ring.json", 0o644)
    proc = _run_serve(tmp_path, "--key-ring", "ring.json")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("tsproxy: key ring ring.json: mode 0644 ")
    assert "allow_insecure_key_ring" in line
    assert not (tmp_path / "tsproxy-cache").exists()  # refused before anything else happened
    assert ring.exists()


def test_secret_volume_layout_is_judged_by_the_file_behind_the_links(tmp_path: Path, serve: object) -> None:
    """A Kubernetes Secret volume: keyring.json -> ..data/keyring.json, ..data -> ..2024_01_01/; the
    links themselves are 0777, the file behind them is what counts."""
    mount = tmp_path / "keyring"
    (mount / "..2024_01_01").mkdir(parents=True)
    target = _ring(mount / "..2024_01_01" / "keyring.json", 0o644)
    (mount / "..data").symlink_to("..2024_01_01")
    (mount / "keyring.json").symlink_to("..data/keyring.json")
    proc = _run_serve(tmp_path, "--key-ring", str(mount / "keyring.json"))
    assert proc.returncode == 2 and "mode 0644" in proc.stderr
    os.chmod(target, 0o400)
    _, port, _ = serve("--key-ring", str(mount / "keyring.json"), "--cache-size", "64MiB")  # type: ignore[operator]
    _dev_client(port).create_bucket(Bucket="mounted")  # type: ignore[attr-defined]


@pytest.mark.parametrize("how", ["flag", "env", "toml"])
def test_insecure_key_ring_override(tmp_path: Path, serve: object, how: str) -> None:
    _ring(tmp_path / "ring.json", 0o664)
    args: list[str] = ["--key-ring", "ring.json", "--cache-size", "64MiB"]
    env: dict[str, str] = {}
    if how == "flag":
        args.append("--allow-insecure-key-ring")
    elif how == "env":
        env["TSPROXY_ALLOW_INSECURE_KEY_RING"] = "true"
    else:
        (tmp_path / "tsproxy.toml").write_text("allow_insecure_key_ring = true\n")
        args += ["--config", "tsproxy.toml"]
    _, port, _ = serve(*args, env=env)  # type: ignore[operator]
    s3 = _dev_client(port)
    s3.create_bucket(Bucket="override")  # type: ignore[attr-defined]
    time.sleep(0.1)
    logged = (tmp_path / "stderr.log").read_text()
    assert "key ring accessible to others, accepted" in logged and "mode 0664" in logged


def test_generated_dev_key_ring_is_private(tmp_path: Path, serve: object) -> None:
    serve("--cache-size", "64MiB")  # type: ignore[operator]
    ring = tmp_path / "tsproxy-data-dev-keyring.json"
    assert stat.S_IMODE(ring.stat().st_mode) == 0o600


def test_reload_of_a_ring_others_may_read_keeps_the_ring_in_use(tmp_path: Path) -> None:
    path = _ring(tmp_path / "ring.json", 0o600)
    p = start_local(tmp_path, key_ring_check="50ms")
    try:
        active = p.proxy.keyring.active_id  # type: ignore[union-attr]
        ring = KeyRing.load(path)
        ring.activate(ring.add(key_id="kek-new"))
        os.chmod(path, 0o644)
        path.write_bytes(_saved(ring, tmp_path))  # rewritten in place: keeps mode 0644
        deadline = time.monotonic() + 20
        errors = p.proxy.metrics.key_ring_reloads.labels("error")
        while errors._value.get() < 1:
            assert time.monotonic() < deadline, "the changed ring was not looked at"
            time.sleep(0.05)
        assert p.proxy.keyring.active_id == active  # type: ignore[union-attr]
    finally:
        p.stop()


def _saved(ring: KeyRing, tmp: Path) -> bytes:
    scratch = tmp / f"scratch-{uuid.uuid4().hex}.json"
    ring.save(scratch)
    return scratch.read_bytes()
