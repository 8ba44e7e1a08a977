"""A backend in any S3-compatible object store, through aiobotocore.

Choices that make it work with common S3-compatible stores (AWS S3, MinIO, Ceph RGW, SeaweedFS …):

- **No flexible checksums.** botocore ≥ 1.36 adds CRC checksums, sent as aws-chunked trailers, to
  every PutObject/UploadPart by default (`request_checksum_calculation="when_supported"`); several
  stores reject or mishandle those. We use `"when_required"` (checksums only on operations that
  demand one, such as DeleteObjects) and likewise do not ask for response checksums.
- **Integrity by Content-MD5, not by payload signing.** Bodies are sent as `UNSIGNED-PAYLOAD` with a
  Content-MD5 header computed in a worker thread, which every S3-compatible store checks (BadDigest).
  Signing the payload would make botocore hash every body on the event loop over plain http.
  `sign_payload=True` restores botocore's default; `content_md5=False` drops the header.
- **Our own retry loop.** botocore's retries are off; each operation is retried here with exponential
  backoff and full jitter on connection errors, throttling and 5xx answers, and the retries are
  counted and reported to `on_request`. A GET body cut short is resumed where it stopped with a
  ranged GET pinned to the same ETag (If-Match), so a reader never gets bytes of two versions.
- **Bounded memory.** A streamed PUT holds at most one part (`part_size`, 25 MiB by default): up to
  one part it is a single PutObject, beyond that a multipart upload that is aborted on any failure,
  so nothing half-written ever becomes visible. GET bodies are read in pieces, never whole.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from datetime import UTC, datetime
from typing import Any, TypeVar

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from tsproxy import errors
from tsproxy.store import s3errors
from tsproxy.store.base import (
    DEFAULT_PART_SIZE,
    MAX_PART_SIZE,
    MAX_PARTS,
    MIB,
    MIN_PART_SIZE,
    Body,
    ListPage,
    ObjectInfo,
    RequestObserver,
    UploadInfo,
    Uploads,
    check_key,
    check_part_list,
    check_part_number,
    check_range_args,
    multipart_etag,
    normalize_metadata,
    range_header,
    resolve_range,
    unquote_etag,
)
from tsproxy.store.observe import Call
from tsproxy.store.retry import Backoff
from tsproxy.store.s3body import Regrouper, S3Reader, aclose, content_range, slices

T = TypeVar("T")

DELETE_BATCH = 1000  # S3's limit of keys per DeleteObjects request
COPY_THRESHOLD = 5 << 30  # CopyObject's limit; larger objects are copied part by part
COPY_PART_SIZE = 512 * MIB
_XML_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\r\ufffe\uffff\ud800-\udfff]")


def _utc(value: datetime | None) -> datetime:
    if value is None:
        return datetime.now(UTC)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _quote(etag: str) -> str:
    return f'"{unquote_etag(etag)}"'


class S3Backend:
    """Objects in an S3-compatible store. Create, `await start()`, use, `await close()`."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        region: str | None = None,
        path_style: bool = True,
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        part_size: int = DEFAULT_PART_SIZE,
        max_attempts: int = 5,
        backoff_base: float = 0.1,
        backoff_cap: float = 5.0,
        pool_size: int = 64,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        verify: bool | str | None = None,
        sign_payload: bool = False,
        content_md5: bool = True,
        copy_threshold: int = COPY_THRESHOLD,
        copy_part_size: int = COPY_PART_SIZE,
        read_size: int = MIB,
        executor: Executor | None = None,
        on_request: RequestObserver | None = None,
    ) -> None:
        """`endpoint` None means AWS S3 itself; credentials None means the standard AWS chain."""
        if not MIN_PART_SIZE <= part_size <= MAX_PART_SIZE:
            raise ValueError(f"part_size must be between {MIN_PART_SIZE} and {MAX_PART_SIZE} bytes")
        if not MIN_PART_SIZE <= copy_part_size <= MAX_PART_SIZE:
            raise ValueError(f"copy_part_size must be between {MIN_PART_SIZE} and {MAX_PART_SIZE} bytes")
        if (access_key is None) != (secret_key is None):
            raise ValueError("give both access_key and secret_key, or neither")
        self.endpoint = endpoint
        self.region = region or "us-east-1"
        self.path_style = path_style
        self.part_size = part_size
        self.min_part_size = MIN_PART_SIZE
        self.backoff = Backoff(max_attempts=max_attempts, base=backoff_base, cap=backoff_cap)
        self.copy_threshold = copy_threshold
        self.copy_part_size = copy_part_size
        self.read_size = read_size
        self.content_md5 = content_md5
        self.executor = executor
        self.on_request = on_request
        self._credentials = (access_key, secret_key, session_token)
        self._config = AioConfig(
            region_name=self.region,
            signature_version="s3v4",
            s3={
                "addressing_style": "path" if path_style else "virtual",
                "payload_signing_enabled": sign_payload,
            },
            retries={"total_max_attempts": 1, "mode": "standard"},  # retried here, and counted
            max_pool_connections=pool_size,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            warm_up_loader_caches=True,
        )
        self._verify = verify
        self._stack: contextlib.AsyncExitStack | None = None
        self._client: Any = None

    def __repr__(self) -> str:
        return f"S3Backend({self.endpoint or 'aws'!r})"

    # -- lifecycle

    async def start(self) -> None:
        """Create the aiobotocore client (and its connection pool)."""
        if self._client is not None:
            return
        access_key, secret_key, token = self._credentials
        stack = contextlib.AsyncExitStack()
        self._client = await stack.enter_async_context(
            get_session().create_client(
                "s3",
                endpoint_url=self.endpoint,
                region_name=self.region,
                aws_access_key_id=access_key,
                aws_secret_access_key=secret_key,
                aws_session_token=token,
                verify=self._verify,
                config=self._config,
            )
        )
        self._stack = stack

    async def close(self) -> None:
        if self._stack is not None:
            stack, self._stack, self._client = self._stack, None, None
            await stack.aclose()

    @property
    def client(self) -> Any:
        """The aiobotocore S3 client (after `start`)."""
        if self._client is None:
            raise RuntimeError("S3Backend used before start()")
        return self._client

    # -- the retry loop

    async def _attempts(
        self,
        call: Call,
        operation: Callable[[], Awaitable[T]],
        *,
        not_found: type[errors.S3Error] = errors.NoSuchKey,
        **fields: str,
    ) -> T:
        """Run `operation` until it succeeds, fails for good, or runs out of attempts."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return await operation()
            except Exception as e:
                if not (s3errors.is_retryable(e) and self.backoff.allows_another(attempt)):
                    raise s3errors.to_s3_error(e, not_found=not_found, **fields) from e
            call.retries += 1
            await asyncio.sleep(self.backoff.delay(attempt))

    async def _request(
        self,
        name: str,
        method: str,
        *,
        not_found: type[errors.S3Error] = errors.NoSuchKey,
        fields: Mapping[str, str] | None = None,
        bytes_out: int = 0,
        **params: Any,
    ) -> dict[str, Any]:
        """One observed, retried client call: `name` is the S3 operation, `method` the client's."""
        with Call(self.on_request, name) as call:
            bound = functools.partial(getattr(self.client, method), **params)
            response: dict[str, Any] = await self._attempts(
                call, bound, not_found=not_found, **(fields or {})
            )
            call.bytes_out += bytes_out
            return response

    async def _md5(self, data: bytes | bytearray) -> str | None:
        if not self.content_md5:
            return None
        loop = asyncio.get_running_loop()
        digest = await loop.run_in_executor(self.executor, lambda: hashlib.md5(data).digest())
        return base64.b64encode(digest).decode("ascii")

    # -- buckets

    async def ping(self) -> None:
        """One ListBuckets, no retries: an answer of any kind but a 5xx means the store is up."""
        with Call(self.on_request, "ListBuckets") as call:
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
        return [(b["Name"], _utc(b.get("CreationDate"))) for b in response.get("Buckets", [])]

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

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        response = await self._request(
            "HeadObject", "head_object", fields={"Key": key}, Bucket=bucket, Key=key
        )
        return self._info(key, response, response.get("ContentLength", 0))

    @staticmethod
    def _info(key: str, response: Mapping[str, Any], size: int) -> ObjectInfo:
        return ObjectInfo(
            key=key,
            size=size,
            etag=unquote_etag(response.get("ETag", "")),
            last_modified=_utc(response.get("LastModified")),
            metadata=normalize_metadata(response.get("Metadata")),
            content_type=response.get("ContentType"),
        )

    async def _get_object(
        self, bucket: str, key: str, range_value: str | None, if_match: str | None, call: Call
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if range_value:
            params["Range"] = range_value
        if if_match is not None:
            params["IfMatch"] = _quote(if_match)
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
        call = Call(self.on_request, "GetObject")
        try:
            response = await self._get_object(bucket, key, range_header(first, last), if_match, call)
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
            info = self._info(key, response, size)
        except BaseException as e:
            response["Body"].close()
            call.finish(e)
            raise
        return S3Reader(self, bucket, key, response, info, start, end, served, call)

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
    ) -> ObjectInfo:
        params: dict[str, Any] = {
            "Bucket": bucket,
            "Key": key,
            "Body": data,
            "Metadata": dict(metadata or {}),
        }
        if content_type:
            params["ContentType"] = content_type
        md5 = await self._md5(data)
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
    ) -> ObjectInfo:
        """Store a body: one PutObject up to `part_size`, a multipart upload beyond."""
        check_key(key)
        if isinstance(body, bytes | bytearray | memoryview):
            data = body if isinstance(body, bytes | bytearray) else bytes(body)
            if len(data) <= self.part_size:
                return await self._put_object(bucket, key, data, metadata, content_type)
            return await self._put_parts(bucket, key, slices(data, self.part_size), metadata, content_type)
        stream = Regrouper(body, self.part_size)
        first = await stream.next_part()
        if first is None or await stream.at_end():
            return await self._put_object(bucket, key, first or b"", metadata, content_type)
        return await self._put_parts(bucket, key, stream.parts(first), metadata, content_type)

    async def _put_parts(
        self,
        bucket: str,
        key: str,
        parts: AsyncIterator[bytearray | bytes],
        metadata: Mapping[str, str] | None,
        content_type: str | None,
    ) -> ObjectInfo:
        upload_id = await self.create_multipart(bucket, key, metadata=metadata, content_type=content_type)
        try:
            done: list[tuple[int, str]] = []
            async for part in parts:
                if len(done) == MAX_PARTS:
                    raise errors.EntityTooLarge(f"More than {MAX_PARTS} parts of {self.part_size} bytes.")
                etag = await self.upload_part(bucket, key, upload_id, len(done) + 1, part)
                done.append((len(done) + 1, etag))
            return await self.complete_multipart(bucket, key, upload_id, done)
        except BaseException:
            await self._abort_quietly(bucket, key, upload_id)
            raise
        finally:
            await aclose(parts)

    async def _abort_quietly(self, bucket: str, key: str, upload_id: str) -> None:
        """Abort an upload even if the caller is being cancelled; its own failure is not news."""
        task = asyncio.ensure_future(self.abort_multipart(bucket, key, upload_id))
        with contextlib.suppress(BaseException):
            await asyncio.shield(task)

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
                last_modified=_utc(o.get("LastModified")),
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
            "CopySourceIfMatch": _quote(source.etag),
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
            last_modified=_utc(result.get("LastModified")),
            metadata=meta,
            content_type=ctype,
        )

    async def _copy_parts(
        self,
        src_bucket: str,
        source: ObjectInfo,
        dst_bucket: str,
        dst_key: str,
        metadata: Mapping[str, str],
        content_type: str | None,
    ) -> ObjectInfo:
        # Parts large enough that the copy fits in S3's 10,000 parts.
        part = max(self.copy_part_size, -(-source.size // MAX_PARTS))
        upload_id = await self.create_multipart(
            dst_bucket, dst_key, metadata=metadata, content_type=content_type
        )
        try:
            parts: list[tuple[int, str]] = []
            for number, start in enumerate(range(0, source.size, part), 1):
                last = min(start + part, source.size) - 1
                etag = await self._upload_part_copy(
                    dst_bucket, dst_key, upload_id, number, src_bucket, source.key, start, last, source.etag
                )
                parts.append((number, etag))
            return await self.complete_multipart(dst_bucket, dst_key, upload_id, parts)
        except BaseException:
            await self._abort_quietly(dst_bucket, dst_key, upload_id)
            raise

    # -- multipart

    async def create_multipart(
        self,
        bucket: str,
        key: str,
        *,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> str:
        check_key(key)
        params: dict[str, Any] = {"Bucket": bucket, "Key": key, "Metadata": dict(metadata or {})}
        if content_type:
            params["ContentType"] = content_type
        response = await self._request(
            "CreateMultipartUpload", "create_multipart_upload", fields={"Key": key}, **params
        )
        return str(response["UploadId"])

    async def upload_part(
        self, bucket: str, key: str, upload_id: str, part_no: int, body: Body, size: int | None = None
    ) -> str:
        """Upload one part. A streamed body is gathered first (one part in memory) so it can be retried."""
        check_part_number(part_no)
        if isinstance(body, bytes | bytearray):
            data: bytes | bytearray = body
        elif isinstance(body, memoryview):
            data = bytes(body)
        else:
            data = bytearray()
            async for piece in body:
                data += piece
                if len(data) > MAX_PART_SIZE:
                    raise errors.EntityTooLarge()
        if size is not None and len(data) != size:
            raise errors.IncompleteBody()
        params: dict[str, Any] = {
            "Bucket": bucket,
            "Key": key,
            "UploadId": upload_id,
            "PartNumber": part_no,
            "Body": data,
        }
        md5 = await self._md5(data)
        if md5:
            params["ContentMD5"] = md5
        response = await self._request(
            "UploadPart", "upload_part", fields={"UploadId": upload_id}, not_found=errors.NoSuchUpload,
            bytes_out=len(data), **params,
        )  # fmt: skip
        return unquote_etag(response["ETag"])

    async def upload_part_copy(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_no: int,
        src_bucket: str,
        src_key: str,
        first: int | None = None,
        last: int | None = None,
        *,
        src_etag: str | None = None,
    ) -> str:
        check_part_number(part_no)
        check_range_args(first, last)
        source = await self.head(src_bucket, src_key)
        if src_etag is not None and unquote_etag(src_etag) != source.etag:
            raise errors.PreconditionFailed(Condition="x-amz-copy-source-if-match")
        served = resolve_range(source.size, first, last)
        start, stop = served if served is not None else (None, None)
        return await self._upload_part_copy(
            bucket, key, upload_id, part_no, src_bucket, src_key, start, stop, source.etag
        )

    async def _upload_part_copy(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_no: int,
        src_bucket: str,
        src_key: str,
        first: int | None,
        last: int | None,
        src_etag: str,
    ) -> str:
        params: dict[str, Any] = {
            "Bucket": bucket,
            "Key": key,
            "UploadId": upload_id,
            "PartNumber": part_no,
            "CopySource": {"Bucket": src_bucket, "Key": src_key},
            "CopySourceIfMatch": _quote(src_etag),
        }
        if first is not None and last is not None:
            params["CopySourceRange"] = f"bytes={first}-{last}"
        response = await self._request(
            "UploadPartCopy",
            "upload_part_copy",
            fields={"UploadId": upload_id},
            not_found=errors.NoSuchUpload,
            **params,
        )
        return unquote_etag(response["CopyPartResult"]["ETag"])

    async def complete_multipart(
        self, bucket: str, key: str, upload_id: str, parts: Sequence[tuple[int, str]]
    ) -> ObjectInfo:
        check_part_list(parts)
        try:
            expected: str | None = multipart_etag([etag for _, etag in parts])
        except errors.InvalidPart:
            # Some stores give copied parts ETags that are not an MD5 (SeaweedFS: "<md5>-N"); S3 itself
            # does not check them here, so neither do we. Only the lost-answer recovery below needs it.
            expected = None
        listing = [{"PartNumber": n, "ETag": _quote(etag)} for n, etag in parts]
        with Call(self.on_request, "CompleteMultipartUpload") as call:
            attempt = 0
            while True:
                attempt += 1
                try:
                    await self.client.complete_multipart_upload(
                        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": listing}
                    )
                    break
                except Exception as e:
                    # A retry after an answer that got lost finds the upload gone: if the object is
                    # there with the ETag these parts make, that lost answer was a success.
                    if attempt > 1 and s3errors.error_code(e) == "NoSuchUpload":
                        with contextlib.suppress(errors.S3Error):
                            if expected is not None and (await self.head(bucket, key)).etag == expected:
                                break
                    if not (s3errors.is_retryable(e) and self.backoff.allows_another(attempt)):
                        raise s3errors.to_s3_error(
                            e, not_found=errors.NoSuchUpload, UploadId=upload_id
                        ) from e
                call.retries += 1
                await asyncio.sleep(self.backoff.delay(attempt))
        # The answer has neither size nor date; one HEAD has both.
        return await self.head(bucket, key)

    async def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None:
        await self._request(
            "AbortMultipartUpload", "abort_multipart_upload", fields={"UploadId": upload_id},
            not_found=errors.NoSuchUpload, Bucket=bucket, Key=key, UploadId=upload_id,
        )  # fmt: skip

    async def list_multipart_uploads(self, bucket: str, prefix: str = "") -> Uploads:
        uploads: list[UploadInfo] = []
        params: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        while True:
            response = await self._request(
                "ListMultipartUploads", "list_multipart_uploads", fields={"BucketName": bucket},
                not_found=errors.NoSuchBucket, **params,
            )  # fmt: skip
            for u in response.get("Uploads", []):
                uploads.append(UploadInfo(u["Key"], u["UploadId"], _utc(u.get("Initiated"))))
            if not response.get("IsTruncated"):
                break
            params["KeyMarker"] = response.get("NextKeyMarker", "")
            params["UploadIdMarker"] = response.get("NextUploadIdMarker", "")
            if not params["KeyMarker"] and not params["UploadIdMarker"]:
                break
        return sorted(uploads, key=lambda u: (u.key, u.initiated, u.upload_id))
