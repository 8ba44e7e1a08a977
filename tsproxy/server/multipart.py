"""Multipart upload handlers: create, parts, part copies, complete, abort, list."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from urllib.parse import quote

from aiohttp import web

from tsproxy import errors
from tsproxy.s3 import ranges, xml
from tsproxy.s3.limits import check_part_number
from tsproxy.server import listing, object_handlers
from tsproxy.server.exchange import OWNER_ID, XML_DECLARATION, Exchange, xml_response
from tsproxy.server.headers import content_type, stored_headers, user_metadata
from tsproxy.server.request_body import BodyResult, content_md5, declared_length
from tsproxy.service.uploads.records import CompletedUpload

# A completion still running after this many seconds answers 200 at once and keeps the connection alive.
COMPLETE_KEEPALIVE_AFTER = 5.0


# -- multipart ---------------------------------------------------------------------------------------

log = logging.getLogger("tsproxy.server")


async def create_multipart_upload(ex: Exchange) -> web.StreamResponse:
    h = ex.request.headers
    upload_id = await ex.service.create_upload(
        ex.bucket,
        ex.key,
        content_type=content_type(h),
        metadata=user_metadata(h),
        headers=stored_headers(h),
    )
    return xml_response(xml.initiate_multipart_xml(ex.bucket, ex.key, upload_id))


def _part_number(query: Mapping[str, str]) -> int:
    raw = query.get("partNumber", "")
    # Not a number: refused as out of range, as S3 does.
    # Not a number, or one written with a leading zero: refused as out of range, as S3 does.
    part_no = int(raw) if raw.isascii() and raw.isdigit() and not raw.startswith("0") else 0
    check_part_number(part_no)
    return part_no


async def upload_part(ex: Exchange) -> web.StreamResponse:
    part_no = _part_number(ex.query)
    result = BodyResult()
    ex.metrics.multipart_in_progress.inc()
    try:
        # The transform hashes the part anyway: it checks Content-MD5, not a second MD5 here.
        record = await ex.service.upload_part(
            ex.bucket,
            ex.key,
            ex.query["uploadId"],
            part_no,
            ex.payload(result, verify_md5=False),
            content_md5=content_md5(ex.request.headers),
            size_hint=declared_length(ex.request.headers),
        )
    finally:
        ex.metrics.multipart_in_progress.dec()
    ex.metrics.client_bytes_in.inc(result.size)
    return web.Response(status=200, headers={"ETag": f'"{record.etag}"', **result.checksums})


async def upload_part_copy(ex: Exchange) -> web.StreamResponse:
    part_no = _part_number(ex.query)
    src = await object_handlers.copy_source_object(ex)
    raw_range = ex.request.headers.get("x-amz-copy-source-range")
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
    upload_id = ex.query["uploadId"]
    await ex.service.upload_state(ex.bucket, ex.key, upload_id)
    source: AsyncIterator[bytes | memoryview] = ex.service.read(src, first, last) if src.size else _empty()
    record = await ex.service.upload_part(ex.bucket, ex.key, upload_id, part_no, source)
    return xml_response(xml.copy_part_xml(record.etag, record.last_modified))


async def _empty() -> AsyncIterator[bytes | memoryview]:
    return
    yield b""  # pragma: no cover


async def complete_multipart_upload(ex: Exchange) -> web.StreamResponse:
    body = await ex.small_body(limit=4 << 20)
    parts = xml.parse_complete_multipart(body)
    upload_id = ex.query["uploadId"]
    # Completion of a large upload can take a while (server-side copies); S3 keeps the connection alive by
    # sending the 200 early and whitespace until the XML result (or an error document) is ready.
    task = asyncio.ensure_future(ex.service.complete_upload(ex.bucket, ex.key, upload_id, parts))
    try:
        obj = await asyncio.wait_for(asyncio.shield(task), timeout=COMPLETE_KEEPALIVE_AFTER)
    except TimeoutError:
        return await _complete_slowly(ex, task)
    location = f"http://{ex.request.headers.get('Host', '')}/{ex.bucket}/{quote(ex.key)}"
    return xml_response(xml.complete_multipart_xml(location, ex.bucket, ex.key, obj.etag))


async def _complete_slowly(ex: Exchange, task: asyncio.Future[CompletedUpload]) -> web.StreamResponse:
    # As S3 does: the XML declaration first, then a space every few seconds, then the document itself.
    response = web.StreamResponse(status=200, headers={"Content-Type": "application/xml"})
    await response.prepare(ex.request)
    await response.write(XML_DECLARATION)
    while not task.done():
        await response.write(b" ")
        await asyncio.wait([task], timeout=COMPLETE_KEEPALIVE_AFTER)
    try:
        obj = task.result()
        location = f"http://{ex.request.headers.get('Host', '')}/{ex.bucket}/{quote(ex.key)}"
        body = xml.complete_multipart_xml(location, ex.bucket, ex.key, obj.etag)
    except errors.S3Error as e:
        body = xml.error_xml(e, ex.request.path, ex.request_id)
    except Exception:
        log.exception("completion failed", extra={"fields": {"request_id": ex.request_id}})
        body = xml.error_xml(errors.InternalError(), ex.request.path, ex.request_id)
    if body.startswith(b"<?xml"):
        body = body[body.index(b"?>") + 2 :].lstrip()
    await response.write(body)
    await response.write_eof()
    return response


async def abort_multipart_upload(ex: Exchange) -> web.StreamResponse:
    await ex.service.abort_upload(ex.bucket, ex.key, ex.query["uploadId"])
    return web.Response(status=204)


async def list_parts(ex: Exchange) -> web.StreamResponse:
    q = ex.query
    upload_id = q["uploadId"]
    marker_raw = q.get("part-number-marker") or "0"
    if not (marker_raw.isascii() and marker_raw.isdigit()):
        raise errors.InvalidArgument("Invalid part number marker", ArgumentName="part-number-marker")
    marker = int(marker_raw)
    max_parts = listing.max_keys(q, "max-parts")
    state, records = await ex.service.list_parts(ex.bucket, ex.key, upload_id)
    after = [r for r in records if r.part_no > marker]
    page = after[:max_parts]
    truncated = len(after) > len(page)
    return xml_response(
        xml.list_parts_xml(
            bucket=ex.bucket,
            key=ex.key,
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


async def list_multipart_uploads(ex: Exchange) -> web.StreamResponse:
    q = ex.query
    prefix = q.get("prefix", "")
    max_uploads = listing.max_keys(q, "max-uploads")
    key_marker = q.get("key-marker", "")
    uploads = [u for u in await ex.service.list_uploads(ex.bucket, prefix) if u.key > key_marker]
    page = uploads[:max_uploads]
    return xml_response(
        xml.list_multipart_uploads_xml(
            bucket=ex.bucket,
            prefix=prefix,
            key_marker=key_marker,
            max_uploads=max_uploads,
            is_truncated=len(uploads) > len(page),
            uploads=[xml.UploadEntry(u.key, u.upload_id, u.initiated) for u in page],
            owner_id=OWNER_ID,
        )
    )
