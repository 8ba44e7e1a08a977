"""Object handlers: GET and HEAD (ranges, overrides), PUT, copy, delete."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from tsproxy import errors
from tsproxy.s3 import ranges, xml
from tsproxy.s3.routing import parse_copy_source
from tsproxy.server.exchange import Exchange, xml_response
from tsproxy.server.headers import content_type, object_headers, stored_headers, user_metadata
from tsproxy.server.request_body import BodyResult, content_md5
from tsproxy.service import ObjectChanged, StoredObject
from tsproxy.store.base import aclose

# -- objects -----------------------------------------------------------------------------------------

log = logging.getLogger("tsproxy.server")
_MULTIPART_ETAG = re.compile(r"[0-9a-f]{32}-[0-9]+")


class InvalidPartNumber(errors.S3Error):
    """A GET or HEAD with a partNumber the object does not have."""

    code = "InvalidPartNumber"
    status = 416
    default_message = "The requested partnumber is not satisfiable"


def part_span(obj: StoredObject, part_no: int) -> tuple[int, int, int | None]:
    """First and last byte of part `part_no` of `obj`, and its parts count (None: not multipart).

    Parts count by position, 1 to the count, whatever numbers the upload gave them. An object that
    was not uploaded in parts (or a passthrough object, whose parts tsproxy does not know) is one part.
    """
    segments = obj.manifest.segments if obj.manifest is not None else ()
    multipart = obj.manifest is not None and _MULTIPART_ETAG.fullmatch(obj.etag) is not None
    if not multipart:
        if part_no != 1:
            raise InvalidPartNumber(PartNumberRequested=str(part_no), ActualPartCount="1")
        return 0, obj.size - 1, None
    if part_no > len(segments):
        raise InvalidPartNumber(PartNumberRequested=str(part_no), ActualPartCount=str(len(segments)))
    first = sum(seg.original_size for seg in segments[: part_no - 1])
    return first, first + segments[part_no - 1].original_size - 1, len(segments)


async def head_object(ex: Exchange) -> web.StreamResponse:
    # A part's span needs the manifest's segments; otherwise the size catalog may spare the tail read.
    if _part_number(ex.query) is not None:
        obj = await ex.service.resolve(ex.bucket, ex.key)
    else:
        obj = await ex.service.resolve_for_head(ex.bucket, ex.key)
    return await _send_object(ex, obj, head=True)


async def get_object(ex: Exchange) -> web.StreamResponse:
    # A ranged read from the object's first byte gets the object's first chunks fetched with its tail.
    head_for = (
        None
        if _part_number(ex.query) is not None
        else ranges.span_from_start(ex.request.headers.get("Range"))
    )
    obj = await ex.service.resolve(ex.bucket, ex.key, head_for=head_for)
    try:
        return await _send_object(ex, obj, head=False)
    except ObjectChanged:
        # Overwritten since we resolved it, and nothing sent yet: serve the new version.
        ex.service.invalidate(ex.bucket, ex.key)
        obj = await ex.service.resolve(ex.bucket, ex.key)
        return await _send_object(ex, obj, head=False)


async def _send_object(ex: Exchange, obj: StoredObject, *, head: bool) -> web.StreamResponse:
    request = ex.request
    status = ranges.check_preconditions(request.headers, obj.etag, obj.last_modified, method=request.method)
    headers = object_headers(obj, ex.query)
    if status == 304:
        for name in ("Content-Type", "Accept-Ranges"):
            headers.popall(name, None)
        return web.Response(status=304, headers=headers)
    part_no = _part_number(ex.query)
    if part_no is not None:
        if "Range" in request.headers:
            raise errors.InvalidRequest("Cannot specify both Range header and partNumber query parameter")
        first, last, parts_count = part_span(obj, part_no)
        span = (first, last) if last >= first else None  # an empty object is one empty part
        if parts_count is not None:
            headers["x-amz-mp-parts-count"] = str(parts_count)
    else:
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
    stream = ex.service.read(obj, first, last)
    iterator = aiter(stream)
    try:
        piece = await anext(iterator)
    except StopAsyncIteration:
        raise errors.InternalError("empty read") from None
    except BaseException:
        await aclose(iterator)
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
        ex.metrics.integrity_errors.inc() if isinstance(e, errors.FormatError) else None
        log.error(
            "read failed mid-response", extra={"fields": {"request_id": ex.request_id, "error": repr(e)}}
        )
        ex.bytes_out = sent
        ex.metrics.client_bytes_out.inc(sent)
        if request.transport is not None:
            request.transport.close()
        return response
    finally:
        await aclose(iterator)
    ex.bytes_out = sent
    ex.metrics.client_bytes_out.inc(sent)
    await response.write_eof()
    return response


def _part_number(query: Mapping[str, str]) -> int | None:
    raw = query.get("partNumber")
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or raw.startswith("0") or not 1 <= int(raw) <= 10000:
        raise errors.InvalidArgument(
            "Part number must be an integer between 1 and 10000, inclusive",
            ArgumentName="partNumber",
            ArgumentValue=raw,
        )
    return int(raw)


async def put_object(ex: Exchange) -> web.StreamResponse:
    h = ex.request.headers
    result = BodyResult()
    size_hint = _decoded_length(h)
    # The transform hashes the payload for the ETag anyway: it checks Content-MD5 too.
    obj = await ex.service.put(
        ex.bucket,
        ex.key,
        ex.payload(result, verify_md5=False),
        content_type=content_type(h),
        metadata=user_metadata(h),
        headers={**stored_headers(h)},
        size_hint=size_hint,
        content_md5=content_md5(h),
    )
    ex.metrics.client_bytes_in.inc(result.size)
    headers = {"ETag": f'"{obj.etag}"', **result.checksums}
    return web.Response(status=200, headers=headers)


def _decoded_length(h: Mapping[str, str]) -> int | None:
    raw = h.get("x-amz-decoded-content-length") or h.get("Content-Length")
    return int(raw) if raw and raw.isascii() and raw.isdigit() else None


def _copy_source(ex: Exchange) -> tuple[str, str]:
    bucket, key, version = parse_copy_source(ex.request.headers["x-amz-copy-source"])
    if version not in (None, "null"):
        raise errors.InvalidArgument("Invalid version id specified", ArgumentName="x-amz-copy-source")
    return bucket, key


async def copy_source_object(ex: Exchange) -> StoredObject:
    bucket, key = _copy_source(ex)
    src = await ex.service.resolve(bucket, key)
    h = ex.request.headers
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


async def copy_object(ex: Exchange) -> web.StreamResponse:
    h = ex.request.headers
    src = await copy_source_object(ex)
    directive = h.get("x-amz-metadata-directive", "COPY").upper()
    if directive not in ("COPY", "REPLACE"):
        raise errors.InvalidArgument("Unknown metadata directive.", ArgumentName="x-amz-metadata-directive")
    replace = directive == "REPLACE"
    same = ex.service.ns.object(ex.bucket, ex.key) == src.loc
    if same and not replace:
        raise errors.InvalidRequest(
            "This copy request is illegal because it is trying to copy an object to itself without changing "
            "the "
            "object's metadata, storage class, website redirect location or encryption attributes."
        )
    obj = await ex.service.copy(
        src,
        ex.bucket,
        ex.key,
        replace=replace,
        content_type=content_type(h) if replace else src.content_type,
        metadata=user_metadata(h) if replace else src.metadata,
        headers=stored_headers(h) if replace else src.headers,
    )
    return xml_response(xml.copy_object_xml(obj.etag, obj.last_modified))


async def delete_object(ex: Exchange) -> web.StreamResponse:
    await ex.service.delete(ex.bucket, ex.key)
    return web.Response(status=204)


async def delete_objects(ex: Exchange) -> web.StreamResponse:
    body = await ex.small_body(limit=2 << 20)
    keys, quiet = xml.parse_delete(body)
    failures = await ex.service.delete_many(ex.bucket, keys) if keys else []
    failed = {k for k, _, _ in failures}
    deleted = [k for k in keys if k not in failed]
    return xml_response(xml.delete_result_xml(deleted, failures, quiet))
