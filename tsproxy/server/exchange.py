"""One client request on its way through the server, and what a handler may use."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from tsproxy import errors
from tsproxy.cache.chunks import ChunkCache
from tsproxy.config import Config
from tsproxy.format import KeyRing
from tsproxy.memory import IdleRelease
from tsproxy.metrics import Metrics
from tsproxy.s3.routing import S3Request
from tsproxy.s3.sigv4 import AuthResult
from tsproxy.server.request_body import BodyResult, payload
from tsproxy.service import ObjectService
from tsproxy.store.base import Backend

OWNER_ID = "tsproxy"
XML_DECLARATION = b'<?xml version="1.0" encoding="UTF-8"?>\n'


@dataclass
class Exchange:
    """One client request on its way through the server: what it asks, who asked, what it moved, and
    the parts of the server a handler may use."""

    request: web.Request
    s3: S3Request
    query: Mapping[str, str]
    auth: AuthResult
    request_id: str
    service: ObjectService
    metrics: Metrics
    region: str
    body_idle_timeout: float | None = None  # seconds a body may stall before RequestTimeout
    bytes_in: int = 0
    bytes_out: int = 0

    @property
    def bucket(self) -> str:
        assert self.s3.bucket is not None
        return self.s3.bucket

    @property
    def key(self) -> str:
        assert self.s3.key is not None
        return self.s3.key

    def payload(self, result: BodyResult, *, verify_md5: bool = True) -> AsyncIterator[bytes | memoryview]:
        """The request body's payload, checked as S3 checks it (see request_body), counted as it goes.

        verify_md5 False: the consumer checks Content-MD5 itself (request_body.content_md5)."""

        async def counted() -> AsyncIterator[bytes | memoryview]:
            body = payload(
                self.request.content,
                self.request.headers,
                self.auth,
                result,
                idle_timeout=self.body_idle_timeout,
                verify_md5=verify_md5,
            )
            try:
                async for piece in body:
                    self.bytes_in += len(piece)
                    yield piece
            except errors.RequestTimeout:
                self.metrics.client_timeouts.labels("body").inc()
                raise

        return counted()

    async def small_body(self, limit: int = 1 << 20) -> bytes:
        """A small request body (XML), checked like any other, bounded in size."""
        out = bytearray()
        async for piece in self.payload(BodyResult()):
            out += piece
            if len(out) > limit:
                raise errors.MalformedXML("The XML you provided was too large.")
        return bytes(out)


class Served(Protocol):
    """What the request and ops paths use of a running server (the app's `Proxy`)."""

    cfg: Config
    secrets: Mapping[str, str]
    metrics: Metrics
    backend: Backend
    keyring: KeyRing | None
    cache: ChunkCache | None
    ready: bool
    draining: bool
    idle: IdleRelease | None

    @property
    def objects(self) -> ObjectService: ...


Handler = Callable[[Exchange], Awaitable[web.StreamResponse]]


def xml_response(body: bytes, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """An S3 XML answer."""
    return web.Response(body=body, status=status, content_type="application/xml", headers=headers)
