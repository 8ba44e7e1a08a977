"""A backend in any S3-compatible object store, through aiobotocore: the object path and buckets.

The class is built in layers, one module each: `s3client.S3Client` (settings, session, the observed
retry loop), `s3multipart.S3Multipart` (multipart uploads, also used here for large PUTs and copies)
and `S3Backend` here. Bodies live in `s3body`.

- **Bounded memory.** A streamed PUT holds at most one part (`part_size`, 25 MiB by default): up to
  one part it is a single PutObject, beyond that a multipart upload that is aborted on any failure,
  so nothing half-written ever becomes visible. GET bodies are read in pieces, never whole.
- **Resumed bodies.** A GET body cut short is resumed where it stopped with a ranged GET pinned to
  the same ETag (If-Match), so a reader never gets bytes of two versions; the resumed GET is admitted
  by `on_request` like any other request.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from tsproxy import errors
from tsproxy.store import s3errors
from tsproxy.store.base import (
    Body,
    BodyMD5,
    ListPage,
    ObjectInfo,
    check_key,
    check_range_args,
    normalize_metadata,
    range_header,
    resolve_range,
    unquote_etag,
)
from tsproxy.store.observe import BackendCall
from tsproxy.store.registry import BackendKind, register
from tsproxy.store.s3body import Regrouper, S3Reader, content_range, read_ahead, slices
from tsproxy.store.s3client import info_of, quote_etag, utc
from tsproxy.store.s3multipart import S3Multipart

DELETE_BATCH = 1000  # S3's limit of keys per DeleteObjects request
_XML_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\r\ufffe\uffff\ud800-\udfff]")


class S3Backend(S3Multipart):
    """Objects in an S3-compatible store. Create, `await start()`, use, `await close()`.

    Implements `Backend`, `MultipartCapable` and `BucketCapable`; settings: see `S3Client`.
    """

    @property
    def whole_md5_limit(self) -> int:
        """The largest body `put` sends in one PutObject, the only kind whose whole MD5 (`content_md5`) it
        uses: a larger one goes in parts of `part_size`, each hashed here. A writer need not hash beyond."""
        return self.part_size

    # -- buckets

    async def ping(self) -> None:
        """One ListBuckets, no retries: an answer of any kind but a 5xx means the store is up."""
        with self._call("ListBuckets") as call:
            await call.admit()
            try:
                await self.client.list_buckets()
            except Exception as e:
                code = s3errors.error_code(e)
                if code in ("AccessDenied", "403"):
                    return
                error = s3errors.to_s3_error(e)
                call.finish(error)
                raise error from e

    async def list_buckets(self) -> list[tuple[str, datetime]]:
        response = await self._request("ListBuckets", "list_buckets")
        return [(b["Name"], utc(b.get("CreationDate"))) for b in response.get("Buckets", [])]

    async def create_bucket(self, bucket: str) -> None:
        params: dict[str, Any] = {"Bucket": bucket}
        if self.region != "us-east-1":
            params["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        await self._request("CreateBucket", "create_bucket", fields={"BucketName": bucket}, **params)

    async def delete_bucket(self, bucket: str) -> None:
        await self._request("DeleteBucket", "delete_bucket", fields={"BucketName": bucket}, Bucket=bucket)

    async def head_bucket(self, bucket: str) -> None:
        await self._request(
            "HeadBucket",
            "head_bucket",
            not_found=errors.NoSuchBucket,
            fields={"BucketName": bucket},
            Bucket=bucket,
        )

    # -- objects

    async def _open_body(
        self, bucket: str, key: str, range_value: str | None, if_match: str | None, call: BackendCall
    ) -> dict[str, Any]:
        """One GetObject, retried within `call`: the first of a read, or the resumption of one."""
        if self.lean is not None:
            lean = functools.partial(
                self.lean.get_object,
                bucket,
                key,
                range_value,
                quote_etag(if_match) if if_match is not None else None,
            )
            answer: dict[str, Any] = await self._attempts(call, lean, Key=key)
            return answer
        params: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if range_value:
            params["Range"] = range_value
        if if_match is not None:
            params["IfMatch"] = quote_etag(if_match)
        bound = functools.partial(self.client.get_object, **params)
        response: dict[str, Any] = await self._attempts(call, bound, Key=key)
        return response

    async def get(
        self,
        bucket: str,
        key: str,
        first: int | None = None,
        last: int | None = None,
        *,
        if_match: str | None = None,
    ) -> S3Reader:
        check_range_args(first, last)
        call = self._call("GetObject")
        try:
            response = await self._open_body(bucket, key, range_header(first, last), if_match, call)
        except BaseException as e:
            call.finish(e)
            raise
        call.mark()
        try:
            length = int(response.get("ContentLength", 0))
            spans = content_range(response.get("ContentRange"))
            if spans is not None:
                start, stop, size = spans
                served: tuple[int, int] | None = (start, stop)
                end = stop + 1
            else:
                # A whole body: either no range was asked for, or the store ignored it (some do for
                # empty objects); then decide as S3 would.
                size = length
                served = resolve_range(size, first, last)
                if served is not None and served != (0, size - 1):
                    raise errors.InternalError("The storage backend ignored a Range request.")
                start, end = 0, size
            if end - start != length:
                raise errors.InternalError("The storage backend's Content-Length does not match its range.")
            info = info_of(key, response, size)
        except BaseException as e:
            response["Body"].close()
            call.finish(e)
            raise
        reopen = functools.partial(self._open_body, bucket, key, if_match=info.etag, call=call)
        return S3Reader(
            response,
            info,
            start,
            end,
            served,
            call,
            reopen=reopen,
            backoff=self.backoff,
            read_size=self.read_size,
        )

    async def get_bytes(
        self,
        bucket: str,
        key: str,
        first: int | None = None,
        last: int | None = None,
        *,
        if_match: str | None = None,
    ) -> tuple[ObjectInfo, bytes]:
        async with await self.get(bucket, key, first, last, if_match=if_match) as reader:
            return reader.info, await reader.read()

    async def _put_object(
        self,
        bucket: str,
        key: str,
        data: bytes | bytearray,
        metadata: Mapping[str, str] | None,
        content_type: str | None,
        content_md5: bytes | None = None,
    ) -> ObjectInfo:
        params: dict[str, Any] = {
            "Bucket": bucket,
            "Key": key,
            "Body": data,
            "Metadata": dict(metadata or {}),
        }
        if content_type:
            params["ContentType"] = content_type
        md5 = await self._md5(data, content_md5)
        if md5:
            params["ContentMD5"] = md5
        response = await self._request(
            "PutObject", "put_object", fields={"Key": key}, bytes_out=len(data), **params
        )
        # PutObject does not say when; the time of the answer is within a second of the store's own.
        return ObjectInfo(
            key=key,
            size=len(data),
            etag=unquote_etag(response.get("ETag", "")),
            last_modified=datetime.now(UTC).replace(microsecond=0),
            metadata=normalize_metadata(metadata),
            content_type=content_type,
        )

    async def put(
        self,
        bucket: str,
        key: str,
        body: Body,
        *,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
        content_md5: BodyMD5 | None = None,
    ) -> ObjectInfo:
        """Store a body: one PutObject up to `part_size`, a multipart upload beyond.

        content_md5 (the whole body's) saves hashing a body sent in one PutObject; the parts of a larger
        one are hashed here, each while the next is gathered.
        """
        check_key(key)
        whole = content_md5 if isinstance(content_md5, bytes) else None
        if isinstance(body, bytes | bytearray | memoryview):
            data = body if isinstance(body, bytes | bytearray) else bytes(body)
            if len(data) <= self.part_size:
                return await self._put_object(bucket, key, data, metadata, content_type, whole)
            return await self._put_parts(bucket, key, slices(data, self.part_size), metadata, content_type)
        stream = Regrouper(body, self.part_size)
        first = await stream.next_part()
        if first is None or await stream.at_end():
            # The stream has ended: a writer that hashed it as it went has its MD5 now.
            if callable(content_md5):
                whole = content_md5()
            return await self._put_object(bucket, key, first or b"", metadata, content_type, whole)
        # The next part is gathered while one is uploaded: the stream's producer (a transform) keeps
        # working instead of waiting for each upload.
        return await self._put_parts(bucket, key, read_ahead(stream.parts(first)), metadata, content_type)

    async def delete(self, bucket: str, key: str) -> None:
        try:
            await self._request("DeleteObject", "delete_object", fields={"Key": key}, Bucket=bucket, Key=key)
        except errors.NoSuchKey:
            return  # some stores say so; S3 itself answers 204 either way

    async def delete_many(self, bucket: str, keys: Sequence[str]) -> list[tuple[str, str, str]]:
        failed: list[tuple[str, str, str]] = []
        # A key XML 1.0 cannot carry (control characters, U+FFFE/U+FFFF) or would alter (CR, which XML
        # parsers turn into LF) cannot be named in a DeleteObjects body; those go one by one.
        batchable = [k for k in keys if not _XML_UNSAFE.search(k)]
        for key in (k for k in keys if _XML_UNSAFE.search(k)):
            try:
                await self.delete(bucket, key)
            except errors.NoSuchBucket:
                raise
            except errors.S3Error as e:
                failed.append((key, e.code, e.message))
        for i in range(0, len(batchable), DELETE_BATCH):
            batch = batchable[i : i + DELETE_BATCH]
            response = await self._request(
                "DeleteObjects",
                "delete_objects",
                fields={"BucketName": bucket},
                Bucket=bucket,
                Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
            )
            for error in response.get("Errors", []):
                if error.get("Code") != "NoSuchKey":
                    failed.append(
                        (error.get("Key", ""), error.get("Code", "InternalError"), error.get("Message", ""))
                    )
        return failed

    async def list(
        self,
        bucket: str,
        *,
        prefix: str = "",
        delimiter: str | None = None,
        start_after: str | None = None,
        token: str | None = None,
        max_keys: int = 1000,
    ) -> ListPage:
        params: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": max_keys}
        if delimiter:
            params["Delimiter"] = delimiter
        if start_after:
            params["StartAfter"] = start_after
        if token:
            params["ContinuationToken"] = token
        response = await self._request(
            "ListObjectsV2",
            "list_objects_v2",
            fields={"BucketName": bucket},
            not_found=errors.NoSuchBucket,
            **params,
        )
        objects = [
            ObjectInfo(
                key=o["Key"],
                size=int(o.get("Size", 0)),
                etag=unquote_etag(o.get("ETag", "")),
                last_modified=utc(o.get("LastModified")),
            )
            for o in response.get("Contents", [])
        ]
        prefixes = [p["Prefix"] for p in response.get("CommonPrefixes", [])]
        truncated = bool(response.get("IsTruncated"))
        next_token = response.get("NextContinuationToken") if truncated else None
        if truncated and (not next_token or next_token == token):
            # Following such a token would list the same page forever.
            raise errors.InternalError("The storage backend's listing did not advance.")
        return ListPage(objects, prefixes, truncated, next_token)

    async def copy(
        self,
        src_bucket: str,
        src_key: str,
        dst_bucket: str,
        dst_key: str,
        *,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo:
        """Server-side copy; objects over `copy_threshold` (5 GiB, CopyObject's limit) part by part."""
        check_key(dst_key)
        source = await self.head(src_bucket, src_key)
        replace = metadata is not None or content_type is not None
        meta = normalize_metadata(metadata) if replace else dict(source.metadata)
        ctype = content_type if replace else source.content_type
        if source.size > self.copy_threshold:
            return await self._copy_parts(src_bucket, source, dst_bucket, dst_key, meta, ctype)
        params: dict[str, Any] = {
            "Bucket": dst_bucket,
            "Key": dst_key,
            "CopySource": {"Bucket": src_bucket, "Key": src_key},
            "CopySourceIfMatch": quote_etag(source.etag),
            "MetadataDirective": "REPLACE" if replace else "COPY",
        }
        if replace:
            params["Metadata"] = meta
            if ctype:
                params["ContentType"] = ctype
        response = await self._request("CopyObject", "copy_object", fields={"Key": dst_key}, **params)
        result = response.get("CopyObjectResult", {})
        return ObjectInfo(
            key=dst_key,
            size=source.size,
            etag=unquote_etag(result.get("ETag", "")),
            last_modified=utc(result.get("LastModified")),
            metadata=meta,
            content_type=ctype,
        )


def _open(url: str, **options: Any) -> S3Backend:
    """`http(s)://host[:port]`: the endpoint of an S3-compatible store."""
    parts = urlsplit(url)
    if not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ValueError(f"{url!r} is not an endpoint (expected http(s)://host[:port])")
    return S3Backend(f"{parts.scheme.lower()}://{parts.netloc}", **options)


def _check_endpoint(url: str) -> str | None:
    """An S3 endpoint is scheme://host[:port]; a path there usually is a bucket put in the wrong place."""
    rest = url.split("://", 1)[1]
    host, _, path = rest.partition("/")
    if not host:
        return f"{url!r} names no host"
    path = path.strip("/")
    if path:
        first = path.split("/", 1)[0]
        return (
            f"{url!r} has a path ('/{path}'); the backend URL is scheme://host:port only. To keep every "
            f"client bucket in one backend bucket, set backend_bucket = {first!r} "
            f"(--backend-bucket {first})"
        )
    if "?" in rest or "#" in rest:
        return f"{url!r} has a query or fragment; the backend URL is scheme://host:port only"
    return None


KIND = register(
    BackendKind(
        "s3",
        ("http://", "https://"),
        "http(s)://host:port",
        _open,
        options=(
            "region",
            "path_style",
            "part_size",
            "access_key",
            "secret_key",
            "max_attempts",
            "connect_timeout",
            "read_timeout",
        ),
        check=_check_endpoint,
    )
)
