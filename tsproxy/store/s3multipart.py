"""Multipart uploads of the S3 backend: the client-facing capability (`MultipartCapable`) and the two
uses the object path makes of it, a streamed PUT beyond one part and a copy beyond CopyObject's limit.

An upload the backend starts for itself is aborted on any failure, so nothing half-written ever
becomes visible.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from tsproxy import errors
from tsproxy.store import s3errors
from tsproxy.store.base import (
    MAX_PART_SIZE,
    MAX_PARTS,
    Body,
    BodyMD5,
    ObjectInfo,
    UploadInfo,
    Uploads,
    aclose,
    check_key,
    check_part_list,
    check_part_number,
    check_range_args,
    multipart_etag,
    resolve_range,
    unquote_etag,
)
from tsproxy.store.s3client import S3Client, quote_etag, utc

# An ETag that can be a body's MD5 (S3 and most stores give one for a part sent unencrypted or with SSE-S3).
_MD5_ETAG = re.compile(r"[0-9a-f]{32}")


class S3Multipart(S3Client):
    """Multipart uploads through the client."""

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
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_no: int,
        body: Body,
        size: int | None = None,
        *,
        content_md5: BodyMD5 | None = None,
    ) -> str:
        """Upload one part. A streamed body is gathered first (one part in memory) so it can be retried,
        unless its size is known and its MD5 comes when it ends: then it is sent as it is produced (see
        _upload_part_as_produced).

        content_md5: the body's MD5 when the caller has it (else it is hashed here): the store checks it.
        """
        check_part_number(part_no)
        if (
            not isinstance(body, bytes | bytearray | memoryview)
            and size is not None
            and callable(content_md5)
        ):
            if self.lean is not None and self.etags_are_md5 and size <= MAX_PART_SIZE:
                return await self._upload_part_as_produced(
                    bucket, key, upload_id, part_no, body, size, content_md5
                )
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
        md5 = await self._md5(data, content_md5() if callable(content_md5) else content_md5)
        if self.lean is not None:
            # As a streamed part and a GET go: without botocore's own handling of the request and its
            # body, on the event loop (a little less CPU a part: CHANGELOG), checked by the store against
            # its Content-MD5 all the same.
            lean = functools.partial(
                self.lean.upload_part, bucket, key, upload_id, part_no, len(data), data, md5
            )
            with self._call("UploadPart") as call:
                etag = await self._attempts(call, lean, not_found=errors.NoSuchUpload, UploadId=upload_id)
                call.bytes_out += len(data)
            return unquote_etag(etag)
        params: dict[str, Any] = {
            "Bucket": bucket,
            "Key": key,
            "UploadId": upload_id,
            "PartNumber": part_no,
            "Body": data,
        }
        if md5:
            params["ContentMD5"] = md5
        response = await self._request(
            "UploadPart", "upload_part", fields={"UploadId": upload_id}, not_found=errors.NoSuchUpload,
            bytes_out=len(data), **params,
        )  # fmt: skip
        return unquote_etag(response["ETag"])

    async def _upload_part_as_produced(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_no: int,
        body: AsyncIterable[bytes],
        size: int,
        content_md5: Callable[[], bytes],
    ) -> str:
        """UploadPart sent while its body is still being produced (an uncompressed part goes out as it is
        received and sealed, instead of after its last byte), then checked: without a Content-MD5 (the
        digest is known only at the end), the ETag the store answers must be the MD5 of what was sent.

        The pieces sent are kept (the memory a gathered part takes anyway): on any failure of the
        request, or an ETag that is not that MD5, the part is sent again from them with its Content-MD5,
        as a gathered part is. A store whose part ETags are not MD5s (SSE-KMS) gets gathered parts from
        then on. The body's own failure (a client gone, a failed check) ends the upload with that error,
        the request cut off before it is whole, so the store keeps nothing of it.
        """
        assert self.lean is not None
        kept: list[bytes] = []
        source_error: list[BaseException] = []
        source = aiter(body)
        # The piece being taken from the body, in a task of its own: a request whose connection is lost
        # is cancelled, and that cancellation must not reach the body (it would end the producer, whose
        # end gives the digest and the rest of the part).
        taking: asyncio.Future[bytes | None] | None = None

        async def teed() -> AsyncIterator[bytes]:
            nonlocal taking
            while True:
                taking = asyncio.ensure_future(anext(source, None))
                try:
                    piece = await asyncio.shield(taking)
                except Exception as e:  # the body's own failure, not the request's
                    taking = None
                    source_error.append(e)
                    raise
                taking = None
                if piece is None:
                    return
                kept.append(piece)
                yield piece

        etag: str | None = None
        try:
            with self._call("UploadPart") as call:
                await call.admit()
                try:
                    etag = unquote_etag(
                        await self.lean.upload_part(bucket, key, upload_id, part_no, size, teed())
                    )
                    call.bytes_out += size
                except Exception as e:
                    if source_error:
                        raise source_error[0] from None
                    if not s3errors.is_retryable(e):
                        raise s3errors.to_s3_error(
                            e, not_found=errors.NoSuchUpload, UploadId=upload_id
                        ) from e
                    call.retries += 1  # sent again below, gathered, with the retry loop's own attempts
            if source_error:
                raise source_error[0]
            # The rest of the body, when the store failed before it was all sent: the piece being taken
            # when the request ended first.
            if taking is not None:
                pending, taking = taking, None
                piece = await pending
                if piece is not None:
                    kept.append(piece)
            async for piece in source:
                kept.append(piece)
        finally:
            if taking is not None:  # this task cancelled while a piece was being taken
                taking.cancel()
                with contextlib.suppress(BaseException):
                    await taking
        digest = content_md5()
        if etag is not None and etag == digest.hex():
            return etag
        if etag is not None and not _MD5_ETAG.fullmatch(etag):
            self.etags_are_md5 = False  # can't check a part sent unhashed: gather them from now on
        data = b"".join(kept)
        return await self.upload_part(bucket, key, upload_id, part_no, data, size, content_md5=digest)

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
            "CopySourceIfMatch": quote_etag(src_etag),
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
        self,
        bucket: str,
        key: str,
        upload_id: str,
        parts: Sequence[tuple[int, str]],
        *,
        size: int | None = None,
    ) -> ObjectInfo:
        check_part_list(parts)
        try:
            expected: str | None = multipart_etag([etag for _, etag in parts])
        except errors.InvalidPart:
            # Some stores give copied parts ETags that are not an MD5 (SeaweedFS: "<md5>-N"); S3 itself
            # does not check them here, so neither do we. Only the lost-answer recovery below needs it.
            expected = None
        listing = [{"PartNumber": n, "ETag": quote_etag(etag)} for n, etag in parts]
        etag: str | None = None
        with self._call("CompleteMultipartUpload") as call:
            attempt = 0
            while True:
                attempt += 1
                await call.admit()
                try:
                    response = await self.client.complete_multipart_upload(
                        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": listing}
                    )
                    etag = response.get("ETag")
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
                    throttled = s3errors.is_throttling(e)
                call.retries += 1
                await asyncio.sleep(self.backoff.delay(attempt, throttled=throttled))
        if size is not None and etag:
            # The caller knows the size: the ETag is in the answer, and the date is about now.
            return ObjectInfo(key, size, unquote_etag(etag), datetime.now(UTC))
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
                uploads.append(UploadInfo(u["Key"], u["UploadId"], utc(u.get("Initiated"))))
            if not response.get("IsTruncated"):
                break
            params["KeyMarker"] = response.get("NextKeyMarker", "")
            params["UploadIdMarker"] = response.get("NextUploadIdMarker", "")
            if not params["KeyMarker"] and not params["UploadIdMarker"]:
                break
        return sorted(uploads, key=lambda u: (u.key, u.initiated, u.upload_id))

    async def list_parts(self, bucket: str, key: str, upload_id: str) -> list[tuple[int, str]]:
        parts: list[tuple[int, str]] = []
        params: dict[str, Any] = {"Bucket": bucket, "Key": key, "UploadId": upload_id}
        while True:
            response = await self._request(
                "ListParts", "list_parts", fields={"UploadId": upload_id}, not_found=errors.NoSuchUpload,
                **params,
            )  # fmt: skip
            parts += [(int(p["PartNumber"]), unquote_etag(p["ETag"])) for p in response.get("Parts", [])]
            marker = response.get("NextPartNumberMarker")
            if not response.get("IsTruncated") or not marker:
                return parts
            params["PartNumberMarker"] = marker

    # -- uploads the object path starts for itself

    async def _put_parts(
        self,
        bucket: str,
        key: str,
        parts: AsyncIterator[bytearray | bytes],
        metadata: Mapping[str, str] | None,
        content_type: str | None,
    ) -> ObjectInfo:
        """A streamed PUT of more than one part, as one multipart upload."""
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

    async def _copy_parts(
        self,
        src_bucket: str,
        source: ObjectInfo,
        dst_bucket: str,
        dst_key: str,
        metadata: Mapping[str, str],
        content_type: str | None,
    ) -> ObjectInfo:
        """A server-side copy too large for CopyObject, as UploadPartCopy parts."""
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

    async def _abort_quietly(self, bucket: str, key: str, upload_id: str) -> None:
        """Abort an upload even if the caller is being cancelled; its own failure is not news."""
        task = asyncio.ensure_future(self.abort_multipart(bucket, key, upload_id))
        with contextlib.suppress(BaseException):
            await asyncio.shield(task)
