"""Start-up mistakes of the real `tsproxy serve` process: one line that names the culprit, exit 2; the
start line; and `serve --check` against a real SeaweedFS, healthy and misconfigured."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.harness import free_port
from tsproxy.format import KeyRing


def _environment(env: dict[str, str] | None = None) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TSPROXY_")}
    environment.update(env or {})
    return environment


def _run(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`tsproxy serve` on free ports with `args`; returns when it exits (a mistake) or after 60 s."""
    argv = [sys.executable, "-m", "tsproxy.cli", "serve"]
    if "--listen" not in args:
        argv += ["--listen", f"127.0.0.1:{free_port()}"]
    if "--metrics-listen" not in args:
        argv += ["--metrics-listen", f"127.0.0.1:{free_port()}"]
    return subprocess.run(
        [*argv, *args], cwd=cwd, env=_environment(env), capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _corrupt_ring(tmp: Path) -> str:
    (tmp / "ring.json").write_text('{"tsproxy_key_ring": 1, "keys": [')
    (tmp / "ring.json").chmod(0o600)  # private, so that what is wrong is its content
    return "ring.json"


def _ring_is_a_directory(tmp: Path) -> str:
    (tmp / "ring.json").mkdir()
    return "ring.json"


def _cache_is_a_file(tmp: Path) -> str:
    (tmp / "cache").write_text("not a directory")
    return "cache"


def _cache_under_a_file(tmp: Path) -> str:
    (tmp / "plain").write_text("")
    return "plain/cache"


MISTAKES: list[tuple[str, Any, str]] = [
    # (id, function of the temp dir returning the flags, what the one line must say)
    ("missing ring", lambda t: ["--key-ring", "absent.json"], "key_ring (--key-ring): key ring absent.json"),
    ("corrupt ring", lambda t: ["--key-ring", _corrupt_ring(t)], "key ring ring.json: not valid JSON"),
    ("unreadable ring", lambda t: ["--key-ring", _ring_is_a_directory(t)], "key ring ring.json: cannot read"),
    ("cache is a file", lambda t: ["--cache-dir", _cache_is_a_file(t)], "cache_dir (--cache-dir): cache"),
    ("cache under a file", lambda t: ["--cache-dir", _cache_under_a_file(t)], "cannot create plain/cache"),
    (
        "bucket in backend URL",
        lambda t: ["--backend", "http://127.0.0.1:9000/mybucket"],
        "backend (--backend): 'http://127.0.0.1:9000/mybucket' has a path ('/mybucket'); the backend URL "
        "is scheme://host:port only. To keep every client bucket in one backend bucket, set "
        "backend_bucket = 'mybucket' (--backend-bucket mybucket)",
    ),
]


@pytest.mark.parametrize(("flags", "says"), [(m[1], m[2]) for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_startup_mistake_is_one_line_and_exit_2(tmp_path: Path, flags: Any, says: str) -> None:
    proc = _run(tmp_path, *flags(tmp_path))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tsproxy: "), proc.stderr
    assert says in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_a_named_key_ring_is_never_created(tmp_path: Path) -> None:
    """Dev credentials and a file:// backend, but a ring named: it must exist, none is generated."""
    proc = _run(tmp_path, "--key-ring", "sub/ring.json")
    assert proc.returncode == 2 and "no such file" in proc.stderr
    assert not (tmp_path / "sub").exists()
    assert not list(tmp_path.glob("*keyring*"))


def test_port_in_use_names_the_setting_and_port(tmp_path: Path, busy_port: int) -> None:
    proc = _run(tmp_path, "--listen", f"127.0.0.1:{busy_port}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"tsproxy: listen (--listen): cannot listen on 127.0.0.1:{busy_port}: the port is already in use"
    ]
    proc = _run(tmp_path, "--metrics-listen", f"127.0.0.1:{busy_port}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"tsproxy: metrics_listen (--metrics-listen): cannot listen on 127.0.0.1:{busy_port}: "
        "the port is already in use"
    ]


def test_unknown_environment_variable_is_refused_like_an_unknown_toml_key(tmp_path: Path) -> None:
    proc = _run(tmp_path, env={"TSPROXY_CHUNKSIZE": "1MiB"})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "tsproxy: config: unknown setting 'TSPROXY_CHUNKSIZE' in the environment "
        "(did you mean $TSPROXY_CHUNK_SIZE?)"
    ]
    (tmp_path / "t.toml").write_text("chunksize = '1MiB'\n")
    proc = _run(tmp_path, "--config", "t.toml")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "tsproxy: config: unknown setting 'chunksize' in t.toml (did you mean 'chunk_size'?)"
    ]


def test_debug_adds_the_traceback(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--key-ring", "absent.json", "--log-level", "debug")
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("tsproxy: key_ring (--key-ring): key ring absent.json: no such file")


def _start_line(cwd: Path, *args: str) -> dict[str, Any]:
    """Start `tsproxy serve`, read its start line, stop it."""
    argv = [sys.executable, "-m", "tsproxy.cli", "serve", "--listen", f"127.0.0.1:{free_port()}"]
    argv += ["--metrics-listen", f"127.0.0.1:{free_port()}", "--backend-check", "0", *args]
    proc = subprocess.Popen(
        argv, cwd=cwd, env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "tsproxy exited before its start line"
        return dict(json.loads(line))
    finally:
        proc.kill()
        proc.wait()


def test_start_line_is_json_and_says_which_key_ring(tmp_path: Path) -> None:
    first = _start_line(tmp_path)
    assert first["msg"] == "tsproxy serving S3" and first["level"] == "info"
    assert first["key_ring"] == "tsproxy-data-dev-keyring.json"
    assert first["key_ring_state"] == "generated: development ring, no key_ring named"
    again = _start_line(tmp_path)
    assert again["key_ring_state"] == "loaded: development ring, no key_ring named"
    KeyRing.new().save(tmp_path / "mine.json")
    named = _start_line(tmp_path, "--key-ring", "mine.json")
    assert (named["key_ring"], named["key_ring_state"]) == ("mine.json", "loaded")
    assert named["endpoint"].startswith("http://127.0.0.1:") and named["metrics"].endswith("/metrics")


def test_check_on_the_local_backend(tmp_path: Path, busy_port: int) -> None:
    proc = _run(tmp_path, "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok   key_ring: none named; a development ring will be generated" in proc.stdout
    assert not list(tmp_path.iterdir())  # --check creates nothing: no ring, no cache, no data
    proc = _run(tmp_path, "--check", "--listen", f"127.0.0.1:{busy_port}")
    assert proc.returncode == 2
    assert f"FAIL listen: listen (--listen): cannot listen on 127.0.0.1:{busy_port}" in proc.stdout


# -- against a real SeaweedFS ----------------------------------------------------------------------------


def _weed_env(weed: Any, **extra: str) -> dict[str, str]:
    return {
        "TSPROXY_ACCESS_KEY": "client",
        "TSPROXY_SECRET_KEY": "client-secret",
        "TSPROXY_BACKEND": weed.endpoint,
        "TSPROXY_BACKEND_ACCESS_KEY": weed.access_key,
        "TSPROXY_BACKEND_SECRET_KEY": weed.secret_key,
        **extra,
    }


@pytest.fixture
def ring(tmp_path: Path) -> str:
    KeyRing.new().save(tmp_path / "ring.json")
    return "ring.json"


def test_check_passes_against_a_healthy_store(
    tmp_path: Path, ring: str, seaweed: Any, seaweed_bucket: str
) -> None:
    proc = _run(
        tmp_path, "--check", "--key-ring", ring, "--backend-bucket", seaweed_bucket, env=_weed_env(seaweed)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert all(line.startswith("ok   ") for line in lines), lines
    checks = [line.split()[1] for line in lines]
    assert checks == [
        "key_ring:", "cache_dir:", "listen:", "metrics_listen:",
        "reachable:", "credentials:", "bucket:", "objects:",
    ]  # fmt: skip
    assert f"wrote, read and deleted {seaweed_bucket}/.tsproxy/probe-" in lines[-1]
    # The probe object is gone.
    listed = seaweed.boto3_client().list_objects_v2(Bucket=seaweed_bucket, Prefix=".tsproxy/")
    assert listed.get("KeyCount", 0) == 0


def _unused_port() -> int:
    return free_port()


BACKEND_MISTAKES: list[tuple[str, Any, str]] = [
    (
        "wrong secret",
        lambda w, b: {"TSPROXY_BACKEND_SECRET_KEY": "not-the-secret"},
        "FAIL credentials: backend {endpoint} refused tsproxy's credentials",
    ),
    (
        "https to an http port",
        lambda w, b: {"TSPROXY_BACKEND": w.endpoint.replace("http:", "https:")},
        "FAIL tls: backend {endpoint}: the store does not speak TLS on that port (http:// instead of https://?)",
    ),
    (
        "nothing listening",
        lambda w, b: {"TSPROXY_BACKEND": f"http://127.0.0.1:{_unused_port()}"},
        "FAIL reachable: backend {endpoint}: connection refused",
    ),
    (
        "DNS failure",
        lambda w, b: {"TSPROXY_BACKEND": "http://no-such-store.invalid:9000"},
        "FAIL reachable: backend {endpoint}: the host name does not resolve (DNS)",
    ),
    (
        "missing backend bucket",
        lambda w, b: {"TSPROXY_BACKEND_BUCKET": b + "-absent"},
        "FAIL bucket: backend_bucket '{bucket}-absent' does not exist in {endpoint}",
    ),
]


@pytest.mark.parametrize(
    ("change", "says"), [(m[1], m[2]) for m in BACKEND_MISTAKES], ids=[m[0] for m in BACKEND_MISTAKES]
)
def test_check_names_what_is_wrong_with_the_backend(
    tmp_path: Path, ring: str, seaweed: Any, seaweed_bucket: str, change: Any, says: str
) -> None:
    env = _weed_env(seaweed, TSPROXY_BACKEND_BUCKET=seaweed_bucket)
    env.update(change(seaweed, seaweed_bucket))
    proc = _run(tmp_path, "--check", "--key-ring", ring, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert failed == [says.format(endpoint=env["TSPROXY_BACKEND"], bucket=seaweed_bucket)] or (
        len(failed) == 1
        and failed[0].startswith(says.format(endpoint=env["TSPROXY_BACKEND"], bucket=seaweed_bucket))
    ), proc.stdout
    assert "Traceback" not in proc.stderr


def test_check_without_backend_bucket_writes_only_where_tsproxy_already_is(
    tmp_path: Path, ring: str, seaweed: Any
) -> None:
    """Without backend_bucket every bucket of the store is a client's, or another application's: the
    write probe goes only into one that already holds tsproxy's own objects, never the first listed."""
    from tests.support.faulty_proxy import FaultyProxy

    other = seaweed.new_bucket("0000-other-app")  # listed before any test bucket
    ours = seaweed.new_bucket("0001-tsproxy")
    try:
        admin = seaweed.boto3_client()
        admin.put_object(Bucket=other, Key="their-object", Body=b"not tsproxy's")
        with FaultyProxy.threaded(seaweed.endpoint) as spy:
            env = _weed_env(seaweed, TSPROXY_BACKEND=spy.endpoint)
            proc = _run(tmp_path, "--check", "--key-ring", ring, env=env)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert spy.count(path=rf"^/{other}/", method="PUT") == 0
            # Once a bucket holds tsproxy's objects (its size catalog), the probe writes there.
            admin.put_object(Bucket=ours, Key=".tsproxy/catalog/00000001", Body=b"")
            spy.clear()
            proc = _run(tmp_path, "--check", "--key-ring", ring, env=env)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert spy.count(path=rf"^/{other}/", method="PUT") == 0
            (objects,) = [line for line in proc.stdout.splitlines() if " objects: " in line]
            assert "wrote, read and deleted " in objects and f"{other}/" not in objects
    finally:
        seaweed.remove_bucket(other)
        seaweed.remove_bucket(ours)
