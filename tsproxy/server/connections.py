"""Client connections on the S3 port: how many may be open, and how long a client may take to send a
request's headers.

aiohttp closes a connection that sends nothing for `keepalive_timeout` (75 s), but a client trickling
header bytes, or holding hundreds of half-sent requests, keeps its sockets as long as it likes. Here each
connection gets a header deadline, from the moment it opens (first request) or from the first byte of a
further request on a kept-alive connection, until its headers are complete; past it the connection is
closed (there is no request yet to answer). A stalled *body* is the request's business: see
request_body, which answers 400 RequestTimeout.

Connections that have not yet carried an authenticated request hold no more than their share: one whose
request fails authentication is closed with its answer (as it can only try again), and when a new
connection finds `max_connections` open, or its client (peer address) already holding `PEER_SHARE` of the
limit in such connections, the oldest of them is closed to make room (counted in
tsproxy_connections_evicted_total). So a flood of unauthenticated sockets, however kept alive, displaces
only itself: a client that authenticates always gets a connection, and keeps it.

Connections past `max_connections`, when every one of them has authenticated, are closed as they are
accepted, before anything is read. The limit guards file descriptors and memory, so an excess connection
must cost nothing: answering 503 SlowDown would first need its request read (a buffer, a parser, a
deadline, the very things the limit protects), and a response written before the request is read is
lost to the reset the unread request causes on close. SDKs retry a reset connection with backoff just as
they retry a 503.

A request aiohttp cannot parse (a header or request line past its limits, a malformed message) gets
S3's XML error and one rate-limited log line, not aiohttp's plain-text answer and a traceback per
request: anyone can send such requests, before any credential is checked.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from tsproxy import errors
from tsproxy.metrics import Metrics
from tsproxy.s3 import xml

log = logging.getLogger("tsproxy.server")
REFUSAL_LOG_INTERVAL = 10.0  # seconds between two log lines about refused connections
PEER_SHARE = 4  # one peer address may hold 1/PEER_SHARE of max_connections before authenticating


class ConnectionGuard:
    """The limits of one listening server and its count of open connections."""

    def __init__(self, metrics: Metrics, *, header_timeout: float, max_connections: int) -> None:
        self.metrics = metrics
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        self.open = 0
        self.peer_share = max(8, max_connections // PEER_SHARE)
        # Connections that have not authenticated a request yet, oldest first, overall and by peer.
        self._unproven: dict[GuardedRequestHandler, None] = {}
        self._unproven_by_peer: dict[str, dict[GuardedRequestHandler, None]] = {}
        self._last_refusal_log = 0.0
        self._last_bad_request_log = 0.0
        self._bad_requests = 0

    def admit(self, handler: GuardedRequestHandler | None = None, peer: str = "") -> bool:
        """Count a new connection in, making room by closing the oldest connection that has not
        authenticated (its peer's own when the peer holds its share), or refuse it (False) when
        max_connections are open and all have authenticated."""
        if handler is not None:
            mine = self._unproven_by_peer.get(peer)
            if mine is not None and len(mine) >= self.peer_share:
                self._evict(next(iter(mine)))
            if self.open >= self.max_connections and self._unproven:
                self._evict(next(iter(self._unproven)))
        if self.open >= self.max_connections:
            self.metrics.connections_refused.inc()
            now = time.monotonic()
            if now - self._last_refusal_log >= REFUSAL_LOG_INTERVAL:
                self._last_refusal_log = now
                log.warning(
                    "connection limit reached, refusing connections",
                    extra={"fields": {"max_connections": self.max_connections}},
                )
            return False
        self.open += 1
        self.metrics.connections_open.set(self.open)
        if handler is not None:
            self._unproven[handler] = None
            self._unproven_by_peer.setdefault(peer, {})[handler] = None
        return True

    def proven(self, handler: GuardedRequestHandler) -> None:
        """The connection carried an authenticated request: it is no longer evicted for room."""
        if self._unproven.pop(handler, False) is None:
            self._forget_peer(handler)

    def _forget_peer(self, handler: GuardedRequestHandler) -> None:
        mine = self._unproven_by_peer.get(handler.peer)
        if mine is not None:
            mine.pop(handler, None)
            if not mine:
                del self._unproven_by_peer[handler.peer]

    def _evict(self, handler: GuardedRequestHandler) -> None:
        self.metrics.connections_evicted.inc()
        handler.evict()

    def bad_request(self, error: BaseException | None) -> None:
        """Count a request aiohttp could not parse; log one line (no traceback) at most every interval."""
        self._bad_requests += 1
        now = time.monotonic()
        if now - self._last_bad_request_log >= REFUSAL_LOG_INTERVAL:
            self._last_bad_request_log = now
            log.info(
                "malformed requests refused",
                extra={"fields": {"count": self._bad_requests, "last": type(error).__name__}},
            )
            self._bad_requests = 0

    def release(self, handler: GuardedRequestHandler | None = None) -> None:
        self.open -= 1
        self.metrics.connections_open.set(self.open)
        if handler is not None and self._unproven.pop(handler, False) is None:
            self._forget_peer(handler)


class GuardedRequestHandler(RequestHandler):
    """aiohttp's connection protocol with the connection limit and the header deadline."""

    def __init__(self, manager: GuardedServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = manager.guard
        self._admitted = False
        self._started = False
        self._header_deadline: asyncio.TimerHandle | None = None
        self.peer = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peername = transport.get_extra_info("peername")
        self.peer = str(peername[0]) if isinstance(peername, tuple) and peername else ""
        if not self._guard.admit(self, self.peer):
            transport.close()
            return
        self._admitted = self._started = True
        super().connection_made(transport)
        self._arm_header_deadline()  # the first request's headers are due from the moment it opens

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._started:
            return
        self._started = False
        if self._admitted:
            self._admitted = False
            self._guard.release(self)
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def authenticated(self) -> None:
        """Called when a request on this connection passed authentication."""
        if self._admitted:
            self._guard.proven(self)

    def evict(self) -> None:
        """Close this connection (it has not authenticated) to make room; it no longer counts."""
        if self._admitted:
            self._admitted = False
            self._guard.release(self)
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        # The first byte of a further request on a kept-alive connection starts its header deadline.
        # (While a response is finishing or an unread body is drained, nobody waits for a request.)
        waiting = self._waiter is not None and not self._waiter.done() and not self._messages
        if data and waiting and self._header_deadline is None:
            self._arm_header_deadline()
        super().data_received(data)
        if self._messages or self._request_in_progress:
            self._disarm_header_deadline()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A message aiohttp could not parse gets S3's error; anything else aiohttp's own handling."""
        if not isinstance(exc, BadHttpMessage) or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        self._guard.bad_request(exc)
        err: errors.S3Error
        if isinstance(exc, LineTooLong) or "too many headers" in str(exc).lower():
            err = errors.RequestHeaderSectionTooLarge()
        else:
            err = errors.BadRequest("The request could not be parsed as HTTP.")
        request_id = secrets.token_hex(8).upper()
        response = web.Response(
            body=xml.error_xml(err, "/", request_id),
            status=err.status,
            content_type="application/xml",
            headers={"x-amz-request-id": request_id, "x-amz-id-2": request_id, "Server": "tsproxy"},
        )
        response.force_close()
        return response

    def _arm_header_deadline(self) -> None:
        self._header_deadline = self._loop.call_later(self._guard.header_timeout, self._headers_overdue)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_overdue(self) -> None:
        self._header_deadline = None
        if self._messages or self._request_in_progress or self.transport is None:
            return
        self._guard.metrics.client_timeouts.labels("header").inc()
        self.force_close()


class GuardedServer(web.Server):
    """aiohttp's low-level server, making GuardedRequestHandlers."""

    def __init__(self, base: web.Server, guard: ConnectionGuard) -> None:
        super().__init__(
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            loop=base._loop,
            **base._kwargs,
        )
        self.guard = guard

    def __call__(self) -> GuardedRequestHandler:
        return GuardedRequestHandler(self, loop=self._loop, **self._kwargs)


class S3Runner(web.AppRunner):
    """The runner of the S3 application: aiohttp's AppRunner with guarded connections."""

    def __init__(self, app: web.Application, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._guard = guard

    async def _make_server(self) -> web.Server:
        return GuardedServer(await super()._make_server(), self._guard)
