"""The aiohttp server: S3 requests in, the object service behind, S3 responses out.

Every request takes the same path: route (which S3 operation) -> verify the signature -> the
operation's handler -> response. Any S3Error becomes S3's XML error; anything unexpected becomes a 500
InternalError with a request id, logged with its traceback, never shown to the client.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tsproxy import errors
from tsproxy.body import BodyResult, payload
from tsproxy.cache.chunks import ChunkCache
from tsproxy.cache.reader import ChunkReader
from tsproxy.config import Config
from tsproxy.format import KeyRing, TransformSettings
from tsproxy.logs import redact
from tsproxy.metrics import Metrics
from tsproxy.objects import INTERNAL, ListedPage, Namespace, ObjectChanged, ObjectService, StoredObject
from tsproxy.s3 import ranges, xml
from tsproxy.s3.routing import S3Request, parse_copy_source, route
from tsproxy.s3.sigv4 import AuthResult, verify
from tsproxy.store import open_backend
from tsproxy.store.base import Backend

log = logging.getLogger("tsproxy.server")
access_log = logging.getLogger("tsproxy.access")

OWNER_ID = "tsproxy"
NOT_FOUND = frozenset({"NoSuchKey", "NoSuchBucket", "NoSuchUpload"})
# A completion still running after this many seconds answers 200 at once and keeps the connection alive.
COMPLETE_KEEPALIVE_AFTER = 5.0
XML_DECLARATION = b'<?xml version="1.0" encoding="UTF-8"?>\n'
STORED_HEADERS = ("cache-control", "content-disposition", "content-encoding", "content-language", "expires")
RESPONSE_OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}


@dataclass
class Call:
    """One client request on its way through the server."""

    request: web.Request
    s3: S3Request
    query: Mapping[str, str]
    auth: AuthResult
    request_id: str
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


PROXY: web.AppKey[Proxy] = web.AppKey("proxy")
Handler = Callable[["Proxy", Call], Awaitable[web.StreamResponse]]
HANDLERS: dict[str, Handler] = {}


def operation(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        HANDLERS[name] = fn
        return fn

    return register


class Proxy:
    """Everything a running server holds: config, backend, key ring, cache, object service, metrics."""

    def __init__(
        self, cfg: Config, *, backend: Backend | None = None, metrics: Metrics | None = None
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics or Metrics()
        self.secrets = {c.access_key: c.secret_key for c in cfg.credentials}
        threads = cfg.transform_threads or max(2, os.cpu_count() or 2)
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="transform")
        self.io_executor = ThreadPoolExecutor(4, thread_name_prefix="cache-io")
        self.backend = backend or _open_backend(cfg, self.metrics)
        self.keyring: KeyRing | None = None
        self.cache: ChunkCache | None = None
        self.reader: ChunkReader | None = None
        self.service: ObjectService | None = None
        self.ready = False
        self.draining = False
        self.uploads_in_flight = 0
        self._ring_stamp: tuple[int, int, int] | None = None
        self._watcher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        cfg = self.cfg
        if cfg.encryption and cfg.key_ring is not None:
            self._ring_stamp = _file_stamp(cfg.key_ring)
            self.keyring = await asyncio.to_thread(_load_keyring, cfg)
            self.metrics.key_ring_loaded(self.keyring.ids(), self.keyring.active_id)
        await self.backend.start()
        if cfg.cache_dir is not None:
            cache_key = (
                self.keyring.derive_key("chunk cache") if (cfg.cache_encrypt and self.keyring) else None
            )
            self.cache = await asyncio.to_thread(
                ChunkCache,
                cfg.cache_dir,
                cfg.cache_size,
                encryption_key=cache_key,
                executor=self.io_executor,
                metrics=self.metrics,
            )
        self.reader = ChunkReader(
            self.cache,
            self.executor,
            prefetch_bytes=cfg.prefetch,
            memory_bytes=cfg.memory_cache_size,
            metrics=self.metrics,
        )
        settings = TransformSettings(
            chunk_size=cfg.chunk_size,
            compression=cfg.compression,  # type: ignore[arg-type]  # validated by config
            level=cfg.compression_level,
            encryption=cfg.encryption,
        )
        self.service = ObjectService(
            self.backend,
            self.keyring,
            settings,
            self.reader,
            self.executor,
            namespace=Namespace(cfg.backend_bucket, cfg.backend_prefix),
            metrics=self.metrics,
            part_size=cfg.backend_part_size,
            metadata_ttl=cfg.metadata_ttl,
        )
        if cfg.local_backend:
            await _ensure_local_root(cfg)
        if self.keyring is not None and cfg.key_ring_check > 0:
            self._watcher = asyncio.get_running_loop().create_task(self.watch_keyring())
        self.ready = True

    async def stop(self) -> None:
        self.ready = False
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        if self.reader is not None:
            await self.reader.close()
        await self.backend.close()
        if self.cache is not None:
            await asyncio.to_thread(self.cache.close)
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.io_executor.shutdown(wait=False, cancel_futures=True)

    async def reload_keyring(self, *, only_if_changed: bool = False) -> bool:
        """Read the key ring file again and use it from now on; True when a new ring is in use.

        The rotation steps (add, activate, remove) then need no restart: a Kubernetes Secret update
        or a SIGHUP is enough. A file that fails to load leaves the ring in use untouched (logged and
        counted). The chunk cache's at-rest key stays the one derived at startup.
        """
        path = self.cfg.key_ring
        if not self.cfg.encryption or path is None or self.service is None:
            return False
        stamp = _file_stamp(path)
        if only_if_changed and stamp == self._ring_stamp:
            return False
        try:
            ring = await asyncio.to_thread(KeyRing.load, path)
        except (errors.KeyRingError, OSError) as e:
            if stamp != self._ring_stamp or not only_if_changed:
                why = {"fields": {"reason": str(e)}}
                log.error("key ring not reloaded, keeping the one in use", extra=why)
                self.metrics.key_ring_reloads.labels("error").inc()
            self._ring_stamp = stamp  # one complaint per change of the file, not one per check
            return False
        self._ring_stamp = stamp
        old = self.keyring
        self.keyring = ring
        self.service.replace_keyring(ring)
        self.metrics.key_ring_reloads.labels("ok").inc()
        self.metrics.key_ring_loaded(ring.ids(), ring.active_id)
        log.info(
            "key ring reloaded",
            extra={
                "fields": {
                    "keys": ",".join(ring.ids()),
                    "active": ring.active_id,
                    "previous_active": old.active_id if old is not None else None,
                }
            },
        )
        return True

    async def watch_keyring(self) -> None:
        """Look at the key ring file every key_ring_check seconds; reload it when it changed."""
        interval = self.cfg.key_ring_check
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reload_keyring(only_if_changed=True)
            except Exception:  # never let the watcher die silently
                log.exception("key ring check failed")

    @property
    def objects(self) -> ObjectService:
        assert self.service is not None, "server not started"
        return self.service


def _open_backend(cfg: Config, metrics: Metrics) -> Backend:
    def on_request(
        op: str, outcome: str, seconds: float, retries: int, bytes_in: int, bytes_out: int
    ) -> None:
        # A missing key is an answer, not a failure: clients look up objects that may not exist.
        if outcome in NOT_FOUND:
            outcome = "not_found"
        metrics.backend_requests.labels(op, outcome).inc()
        metrics.backend_seconds.labels(op).observe(seconds)
        if retries:
            metrics.backend_retries.labels(op).inc(retries)
        metrics.backend_bytes_in.inc(bytes_in)
        metrics.backend_bytes_out.inc(bytes_out)

    if cfg.local_backend:
        return open_backend("file://" + str(cfg.backend_path().resolve()), on_request=on_request)
    return open_backend(
        cfg.backend,
        region=cfg.backend_region,
        path_style=cfg.backend_path_style,
        part_size=cfg.backend_part_size,
        access_key=cfg.backend_access_key,
        secret_key=cfg.backend_secret_key,
        max_attempts=cfg.backend_max_attempts,
        on_request=on_request,
    )


def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is replaced or rewritten (follows symlinks, as Secret volumes use)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _load_keyring(cfg: Config) -> KeyRing:
    assert cfg.key_ring is not None
    if cfg.dev_mode and not cfg.key_ring.exists():
        ring = KeyRing.new()
        cfg.key_ring.parent.mkdir(parents=True, exist_ok=True)
        ring.save(cfg.key_ring)
        log.warning("generated a development key ring", extra={"fields": {"path": str(cfg.key_ring)}})
        return ring
    return KeyRing.load(cfg.key_ring)


async def _ensure_local_root(cfg: Config) -> None:
    await asyncio.to_thread(cfg.backend_path().mkdir, parents=True, exist_ok=True)


# -- request plumbing ------------------------------------------------------------------------------


def _split_target(raw: str) -> tuple[str, str]:
    path, _, query = raw.partition("?")
    return path or "/", query


def _query(raw_query: str) -> dict[str, str]:
    return dict(parse_qsl(raw_query, keep_blank_values=True))


def _xml(body: bytes, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/xml", headers=headers)


def _error_response(err: errors.S3Error, resource: str, request_id: str, method: str) -> web.Response:
    body = b"" if method == "HEAD" else xml.error_xml(err, resource, request_id)
    headers = {"x-amz-request-id": request_id}
    if err.status == 503:
        headers["Retry-After"] = "1"
    if isinstance(err, errors.InvalidRange) and "ActualObjectSize" in err.fields:
        headers["Content-Range"] = ranges.unsatisfied_range(int(err.fields["ActualObjectSize"]))
    return web.Response(body=body, status=err.status, content_type="application/xml", headers=headers)


async def handle(request: web.Request) -> web.StreamResponse:
    proxy: Proxy = request.app[PROXY]
    metrics = proxy.metrics
    request_id = secrets.token_hex(8).upper()
    started = time.monotonic()
    raw_path, raw_query = _split_target(request.raw_path)
    op = "Unknown"
    call: Call | None = None
    response: web.StreamResponse | None = None
    error_code = ""
    metrics.in_flight.inc()
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
            )
            op = s3.operation
            if s3.key is not None and (s3.key.startswith(INTERNAL) or s3.key == INTERNAL.rstrip("/")):
                raise errors.AccessDenied("Keys under .tsproxy/ are reserved.")
            auth = verify(
                request.method,
                raw_path,
                raw_query,
                request.headers,
                proxy.secrets.get,
                datetime.now(UTC),
                allow_anonymous=proxy.cfg.anonymous,
                max_skew=timedelta(seconds=proxy.cfg.max_clock_skew),
            )
            if proxy.draining and op in ("PutObject", "UploadPart", "CreateMultipartUpload", "CopyObject"):
                raise errors.ServiceUnavailable("tsproxy is shutting down.")
            call = Call(request, s3, query, auth, request_id)
            response = await HANDLERS[op](proxy, call)
        except errors.S3Error as e:
            error_code = e.code
            if e.status >= 500:
                log.warning(
                    "request failed",
                    extra={"fields": {"request_id": request_id, "code": e.code, "error": str(e)}},
                )
            response = _error_response(e, raw_path, request_id, request.method)
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
        return response
    finally:
        metrics.in_flight.dec()
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
            "operation": op,
            "status": int(status) if status.isdigit() else status,
            "duration_ms": round(elapsed * 1000, 2),
            "user_agent": request.headers.get("User-Agent", ""),
        }
        if call is not None:
            fields.update(access_key=call.auth.access_key, bytes_in=call.bytes_in, bytes_out=call.bytes_out)
        if error_code:
            fields["error"] = error_code
        access_log.info("request", extra={"fields": fields})


def _user_metadata(headers: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower.startswith("x-amz-meta-"):
            out[lower[len("x-amz-meta-") :]] = value
    return out


def _stored_headers(headers: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for name in STORED_HEADERS:
        value = headers.get(name)
        if value is None:
            continue
        if name == "content-encoding":
            # aws-chunked is the transfer framing of the upload, not an encoding of the object.
            value = ",".join(v.strip() for v in value.split(",") if v.strip().lower() != "aws-chunked")
            if not value:
                continue
        out[name] = value
    return out


def _content_type(headers: Mapping[str, str]) -> str | None:
    return headers.get("Content-Type")


def _object_headers(obj: StoredObject, query: Mapping[str, str]) -> CIMultiDict[str]:
    h: CIMultiDict[str] = CIMultiDict()
    h["ETag"] = f'"{obj.etag}"'
    h["Last-Modified"] = ranges.http_date(obj.last_modified)
    h["Accept-Ranges"] = "bytes"
    h["Content-Type"] = obj.content_type or "binary/octet-stream"
    for name, value in obj.headers.items():
        if not name.startswith("x-amz-checksum-"):
            h[name] = value
    for name, value in obj.metadata.items():
        h["x-amz-meta-" + name] = value
    for param, header in RESPONSE_OVERRIDES.items():
        if param in query:
            h[header] = query[param]
    return h


# -- buckets -----------------------------------------------------------------------------------------


@operation("ListBuckets")
async def list_buckets(proxy: Proxy, call: Call) -> web.StreamResponse:
    buckets = await proxy.objects.list_buckets()
    return _xml(xml.list_buckets_xml(buckets, OWNER_ID, OWNER_ID))


@operation("CreateBucket")
async def create_bucket(proxy: Proxy, call: Call) -> web.StreamResponse:
    body = await _small_body(call)
    if body:
        xml.parse_create_bucket(body)
    await proxy.objects.create_bucket(call.bucket)
    return web.Response(status=200, headers={"Location": "/" + call.bucket})


@operation("HeadBucket")
async def head_bucket(proxy: Proxy, call: Call) -> web.StreamResponse:
    await proxy.objects.head_bucket(call.bucket)
    return web.Response(status=200, headers={"x-amz-bucket-region": proxy.cfg.region})


@operation("DeleteBucket")
async def delete_bucket(proxy: Proxy, call: Call) -> web.StreamResponse:
    await proxy.objects.delete_bucket(call.bucket)
    return web.Response(status=204)


@operation("GetBucketLocation")
async def get_bucket_location(proxy: Proxy, call: Call) -> web.StreamResponse:
    await proxy.objects.head_bucket(call.bucket)
    return _xml(xml.location_xml(None if proxy.cfg.region == "us-east-1" else proxy.cfg.region))


@operation("GetBucketVersioning")
async def get_bucket_versioning(proxy: Proxy, call: Call) -> web.StreamResponse:
    await proxy.objects.head_bucket(call.bucket)
    return _xml(xml.versioning_xml())


def _max_keys(query: Mapping[str, str], name: str = "max-keys", default: int = 1000) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise errors.InvalidArgument(
            "Provided max-keys not an integer or within integer range", ArgumentName=name
        ) from None
    if value < 0:
        raise errors.InvalidArgument(
            "Argument maxKeys must be an integer between 0 and 2147483647", ArgumentName=name
        )
    return min(value, 1000)


def _encoding_type(query: Mapping[str, str]) -> str | None:
    enc = query.get("encoding-type")
    if enc not in (None, "url"):
        raise errors.InvalidArgument(
            "Invalid Encoding Method specified in Request", ArgumentName="encoding-type"
        )
    return enc


@dataclass(frozen=True)
class _Listing:
    """The parameters every listing shares, and the page they asked for."""

    prefix: str
    delimiter: str | None
    max_keys: int
    encoding: str | None
    page: ListedPage

    @property
    def objects(self) -> list[xml.ObjectEntry]:
        return [_entry(o) for o in self.page.objects]

    @property
    def next_marker(self) -> str | None:
        """Where a v1 or versions listing goes on: the last key or common prefix of a truncated page."""
        if not self.page.is_truncated:
            return None
        return max([o.key for o in self.page.objects] + self.page.common_prefixes, default=None)


async def _list(proxy: Proxy, call: Call, *, start_after: str | None, token: str | None = None) -> _Listing:
    q = call.query
    max_keys = _max_keys(q)
    prefix, delimiter, encoding = q.get("prefix", ""), q.get("delimiter") or None, _encoding_type(q)
    page = ListedPage([], [], False, None)
    if max_keys:
        page = await proxy.objects.list_objects(
            call.bucket,
            prefix=prefix,
            delimiter=delimiter,
            start_after=start_after,
            token=token,
            max_keys=max_keys,
        )
    return _Listing(prefix, delimiter, max_keys, encoding, page)


@operation("ListObjectsV2")
async def list_objects_v2(proxy: Proxy, call: Call) -> web.StreamResponse:
    token, start_after = call.query.get("continuation-token") or None, call.query.get("start-after") or None
    ls = await _list(proxy, call, start_after=start_after, token=token)
    return _xml(
        xml.list_objects_v2_xml(
            bucket=call.bucket,
            prefix=ls.prefix,
            delimiter=ls.delimiter,
            max_keys=ls.max_keys,
            objects=ls.objects,
            common_prefixes=ls.page.common_prefixes,
            is_truncated=ls.page.is_truncated,
            continuation_token=token,
            next_continuation_token=ls.page.next_token if ls.page.is_truncated else None,
            start_after=start_after,
            encoding_type=ls.encoding,
            fetch_owner=call.query.get("fetch-owner") == "true",
            owner_id=OWNER_ID,
        )
    )


@operation("ListObjects")
async def list_objects_v1(proxy: Proxy, call: Call) -> web.StreamResponse:
    marker = call.query.get("marker") or None
    ls = await _list(proxy, call, start_after=marker)
    return _xml(
        xml.list_objects_v1_xml(
            bucket=call.bucket,
            prefix=ls.prefix,
            delimiter=ls.delimiter,
            max_keys=ls.max_keys,
            marker=marker,
            objects=ls.objects,
            common_prefixes=ls.page.common_prefixes,
            is_truncated=ls.page.is_truncated,
            next_marker=ls.next_marker,
            encoding_type=ls.encoding,
            owner_id=OWNER_ID,
        )
    )


@operation("ListObjectVersions")
async def list_object_versions(proxy: Proxy, call: Call) -> web.StreamResponse:
    # Buckets behind tsproxy are unversioned: every current object is version "null".
    marker = call.query.get("key-marker") or None
    ls = await _list(proxy, call, start_after=marker)
    return _xml(
        xml.list_object_versions_xml(
            bucket=call.bucket,
            prefix=ls.prefix,
            delimiter=ls.delimiter,
            max_keys=ls.max_keys,
            key_marker=marker,
            objects=ls.objects,
            common_prefixes=ls.page.common_prefixes,
            is_truncated=ls.page.is_truncated,
            next_key_marker=ls.next_marker,
            encoding_type=ls.encoding,
            owner_id=OWNER_ID,
        )
    )


def _entry(o: Any) -> xml.ObjectEntry:
    return xml.ObjectEntry(key=o.key, size=o.size, etag=o.etag, last_modified=o.last_modified)


# -- objects -----------------------------------------------------------------------------------------


@operation("HeadObject")
async def head_object(proxy: Proxy, call: Call) -> web.StreamResponse:
    obj = await proxy.objects.resolve(call.bucket, call.key)
    return await _send_object(proxy, call, obj, head=True)


@operation("GetObject")
async def get_object(proxy: Proxy, call: Call) -> web.StreamResponse:
    obj = await proxy.objects.resolve(call.bucket, call.key)
    try:
        return await _send_object(proxy, call, obj, head=False)
    except ObjectChanged:
        # Overwritten since we resolved it, and nothing sent yet: serve the new version.
        proxy.objects.invalidate(call.bucket, call.key)
        obj = await proxy.objects.resolve(call.bucket, call.key)
        return await _send_object(proxy, call, obj, head=False)


async def _send_object(proxy: Proxy, call: Call, obj: StoredObject, *, head: bool) -> web.StreamResponse:
    request = call.request
    status = ranges.check_preconditions(request.headers, obj.etag, obj.last_modified, method=request.method)
    headers = _object_headers(obj, call.query)
    if status == 304:
        for name in ("Content-Type", "Accept-Ranges"):
            headers.popall(name, None)
        return web.Response(status=304, headers=headers)
    try:
        span = ranges.parse_range(request.headers.get("Range"), obj.size)
    except errors.InvalidRange as e:
        raise errors.InvalidRange(
            e.message, RangeRequested=request.headers.get("Range", ""), ActualObjectSize=str(obj.size)
        ) from None
    first, last = span if span is not None else (0, obj.size - 1)
    length = last - first + 1 if obj.size else 0
    status = 206 if span is not None else 200
    if span is not None:
        headers["Content-Range"] = ranges.content_range(first, last, obj.size)
    elif request.headers.get("x-amz-checksum-mode", "").upper() == "ENABLED":
        for name, value in obj.headers.items():
            if name.startswith("x-amz-checksum-"):
                headers[name] = value
    response = web.StreamResponse(status=status, headers=headers)
    response.content_length = length
    if head or length == 0:
        await response.prepare(request)
        await response.write_eof()
        return response
    # Pull the first piece before sending headers, so that a missing or unreadable object still gets a
    # proper S3 error instead of a truncated 200.
    stream = proxy.objects.read(obj, first, last)
    iterator = aiter(stream)
    try:
        piece = await anext(iterator)
    except StopAsyncIteration:
        raise errors.InternalError("empty read") from None
    except BaseException:
        await _close(iterator)
        raise
    await response.prepare(request)
    sent = 0
    try:
        while True:
            await response.write(piece)
            sent += len(piece)
            try:
                piece = await anext(iterator)
            except StopAsyncIteration:
                break
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as e:
        # Headers are gone: the only honest signal left is to cut the connection short.
        proxy.metrics.integrity_errors.inc() if isinstance(e, errors.FormatError) else None
        log.error(
            "read failed mid-response", extra={"fields": {"request_id": call.request_id, "error": repr(e)}}
        )
        call.bytes_out = sent
        proxy.metrics.client_bytes_out.inc(sent)
        if request.transport is not None:
            request.transport.close()
        return response
    finally:
        await _close(iterator)
    call.bytes_out = sent
    proxy.metrics.client_bytes_out.inc(sent)
    await response.write_eof()
    return response


async def _close(iterator: AsyncIterator[Any]) -> None:
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()


def _client_payload(call: Call, result: BodyResult) -> AsyncIterator[bytes]:
    async def counted() -> AsyncIterator[bytes]:
        async for piece in payload(call.request.content, call.request.headers, call.auth, result):
            call.bytes_in += len(piece)
            yield piece

    return counted()


@operation("PutObject")
async def put_object(proxy: Proxy, call: Call) -> web.StreamResponse:
    h = call.request.headers
    result = BodyResult()
    size_hint = _decoded_length(h)
    obj = await proxy.objects.put(
        call.bucket,
        call.key,
        _client_payload(call, result),
        content_type=_content_type(h),
        metadata=_user_metadata(h),
        headers={**_stored_headers(h)},
        size_hint=size_hint,
    )
    proxy.metrics.client_bytes_in.inc(result.size)
    headers = {"ETag": f'"{obj.etag}"', **result.checksums}
    return web.Response(status=200, headers=headers)


def _decoded_length(h: Mapping[str, str]) -> int | None:
    raw = h.get("x-amz-decoded-content-length") or h.get("Content-Length")
    return int(raw) if raw and raw.isdigit() else None


def _copy_source(proxy: Proxy, call: Call) -> tuple[str, str]:
    bucket, key, version = parse_copy_source(call.request.headers["x-amz-copy-source"])
    if version not in (None, "null"):
        raise errors.InvalidArgument("Invalid version id specified", ArgumentName="x-amz-copy-source")
    if key.startswith(INTERNAL):
        raise errors.AccessDenied("Keys under .tsproxy/ are reserved.")
    return bucket, key


async def _copy_source_object(proxy: Proxy, call: Call) -> StoredObject:
    bucket, key = _copy_source(proxy, call)
    src = await proxy.objects.resolve(bucket, key)
    h = call.request.headers
    conditions = {
        "If-Match": h.get("x-amz-copy-source-if-match"),
        "If-None-Match": h.get("x-amz-copy-source-if-none-match"),
        "If-Modified-Since": h.get("x-amz-copy-source-if-modified-since"),
        "If-Unmodified-Since": h.get("x-amz-copy-source-if-unmodified-since"),
    }
    present = CIMultiDictProxy(CIMultiDict({k: v for k, v in conditions.items() if v is not None}))
    if present and ranges.check_preconditions(present, src.etag, src.last_modified, method="PUT") == 304:
        raise errors.PreconditionFailed()
    return src


@operation("CopyObject")
async def copy_object(proxy: Proxy, call: Call) -> web.StreamResponse:
    h = call.request.headers
    src = await _copy_source_object(proxy, call)
    directive = h.get("x-amz-metadata-directive", "COPY").upper()
    if directive not in ("COPY", "REPLACE"):
        raise errors.InvalidArgument("Unknown metadata directive.", ArgumentName="x-amz-metadata-directive")
    replace = directive == "REPLACE"
    same = proxy.objects.ns.object(call.bucket, call.key) == src.loc
    if same and not replace:
        raise errors.InvalidRequest(
            "This copy request is illegal because it is trying to copy an object to itself without changing "
            "the "
            "object's metadata, storage class, website redirect location or encryption attributes."
        )
    obj = await proxy.objects.copy(
        src,
        call.bucket,
        call.key,
        replace=replace,
        content_type=_content_type(h) if replace else src.content_type,
        metadata=_user_metadata(h) if replace else src.metadata,
        headers=_stored_headers(h) if replace else src.headers,
    )
    return _xml(xml.copy_object_xml(obj.etag, obj.last_modified))


@operation("DeleteObject")
async def delete_object(proxy: Proxy, call: Call) -> web.StreamResponse:
    await proxy.objects.delete(call.bucket, call.key)
    return web.Response(status=204)


@operation("DeleteObjects")
async def delete_objects(proxy: Proxy, call: Call) -> web.StreamResponse:
    body = await _small_body(call, limit=2 << 20)
    keys, quiet = xml.parse_delete(body)
    reserved = [k for k in keys if k.startswith(INTERNAL)]
    allowed = [k for k in keys if not k.startswith(INTERNAL)]
    failures = await proxy.objects.delete_many(call.bucket, allowed) if allowed else []
    failures += [(k, "AccessDenied", "Access Denied") for k in reserved]
    failed = {k for k, _, _ in failures}
    deleted = [k for k in keys if k not in failed]
    return _xml(xml.delete_result_xml(deleted, failures, quiet))


async def _small_body(call: Call, limit: int = 1 << 20) -> bytes:
    """A small request body (XML), checked like any other, bounded in size."""
    result = BodyResult()
    out = bytearray()
    async for piece in _client_payload(call, result):
        out += piece
        if len(out) > limit:
            raise errors.MalformedXML("The XML you provided was too large.")
    return bytes(out)


# -- multipart ---------------------------------------------------------------------------------------


@operation("CreateMultipartUpload")
async def create_multipart_upload(proxy: Proxy, call: Call) -> web.StreamResponse:
    h = call.request.headers
    upload_id = await proxy.objects.create_upload(
        call.bucket,
        call.key,
        content_type=_content_type(h),
        metadata=_user_metadata(h),
        headers=_stored_headers(h),
    )
    return _xml(xml.initiate_multipart_xml(call.bucket, call.key, upload_id))


def _part_number(query: Mapping[str, str]) -> int:
    raw = query.get("partNumber", "")
    if not raw.isdigit() or not 1 <= int(raw) <= 10000:
        raise errors.InvalidArgument(
            "Part number must be an integer between 1 and 10000, inclusive", ArgumentName="partNumber"
        )
    return int(raw)


@operation("UploadPart")
async def upload_part(proxy: Proxy, call: Call) -> web.StreamResponse:
    part_no = _part_number(call.query)
    result = BodyResult()
    proxy.metrics.multipart_in_progress.inc()
    try:
        record = await proxy.objects.upload_part(
            call.bucket, call.key, call.query["uploadId"], part_no, _client_payload(call, result)
        )
    finally:
        proxy.metrics.multipart_in_progress.dec()
    proxy.metrics.client_bytes_in.inc(result.size)
    return web.Response(status=200, headers={"ETag": f'"{record.etag}"', **result.checksums})


@operation("UploadPartCopy")
async def upload_part_copy(proxy: Proxy, call: Call) -> web.StreamResponse:
    part_no = _part_number(call.query)
    src = await _copy_source_object(proxy, call)
    raw_range = call.request.headers.get("x-amz-copy-source-range")
    if raw_range is None:
        first, last = 0, src.size - 1
    else:
        parsed = ranges.parse_range(raw_range, src.size)
        if parsed is None or not raw_range.startswith("bytes=") or raw_range.startswith("bytes=-"):
            raise errors.InvalidArgument(
                "The x-amz-copy-source-range value must be of the form bytes=first-last where first and last "
                "are "
                "the zero-based offsets of the first and last bytes to copy",
                ArgumentName="x-amz-copy-source-range",
            )
        first, last = parsed
    upload_id = call.query["uploadId"]
    await proxy.objects._upload_state(call.bucket, call.key, upload_id)
    source: AsyncIterator[bytes | memoryview] = proxy.objects.read(src, first, last) if src.size else _empty()
    record = await proxy.objects.upload_part(call.bucket, call.key, upload_id, part_no, source)
    return _xml(xml.copy_part_xml(record.etag, record.last_modified))


async def _empty() -> AsyncIterator[bytes | memoryview]:
    return
    yield b""  # pragma: no cover


@operation("CompleteMultipartUpload")
async def complete_multipart_upload(proxy: Proxy, call: Call) -> web.StreamResponse:
    body = await _small_body(call, limit=4 << 20)
    parts = xml.parse_complete_multipart(body)
    upload_id = call.query["uploadId"]
    # Completion of a large upload can take a while (server-side copies); S3 keeps the connection alive by
    # sending the 200 early and whitespace until the XML result (or an error document) is ready.
    task = asyncio.ensure_future(proxy.objects.complete_upload(call.bucket, call.key, upload_id, parts))
    try:
        obj = await asyncio.wait_for(asyncio.shield(task), timeout=COMPLETE_KEEPALIVE_AFTER)
    except TimeoutError:
        return await _complete_slowly(call, task)
    location = f"http://{call.request.headers.get('Host', '')}/{call.bucket}/{quote(call.key)}"
    return _xml(xml.complete_multipart_xml(location, call.bucket, call.key, obj.etag))


async def _complete_slowly(call: Call, task: asyncio.Future[StoredObject]) -> web.StreamResponse:
    # As S3 does: the XML declaration first, then a space every few seconds, then the document itself.
    response = web.StreamResponse(status=200, headers={"Content-Type": "application/xml"})
    await response.prepare(call.request)
    await response.write(XML_DECLARATION)
    while not task.done():
        await response.write(b" ")
        await asyncio.wait([task], timeout=COMPLETE_KEEPALIVE_AFTER)
    try:
        obj = task.result()
        location = f"http://{call.request.headers.get('Host', '')}/{call.bucket}/{quote(call.key)}"
        body = xml.complete_multipart_xml(location, call.bucket, call.key, obj.etag)
    except errors.S3Error as e:
        body = xml.error_xml(e, call.request.path, call.request_id)
    except Exception:
        log.exception("completion failed", extra={"fields": {"request_id": call.request_id}})
        body = xml.error_xml(errors.InternalError(), call.request.path, call.request_id)
    if body.startswith(b"<?xml"):
        body = body[body.index(b"?>") + 2 :].lstrip()
    await response.write(body)
    await response.write_eof()
    return response


@operation("AbortMultipartUpload")
async def abort_multipart_upload(proxy: Proxy, call: Call) -> web.StreamResponse:
    await proxy.objects.abort_upload(call.bucket, call.key, call.query["uploadId"])
    return web.Response(status=204)


@operation("ListParts")
async def list_parts(proxy: Proxy, call: Call) -> web.StreamResponse:
    q = call.query
    upload_id = q["uploadId"]
    marker_raw = q.get("part-number-marker") or "0"
    if not marker_raw.isdigit():
        raise errors.InvalidArgument("Invalid part number marker", ArgumentName="part-number-marker")
    marker = int(marker_raw)
    max_parts = _max_keys(q, "max-parts")
    state, records = await proxy.objects.list_parts(call.bucket, call.key, upload_id)
    after = [r for r in records if r.part_no > marker]
    page = after[:max_parts]
    truncated = len(after) > len(page)
    return _xml(
        xml.list_parts_xml(
            bucket=call.bucket,
            key=call.key,
            upload_id=upload_id,
            part_number_marker=marker,
            next_part_number_marker=page[-1].part_no if page else marker,
            max_parts=max_parts,
            is_truncated=truncated,
            parts=[xml.PartEntry(r.part_no, r.etag, r.size, r.last_modified) for r in page],
            owner_id=OWNER_ID,
            initiated=state.initiated,
        )
    )


@operation("ListMultipartUploads")
async def list_multipart_uploads(proxy: Proxy, call: Call) -> web.StreamResponse:
    q = call.query
    prefix = q.get("prefix", "")
    max_uploads = _max_keys(q, "max-uploads")
    key_marker = q.get("key-marker", "")
    uploads = [u for u in await proxy.objects.list_uploads(call.bucket, prefix) if u.key > key_marker]
    page = uploads[:max_uploads]
    return _xml(
        xml.list_multipart_uploads_xml(
            bucket=call.bucket,
            prefix=prefix,
            key_marker=key_marker,
            max_uploads=max_uploads,
            is_truncated=len(uploads) > len(page),
            uploads=[xml.UploadEntry(u.key, u.upload_id, u.initiated) for u in page],
            owner_id=OWNER_ID,
        )
    )


# -- health and metrics --------------------------------------------------------------------------------


async def _metrics(request: web.Request) -> web.Response:
    proxy: Proxy = request.app[PROXY]
    if proxy.cache is not None:
        proxy.metrics.cache_size.set(proxy.cache.size_bytes())
    proxy.metrics.cache_limit.set(proxy.cfg.cache_size if proxy.cache is not None else 0)
    body = generate_latest(proxy.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    proxy: Proxy = request.app[PROXY]
    problems = []
    if not proxy.ready:
        problems.append("starting" if not proxy.draining else "shutting down")
    if proxy.cfg.encryption and proxy.keyring is None:
        problems.append("key ring not loaded")
    if proxy.ready:
        try:
            await asyncio.wait_for(proxy.backend.ping(), timeout=5)
        except Exception as e:
            problems.append(f"backend unreachable: {type(e).__name__}")
    if problems:
        return web.json_response({"status": "unready", "problems": problems}, status=503)
    return web.json_response({"status": "ready"})


def create_app(proxy: Proxy) -> web.Application:
    """The S3 application (the handler takes every path; routing is S3's, not aiohttp's)."""
    app = web.Application(client_max_size=1 << 20, handler_args={"max_field_size": 65536})
    app[PROXY] = proxy
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def create_metrics_app(proxy: Proxy) -> web.Application:
    app = web.Application()
    app[PROXY] = proxy
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    return app


async def run(cfg: Config, *, ready: Callable[[], None] | None = None) -> None:
    """Serve until SIGTERM/SIGINT, then drain: stop accepting, let in-flight requests finish (grace)."""
    proxy = Proxy(cfg)
    await proxy.start()
    runners = []
    try:
        main = web.AppRunner(create_app(proxy), access_log=None, shutdown_timeout=cfg.shutdown_grace)
        await main.setup()
        await web.TCPSite(main, cfg.listen[0], cfg.listen[1], reuse_address=True).start()
        runners.append(main)
        if cfg.metrics_listen is not None:
            side = web.AppRunner(create_metrics_app(proxy), access_log=None)
            await side.setup()
            await web.TCPSite(side, cfg.metrics_listen[0], cfg.metrics_listen[1], reuse_address=True).start()
            runners.append(side)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        background: set[asyncio.Task[Any]] = set()

        def on_hup() -> None:
            task = loop.create_task(proxy.reload_keyring())
            background.add(task)
            task.add_done_callback(background.discard)

        loop.add_signal_handler(signal.SIGHUP, on_hup)
        log.info(
            "listening",
            extra={"fields": {"listen": f"{cfg.listen[0]}:{cfg.listen[1]}", "backend": cfg.backend}},
        )
        if ready is not None:
            ready()
        await stop.wait()
        log.info("shutting down", extra={"fields": {"grace_seconds": cfg.shutdown_grace}})
        proxy.draining = True
        proxy.ready = False
        # AppRunner.cleanup stops listening, then waits up to shutdown_timeout for in-flight handlers.
        await main.cleanup()
    finally:
        for r in reversed(runners):
            await r.cleanup()
        await proxy.stop()
