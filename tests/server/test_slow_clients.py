"""Slow and stalled clients are cut off: a deadline for request headers, an idle limit for bodies, and
a cap on open connections. Driven with raw sockets against a real server, timeouts made small."""

from __future__ import annotations

import select
import socket
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.server.conftest import start_proxy
from tests.server.harness import ACCESS_KEY, SECRET_KEY, RunningProxy
from tests.support.waiting import eventually
from tsproxy import config as tsconfig
from tsproxy.errors import ConfigError

WAIT = 20.0  # upper bound for anything the server should do within a fraction of a second


class _UnsignedPayloadAuth(S3SigV4Auth):
    def payload(self, request: AWSRequest) -> str:
        return "UNSIGNED-PAYLOAD"


def _signed_head(method: str, url: str, headers: dict[str, str]) -> bytes:
    """The request line and signed headers of a request whose body is not signed (UNSIGNED-PAYLOAD)."""
    request = AWSRequest(method=method, url=url, headers=headers)
    _UnsignedPayloadAuth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(request)
    parts = urlsplit(url)
    lines = [f"{method} {parts.path} HTTP/1.1", f"Host: {parts.netloc}"]
    lines += [f"{name}: {value}" for name, value in request.headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _connect(running: RunningProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", running.port), timeout=WAIT)
    return sock


def _closed_by_server(sock: socket.socket, timeout: float = WAIT) -> bool:
    """Whether the server closes `sock` within `timeout` (reads and discards anything it sends)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def _response(sock: socket.socket) -> tuple[int, bytes]:
    """Status and body of one HTTP response (Content-Length framed) read from `sock`."""
    sock.settimeout(WAIT)
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, f"connection closed before a response: {data!r}"
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in lines[1:])
    length = int(fields["content-length"])
    while len(body) < length:
        piece = sock.recv(65536)
        assert piece
        body += piece
    return int(lines[0].split()[1]), body


def _sample(running: RunningProxy, name: str, labels: dict[str, str] | None = None) -> float:
    value = running.proxy.metrics.registry.get_sample_value(name, labels or {})
    return value or 0.0


def _eventually(check: Callable[[], bool]) -> None:
    eventually(check, WAIT)


@pytest.fixture
def quick(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningProxy]:
    """A local tsproxy with half-second header and body deadlines."""
    running = start_proxy("local", tmp_path, request, header_timeout="500ms", body_idle_timeout="500ms")
    yield running
    running.stop()


def test_connections_that_never_finish_their_headers_are_closed(quick: RunningProxy) -> None:
    silent = [_connect(quick) for _ in range(10)]
    partial = [_connect(quick) for _ in range(40)]
    for sock in partial:
        sock.sendall(b"PUT /bucket/key HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n")
    try:
        assert all(_closed_by_server(s) for s in silent + partial)
        _eventually(lambda: _sample(quick, "tsproxy_client_timeouts_total", {"kind": "header"}) == 50)
        _eventually(lambda: _sample(quick, "tsproxy_connections_open") == 0)
    finally:
        for sock in silent + partial:
            sock.close()
    # The server is none the worse for it.
    quick.client().create_bucket(Bucket="after")
    assert _sample(quick, "tsproxy_client_timeouts_total", {"kind": "body"}) == 0


def test_trickled_headers_do_not_extend_the_deadline(quick: RunningProxy) -> None:
    # One byte every 50 ms would take 15 s to send these headers; the deadline is counted from the start.
    head = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"p" * 250 + b"\r\n\r\n"
    with _connect(quick) as sock:
        sent = 0
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 1
            readable, _, _ = select.select([sock], [], [], 0.05)
            if readable and _closed_by_server(sock, 0.5):
                break
        assert sent < len(head)
    assert _sample(quick, "tsproxy_client_timeouts_total", {"kind": "header"}) == 1


def test_a_kept_alive_connection_gets_a_fresh_deadline_per_request(quick: RunningProxy) -> None:
    with _connect(quick) as sock:
        for _ in range(3):
            # Idle between requests for longer than the header deadline: only keep-alive limits that.
            sock.sendall(_signed_head("GET", quick.endpoint + "/", {}))
            status, body = _response(sock)
            assert status == 200 and b"<ListAllMyBucketsResult" in body
            assert not _closed_by_server(sock, 1.0)
        # The first bytes of a next request start its deadline.
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0")
        assert _closed_by_server(sock)
    assert _sample(quick, "tsproxy_client_timeouts_total", {"kind": "header"}) == 1


@pytest.mark.parametrize("kind", ["local", "seaweed"])
def test_a_stalled_body_gets_request_timeout_and_stores_nothing(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    running = start_proxy(kind, tmp_path, request, header_timeout="500ms", body_idle_timeout="500ms")
    try:
        client = running.client()
        bucket = f"t-{uuid.uuid4().hex[:16]}"
        client.create_bucket(Bucket=bucket)
        url = f"{running.endpoint}/{bucket}/stalled"
        with _connect(running) as sock:
            sock.sendall(_signed_head("PUT", url, {"Content-Length": "100"}) + b"0123456789")
            status, body = _response(sock)
            assert _closed_by_server(sock)
        root = ET.fromstring(body)
        assert status == 400 and root.findtext("Code") == "RequestTimeout"
        assert root.findtext("Message") == (
            "Your socket connection to the server was not read from or written to within the timeout period."
        )
        assert _sample(running, "tsproxy_client_timeouts_total", {"kind": "body"}) == 1
        with pytest.raises(ClientError) as e:
            client.head_object(Bucket=bucket, Key="stalled")
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
        # A body that keeps flowing, however slowly, is not cut: 5 pieces, each within the idle limit.
        with _connect(running) as sock:
            sock.sendall(_signed_head("PUT", url, {"Content-Length": "10"}))
            for piece in (b"01", b"23", b"45", b"67", b"89"):
                time.sleep(0.2)
                sock.sendall(piece)
            status, _ = _response(sock)
        assert status == 200
        assert client.get_object(Bucket=bucket, Key="stalled")["Body"].read() == b"0123456789"
    finally:
        running.stop()


def test_connections_past_the_limit_are_closed_at_accept(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    running = start_proxy("local", tmp_path, request, max_connections=3, header_timeout="60s")
    held: list[socket.socket] = []
    try:
        held = [_connect(running) for _ in range(3)]
        for sock in held:  # authenticated connections are never closed to make room for another
            sock.sendall(_signed_head("GET", running.endpoint + "/", {}))
            assert _response(sock)[0] == 200
        _eventually(lambda: _sample(running, "tsproxy_connections_open") == 3)
        with _connect(running) as extra:
            assert _closed_by_server(extra)
        assert _sample(running, "tsproxy_connections_refused_total") == 1
        assert _sample(running, "tsproxy_connections_open") == 3
        held.pop().close()
        _eventually(lambda: _sample(running, "tsproxy_connections_open") == 2)
        running.client().create_bucket(Bucket="room-again")
        assert _sample(running, "tsproxy_connections_refused_total") == 1
    finally:
        for sock in held:
            sock.close()
        running.stop()


def test_unauthenticated_connections_make_room_and_close_after_their_error(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A connection that has not authenticated is closed after an authentication error, and the oldest
    such connection is closed when a new one needs room: a flood never locks a real client out."""
    running = start_proxy("local", tmp_path, request, max_connections=3, header_timeout="60s")
    try:
        with _connect(running) as refused:
            refused.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            status, body = _response(refused)
            assert status == 403 and b"<Code>AccessDenied</Code>" in body
            assert _closed_by_server(refused)
        idle = [_connect(running) for _ in range(3)]
        _eventually(lambda: _sample(running, "tsproxy_connections_open") == 3)
        running.client().create_bucket(Bucket="room-for-me")  # a fourth connection: the oldest idle goes
        assert _closed_by_server(idle[0])
        assert _sample(running, "tsproxy_connections_refused_total") == 0
        assert _sample(running, "tsproxy_connections_evicted_total") >= 1
        for sock in idle:
            sock.close()
    finally:
        running.stop()


def test_settings_from_toml_env_and_their_checks(tmp_path: Path) -> None:
    toml = tmp_path / "tsproxy.toml"
    toml.write_text('header_timeout = "3s"\nmax_connections = 64\n')
    base = {"backend": f"file://{tmp_path / 'data'}"}
    cfg = tsconfig.load(base, env={"TSPROXY_BODY_IDLE_TIMEOUT": "1500ms"}, config_file=toml)
    assert (cfg.header_timeout, cfg.body_idle_timeout, cfg.max_connections) == (3.0, 1.5, 64)
    d = tsconfig.load(base, env={})
    assert (d.header_timeout, d.body_idle_timeout, d.max_connections) == (10.0, 20.0, 1024)
    for name, value in (("header_timeout", "0s"), ("body_idle_timeout", "0"), ("max_connections", "0")):
        with pytest.raises(ConfigError, match=name):
            tsconfig.load({**base, name: value}, env={})
