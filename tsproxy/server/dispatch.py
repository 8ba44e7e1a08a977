"""Every S3 request takes one path: route (server.routes) -> verify the signature -> the operation's handler
-> response.

Any S3Error becomes S3's XML error; anything unexpected becomes a 500 InternalError with a request id,
logged with its traceback, never shown to the client. Every request is counted and access-logged.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from tsproxy import errors
from tsproxy.logs import redact
from tsproxy.s3 import ranges, xml
from tsproxy.s3.auth import authenticate
from tsproxy.s3.operations import Operation
from tsproxy.s3.routing import route
from tsproxy.server import acl
from tsproxy.server.exchange import Exchange, Served
from tsproxy.server.routes import BY_OPERATION, ROUTES, Draining
from tsproxy.service.namespace import Namespace
from tsproxy.service.namespace import backend_name as _backend_name

log = logging.getLogger("tsproxy.server")
access_log = logging.getLogger("tsproxy.access")


def _split_target(raw: str) -> tuple[str, str]:
    path, _, query = raw.partition("?")
    return path or "/", query


def _query(raw_query: str) -> dict[str, str]:
    return dict(parse_qsl(raw_query, keep_blank_values=True))


def in_client_names(err: errors.S3Error, ns: Namespace, bucket: str | None, key: str | None) -> None:
    """Name the client's bucket and key in an error's fields, never the backend's: a backend error
    carries the backend bucket and the backend key (tenant prefix, escaped form, tsproxy's own state).
    A backend key no client key maps to is left out."""
    if bucket is None:
        return
    if ns.mapped and err.fields.get("BucketName") == ns.backend_bucket:
        err.fields["BucketName"] = bucket
    name = err.fields.get("Key")
    if name is None or name == key or not ns.addressable(bucket):
        return
    root = ns.root(bucket).key
    if key is not None and name == root + _backend_name(key):
        err.fields["Key"] = key
    elif name.startswith(root) and (ns.mapped or name.startswith(".tsproxy")):
        client = ns.client_key(bucket, name)
        if client is None:
            del err.fields["Key"]
        else:
            err.fields["Key"] = client


def _error_response(err: errors.S3Error, resource: str, request_id: str, method: str) -> web.Response:
    body = b"" if method == "HEAD" else xml.error_xml(err, resource, request_id)
    headers = {"x-amz-request-id": request_id}
    if err.status == 503:
        headers["Retry-After"] = "1"
    if isinstance(err, errors.InvalidRange) and "ActualObjectSize" in err.fields:
        headers["Content-Range"] = ranges.unsatisfied_range(int(err.fields["ActualObjectSize"]))
    return web.Response(body=body, status=err.status, content_type="application/xml", headers=headers)


def _connection_proven(request: web.Request) -> None:
    """Tell the connection (server.connections) that it carried an authenticated request."""
    mark = getattr(request.protocol, "authenticated", None)
    if mark is not None:
        mark()


def _namespace(proxy: Served) -> Namespace:
    return Namespace(proxy.cfg.backend_bucket, proxy.cfg.backend_prefix)


async def handle(proxy: Served, request: web.Request) -> web.StreamResponse:
    """Serve one S3 request: route, authenticate, run its handler, answer S3's error on failure."""
    metrics = proxy.metrics
    request_id = secrets.token_hex(8).upper()
    started = time.monotonic()
    raw_path, raw_query = _split_target(request.raw_path)
    op = Operation.UNKNOWN
    ex: Exchange | None = None
    response: web.StreamResponse | None = None
    error_code = ""
    proven = False  # the request passed authentication
    metrics.in_flight.inc()
    if proxy.idle is not None:
        proxy.idle.begin()
    try:
        try:
            query = _query(raw_query)
            s3 = route(
                request.method,
                request.headers.get("Host", ""),
                raw_path,
                query,
                request.headers,
                proxy.cfg.virtual_host_suffixes,
                table=ROUTES,
            )
            op = s3.operation
            row = BY_OPERATION[op]
            auth = authenticate(
                request.method,
                raw_path,
                raw_query,
                request.headers,
                proxy.secrets.get,
                datetime.now(UTC),
                host_bucket=s3.bucket if s3.host_bucket else None,
                allow_anonymous=proxy.cfg.anonymous,
                max_skew=timedelta(seconds=proxy.cfg.max_clock_skew),
                region=proxy.cfg.region,
            )
            proven = True
            _connection_proven(request)
            if row.acl:
                acl.check_acl_headers(request.headers, bucket=op is Operation.CREATE_BUCKET)
            if proxy.draining and row.draining is Draining.REFUSE:
                raise errors.ServiceUnavailable("tsproxy is shutting down.")
            ex = Exchange(
                request,
                s3,
                query,
                auth,
                request_id,
                proxy.objects,
                proxy.metrics,
                proxy.cfg.region,
                proxy.cfg.body_idle_timeout,
            )
            response = await row.handler(ex)
        except errors.S3Error as e:
            error_code = e.code
            if op is not Operation.UNKNOWN:
                in_client_names(e, _namespace(proxy), s3.bucket, s3.key)
            if e.status >= 500:
                log.warning(
                    "request failed",
                    extra={"fields": {"request_id": request_id, "code": e.code, "error": str(e)}},
                )
            response = _error_response(e, raw_path, request_id, request.method)
            if not proven:
                # Refused before authenticating: the connection is closed with the answer, so a client
                # without credentials cannot keep sockets open by failing one request after another.
                response.force_close()
        except (errors.FormatError, errors.KeyNotFound) as e:
            # Stored data that cannot be read is our problem, not the client's: 500, never bytes.
            error_code = "InternalError"
            metrics.integrity_errors.inc()
            log.error(
                "stored object unreadable", extra={"fields": {"request_id": request_id, "error": repr(e)}}
            )
            response = _error_response(errors.InternalError(), raw_path, request_id, request.method)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:
            error_code = "InternalError"
            log.exception("unexpected error", extra={"fields": {"request_id": request_id, "operation": op}})
            response = _error_response(errors.InternalError(), raw_path, request_id, request.method)
        response.headers.setdefault("x-amz-request-id", request_id)
        response.headers.setdefault("x-amz-id-2", request_id)
        response.headers["Server"] = "tsproxy"
        if error_code == "RequestTimeout":
            # A stalled body: answer, then close at once (as S3 does) rather than let aiohttp wait
            # another lingering period for the rest of a body that is not coming.
            await response.prepare(request)
            await response.write_eof()
            request.protocol.force_close()
        return response
    finally:
        metrics.in_flight.dec()
        if proxy.idle is not None:
            proxy.idle.end()
        elapsed = time.monotonic() - started
        # A handler that raised past us (a cut connection) sent nothing we know of: count it as a 500.
        status = str(response.status) if response is not None else "500"
        metrics.requests.labels(op, status).inc()
        metrics.request_seconds.labels(op).observe(elapsed)
        fields: dict[str, Any] = {
            "request_id": request_id,
            "remote": request.remote,
            "method": request.method,
            "path": raw_path,
            "query": redact(raw_query),
            "operation": op.value,
            "status": int(status) if status.isascii() and status.isdigit() else status,
            "duration_ms": round(elapsed * 1000, 2),
            "user_agent": request.headers.get("User-Agent", ""),
        }
        if "Range" in request.headers:
            fields["range"] = request.headers["Range"]
        if ex is not None:
            fields.update(access_key=ex.auth.access_key, bytes_in=ex.bytes_in, bytes_out=ex.bytes_out)
        if error_code:
            fields["error"] = error_code
        access_log.info("request", extra={"fields": fields})


def create_app(proxy: Served) -> web.Application:
    """The S3 application (one handler takes every path; routing is S3's, not aiohttp's)."""
    app = web.Application(client_max_size=1 << 20, handler_args={"max_field_size": 65536})

    async def serve(request: web.Request) -> web.StreamResponse:
        return await handle(proxy, request)

    # `[\s\S]`, not `.`: a key may hold a line feed (`%0A`), which `.` does not match.
    app.router.add_route("*", r"/{tail:[\s\S]*}", serve)
    return app
