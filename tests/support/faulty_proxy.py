"""An HTTP proxy that injects faults in front of a real server (SeaweedFS, a tsproxy …).

Requests are forwarded verbatim: method, raw path and query, headers **including Host**, and the
body as a stream; answers come back the same way (no decompression, no added headers). Keeping the
Host header is what lets SigV4 pass through: a client signs the Host it talks to, so point the client
at the proxy (`proxy.endpoint`) with path-style addressing and the server checks the signature
against that same Host. It also takes requests in absolute form, as an HTTP proxy gets them from a
client told to use one (HTTP_PROXY): those go to the same upstream, Host kept, whatever host their
target names, and are recorded by their path.

Rules say what to do with the first N requests that match a method and a path regex (searched in
the raw path with its query string, e.g. `r"\\?uploadId="` or `r"^/bucket/key$"`)::

    async with FaultyProxy(weed.endpoint) as proxy:
        proxy.inject("slowdown", method="PUT", times=2)     # two 503 SlowDown answers
        proxy.inject("drop", path=r"/big$")                 # connection closed, no answer
        proxy.inject("truncate", method="GET", truncate_at=1000)   # headers, 1000 bytes, cut
        client = weed.boto3_client(proxy.endpoint)
        ...
        assert proxy.count(fault="slowdown") == 2

Faults: "slowdown" (503 SlowDown XML), "internal_error" (500 InternalError XML), "error" (any
`status`/`code`), "drop" (close the connection without answering), "delay" (wait `delay` seconds,
then forward), "truncate" (forward, but cut the answer body after `truncate_at` bytes), "cut_request"
(read `truncate_at` bytes of the request body, then close the connection: the client loses it while
still sending). The request body is read in full before an error answer or a drop, so the client sees
the fault, not a broken pipe. Every request is recorded in `seen` (method, path, fault, upstream status).

For synchronous tests, `FaultyProxy.threaded(upstream)` runs one on its own event loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from tests.support.ports import HOST

KINDS = ("slowdown", "internal_error", "error", "drop", "delay", "truncate", "cut_request")
# Hop-by-hop headers (RFC 9110 7.6.1) belong to one connection and are not forwarded.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "upgrade"}
    | {"transfer-encoding", "proxy-connection"}
)
_ERRORS = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "internal_error": (500, "InternalError", "We encountered an internal error. Please try again."),
}


@dataclass
class Rule:
    """Inject `kind` into the first `times` requests matching `method` and `path` (a regex)."""

    kind: str
    method: str | None = None
    path: str = ""
    times: int = 1
    delay: float = 0.0
    truncate_at: int = 0
    status: int = 500
    code: str = "InternalError"
    injected: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault {self.kind!r}; one of {KINDS}")
        self._pattern = re.compile(self.path)

    def matches(self, method: str, path: str) -> bool:
        if self.injected >= self.times:
            return False
        if self.method is not None and self.method.upper() != method:
            return False
        return self._pattern.search(path) is not None

    @property
    def spent(self) -> bool:
        return self.injected >= self.times


@dataclass(frozen=True)
class Seen:
    """One request the proxy received: its fault (None if forwarded untouched), upstream status, and
    its headers (names in lower case)."""

    method: str
    path: str
    fault: str | None
    status: int | None
    headers: dict[str, str] = field(default_factory=dict, compare=False, hash=False)


@dataclass
class FaultyProxy:
    """A fault-injecting proxy for `upstream` ("http://host:port"), listening on `endpoint`."""

    upstream: str
    port: int = 0
    rules: list[Rule] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.endpoint = ""

    # -- lifecycle

    async def start(self) -> None:
        """Listen on a free loopback port (or `port`); `endpoint` then says where."""
        self._session = aiohttp.ClientSession(
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=120),
            connector=aiohttp.TCPConnector(limit=0),
        )
        app = web.Application(client_max_size=0)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, self.port))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        self.endpoint = f"http://{HOST}:{self.port}"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> FaultyProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- rules and records

    def inject(
        self,
        kind: str,
        *,
        method: str | None = None,
        path: str = "",
        times: int = 1,
        delay: float = 0.0,
        truncate_at: int = 0,
        status: int = 500,
        code: str = "InternalError",
    ) -> Rule:
        """Add a rule; rules are tried in the order added, the first matching one applies."""
        rule = Rule(kind, method, path, times, delay, truncate_at, status, code)
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        """Forget all rules and records."""
        with self._lock:
            self.rules.clear()
            self.seen.clear()

    def count(self, method: str | None = None, path: str | None = None, fault: str | None = "any") -> int:
        """Requests seen, by method, path regex and fault ("any": whatever; None: forwarded untouched)."""
        pattern = re.compile(path) if path is not None else None
        with self._lock:
            records = list(self.seen)
        return sum(
            1
            for s in records
            if (method is None or s.method == method.upper())
            and (pattern is None or pattern.search(s.path))
            and (fault == "any" or s.fault == fault)
        )

    def _take_rule(self, method: str, path: str) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.matches(method, path):
                    rule.injected += 1
                    return rule
        return None

    def _record(self, request: web.Request, fault: str | None, status: int | None) -> None:
        headers = {k.lower(): v for k, v in request.headers.items()}
        with self._lock:
            self.seen.append(Seen(request.method, _origin_form(request.raw_path), fault, status, headers))

    # -- the proxy

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        method, path = request.method, _origin_form(request.raw_path)
        rule = self._take_rule(method, path)
        kind = rule.kind if rule else None
        if rule is not None and kind in ("slowdown", "internal_error", "error", "drop"):
            await _drain(request)
            if kind == "drop":
                self._record(request, kind, None)
                _cut(request)
                raise asyncio.CancelledError  # aiohttp ends the handler quietly; nothing is sent
            status, code, message = _ERRORS.get(kind, (rule.status, rule.code, "Injected fault."))
            self._record(request, kind, status)
            return _error_response(status, code, message, path)
        if rule is not None and kind == "cut_request":
            with contextlib.suppress(Exception):
                await request.content.readexactly(rule.truncate_at)
            self._record(request, kind, None)
            _cut(request)
            raise asyncio.CancelledError
        if rule is not None and kind == "delay":
            await asyncio.sleep(rule.delay)
        return await self._forward(request, rule)

    async def _forward(self, request: web.Request, rule: Rule | None) -> web.StreamResponse:
        assert self._session is not None
        method, path = request.method, _origin_form(request.raw_path)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        data: Any = request.content if request.body_exists else None
        url = URL(self.upstream.rstrip("/") + path, encoded=True)
        async with self._session.request(
            method,
            url,
            headers=headers,
            data=data,
            allow_redirects=False,
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
        ) as upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in HOP_BY_HOP:
                    response.headers.add(k, v)
            fault = rule.kind if rule is not None else None
            self._record(request, fault, upstream.status)
            await response.prepare(request)
            if method == "HEAD" or upstream.status in (204, 304):
                return response
            sent = 0
            limit = rule.truncate_at if rule is not None and rule.kind == "truncate" else None
            async for piece in upstream.content.iter_chunked(1 << 16):
                if limit is not None and sent + len(piece) >= limit:
                    await response.write(piece[: limit - sent])
                    await asyncio.sleep(0.05)  # let the bytes leave before the cut
                    _cut(request)
                    raise asyncio.CancelledError
                await response.write(piece)
                sent += len(piece)
            if limit is not None:
                # The body was shorter than the cut point: cut at its end, before it completes.
                _cut(request)
                raise asyncio.CancelledError
            await response.write_eof()
            return response

    # -- running in a thread, for synchronous tests

    @classmethod
    @contextlib.contextmanager
    def threaded(cls, upstream: str) -> Iterator[FaultyProxy]:
        """`with FaultyProxy.threaded(url) as proxy:` — the proxy on an event loop thread of its own."""
        loop = asyncio.new_event_loop()
        proxy = cls(upstream)
        thread = threading.Thread(target=loop.run_forever, name="faulty-proxy", daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(proxy.start(), loop).result(30)
            yield proxy
        finally:
            asyncio.run_coroutine_threadsafe(proxy.close(), loop).result(30)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(30)
            loop.close()


def _origin_form(target: str) -> str:
    """A request target's path and query: itself, or the path and query of an absolute-form target."""
    if target.startswith(("http://", "https://")):
        return URL(target, encoded=True).raw_path_qs
    return target


async def _drain(request: web.Request) -> None:
    with contextlib.suppress(Exception):
        while await request.content.read(1 << 16):
            pass


def _cut(request: web.Request) -> None:
    """Close the client's connection at once (RST-free close; the client sees EOF mid-message)."""
    transport = request.transport
    if transport is not None:
        transport.close()


def _error_response(status: int, code: str, message: str, resource: str) -> web.Response:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{resource.split('?', 1)[0]}</Resource><RequestId>faulty-proxy</RequestId></Error>"
    ).encode()
    return web.Response(status=status, body=body, content_type="application/xml")


@contextlib.asynccontextmanager
async def faulty_proxy(upstream: str) -> AsyncIterator[FaultyProxy]:
    """`async with faulty_proxy(url) as proxy:` — a started FaultyProxy, closed afterwards."""
    proxy = FaultyProxy(upstream)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
