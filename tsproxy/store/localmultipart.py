"""Multipart uploads of the local backend (`MultipartCapable`).

An upload is a directory `<bucket>/.uploads/<id>/` holding `upload.json` (key, start time, content
type, metadata) and one object file per part, `part-00001` …. Completion claims the directory by
renaming it, so concurrent part uploads and aborts find the upload gone, and writes the object as one
file from the parts; a failed completion renames the directory back, as S3 keeps the upload then.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tsproxy import errors
from tsproxy.store.base import (
    Body,
    BodyMD5,
    ObjectInfo,
    UploadInfo,
    Uploads,
    check_key,
    check_part_list,
    check_part_number,
    multipart_etag,
    normalize_metadata,
    resolve_range,
    unquote_etag,
)
from tsproxy.store.localfile import Spool, copy_range, info_of, read_trailer
from tsproxy.store.localtree import LocalTree

UPLOADS = ".uploads"
UPLOAD_FILE = "upload.json"
_UPLOAD_ID = re.compile(r"[0-9a-f]{32}")
_PART_NAME = re.compile(r"part-[0-9]{5}")


class LocalMultipart(LocalTree):
    """Multipart uploads in the tree's `.uploads` directories."""

    def _upload_dir(self, bucket: str, key: str, upload_id: str) -> Path:
        check_key(key)
        bucket_dir = self._bucket_dir(bucket)
        if not _UPLOAD_ID.fullmatch(upload_id):
            raise errors.NoSuchUpload(UploadId=upload_id)
        return bucket_dir / UPLOADS / upload_id

    async def create_multipart(
        self,
        bucket: str,
        key: str,
        *,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> str:
        check_key(key)
        bucket_dir = self._bucket_dir(bucket)
        upload_id = secrets.token_hex(16)
        record = {
            "key": key,
            "initiated": time.time(),
            "content_type": content_type,
            "metadata": normalize_metadata(metadata),
        }

        def create() -> None:
            uploads = bucket_dir / UPLOADS
            with self._tree_lock:
                self._require_bucket(bucket_dir)
                uploads.mkdir(exist_ok=True)
                (uploads / upload_id).mkdir()
            spool = Spool(uploads / upload_id, self.fsync)
            try:
                spool.write([json.dumps(record).encode()])
                os.close(spool.fd)
                spool.fd = -1
                os.replace(spool.temp, uploads / upload_id / UPLOAD_FILE)
            finally:
                spool.discard()

        async with self._call("CreateMultipartUpload"):
            await self._run(create)
        return upload_id

    def _upload_record(self, upload_dir: Path, key: str, upload_id: str) -> dict[str, Any]:
        try:
            record: dict[str, Any] = json.loads((upload_dir / UPLOAD_FILE).read_bytes())
        except (FileNotFoundError, NotADirectoryError):
            self._require_bucket(upload_dir.parent.parent)
            raise errors.NoSuchUpload(UploadId=upload_id) from None
        if record.get("key") != key:
            raise errors.NoSuchUpload(UploadId=upload_id)
        return record

    def _open_part_spool(self, upload_dir: Path, key: str, upload_id: str) -> Spool:
        self._upload_record(upload_dir, key, upload_id)
        try:
            return Spool(upload_dir, self.fsync)
        except (FileNotFoundError, NotADirectoryError):
            raise errors.NoSuchUpload(UploadId=upload_id) from None

    @staticmethod
    def _part_name(part_no: int) -> str:
        return f"part-{part_no:05d}"

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
        check_part_number(part_no)
        upload_dir = self._upload_dir(bucket, key, upload_id)
        async with self._call("UploadPart") as call:
            spool = await self._run(self._open_part_spool, upload_dir, key, upload_id, key=key)
            try:
                await self._fill(spool, body, call, key)
                if size is not None and spool.size != size:
                    raise errors.IncompleteBody()
                trailer = {"key": key, "mtime": time.time(), "etag": spool.check_md5(content_md5)}
                await self._run(self._commit_part, spool, upload_dir, part_no, trailer, upload_id, key=key)
            except BaseException:
                await self._cleanup(spool.discard)
                raise
            return str(trailer["etag"])

    def _commit_part(
        self, spool: Spool, upload_dir: Path, part_no: int, trailer: dict[str, Any], upload_id: str
    ) -> None:
        try:
            spool.commit(upload_dir / self._part_name(part_no), trailer)
        except FileNotFoundError:
            # Aborted (or completed) while this part was being written.
            raise errors.NoSuchUpload(UploadId=upload_id) from None

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
        upload_dir = self._upload_dir(bucket, key, upload_id)

        def copy() -> str:
            fd, trailer, size = self._open_object(src_bucket, src_key)
            try:
                if src_etag is not None and unquote_etag(src_etag) != info_of(trailer).etag:
                    raise errors.PreconditionFailed(Condition="x-amz-copy-source-if-match")
                served = resolve_range(size, first, last)
                start, end = (0, size) if served is None else (served[0], served[1] + 1)
                spool = self._open_part_spool(upload_dir, key, upload_id)
                try:
                    copy_range(fd, start, end - start, spool)
                    trailer = {"key": key, "mtime": time.time(), "etag": spool.md5.hexdigest()}
                    self._commit_part(spool, upload_dir, part_no, trailer, upload_id)
                except BaseException:
                    spool.discard()
                    raise
                return str(trailer["etag"])
            finally:
                os.close(fd)

        async with self._call("UploadPartCopy"):
            return await self._run(copy, key=key)

    async def complete_multipart(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        parts: Sequence[tuple[int, str]],
        *,
        size: int | None = None,  # the written file says it anyway
    ) -> ObjectInfo:
        upload_dir = self._upload_dir(bucket, key, upload_id)
        bucket_dir = self._bucket_dir(bucket)
        final = self._object_path(bucket, key)

        def complete() -> ObjectInfo:
            record = self._upload_record(upload_dir, key, upload_id)
            check_part_list(parts)
            # Claim the upload: from here on, concurrent part uploads and aborts find it gone.
            claimed = upload_dir.with_name(f".completing-{upload_id}-{secrets.token_hex(4)}")
            try:
                os.rename(upload_dir, claimed)
            except FileNotFoundError:
                raise errors.NoSuchUpload(UploadId=upload_id) from None
            fds: list[tuple[int, int]] = []
            try:
                for i, (number, etag) in enumerate(parts):
                    try:
                        fd = os.open(claimed / self._part_name(number), os.O_RDONLY)
                    except FileNotFoundError:
                        raise errors.InvalidPart(PartNumber=str(number)) from None
                    trailer, size = read_trailer(fd)
                    fds.append((fd, size))
                    if trailer["etag"] != unquote_etag(etag):
                        raise errors.InvalidPart(PartNumber=str(number), ETag=etag)
                    if size < self.min_part_size and i < len(parts) - 1:
                        raise errors.EntityTooSmall(
                            PartNumber=str(number),
                            ProposedSize=str(size),
                            MinSizeAllowed=str(self.min_part_size),
                        )
                spool = self._open_spool(bucket_dir, final, self._hashed_dirs(bucket_dir, key))
                try:
                    for fd, size in fds:
                        copy_range(fd, 0, size, spool)
                    trailer = {
                        "key": key,
                        "mtime": time.time(),
                        "content_type": record.get("content_type"),
                        "metadata": record.get("metadata", {}),
                        "etag": multipart_etag([etag for _, etag in parts]),
                    }
                    written = spool.commit(final, trailer)
                except BaseException:
                    spool.discard()
                    raise
            except BaseException:
                # S3 keeps the upload after a failed completion, so the client may fix its part list.
                os.rename(claimed, upload_dir)
                raise
            finally:
                for fd, _ in fds:
                    os.close(fd)
            shutil.rmtree(claimed, ignore_errors=True)
            return info_of(written)

        async with self._call("CompleteMultipartUpload"):
            return await self._run(complete, key=key)

    async def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None:
        upload_dir = self._upload_dir(bucket, key, upload_id)

        def abort() -> None:
            self._upload_record(upload_dir, key, upload_id)
            trash = upload_dir.with_name(f".aborting-{upload_id}-{secrets.token_hex(4)}")
            try:
                os.rename(upload_dir, trash)
            except FileNotFoundError:
                raise errors.NoSuchUpload(UploadId=upload_id) from None
            shutil.rmtree(trash, ignore_errors=True)

        async with self._call("AbortMultipartUpload"):
            await self._run(abort)

    async def list_multipart_uploads(self, bucket: str, prefix: str = "") -> Uploads:
        bucket_dir = self._bucket_dir(bucket)

        def scan() -> list[UploadInfo]:
            self._require_bucket(bucket_dir)
            out = []
            try:
                entries = list(os.scandir(bucket_dir / UPLOADS))
            except FileNotFoundError:
                return []
            for entry in entries:
                if not _UPLOAD_ID.fullmatch(entry.name):
                    continue
                try:
                    record = json.loads((Path(entry.path) / UPLOAD_FILE).read_bytes())
                except (OSError, ValueError):
                    continue  # being created, completed or aborted right now
                if record["key"].startswith(prefix):
                    initiated = datetime.fromtimestamp(record["initiated"], UTC)
                    out.append(UploadInfo(record["key"], entry.name, initiated))
            return sorted(out, key=lambda u: (u.key, u.initiated, u.upload_id))

        async with self._call("ListMultipartUploads"):
            return await self._run(scan)

    async def list_parts(self, bucket: str, key: str, upload_id: str) -> list[tuple[int, str]]:
        upload_dir = self._upload_dir(bucket, key, upload_id)

        def scan() -> list[tuple[int, str]]:
            self._upload_record(upload_dir, key, upload_id)
            parts = []
            try:
                names = sorted(os.listdir(upload_dir))
            except FileNotFoundError:
                raise errors.NoSuchUpload(UploadId=upload_id) from None
            for name in names:
                if not _PART_NAME.fullmatch(name):
                    continue
                try:
                    fd = os.open(upload_dir / name, os.O_RDONLY)
                except FileNotFoundError:
                    continue  # completed or aborted meanwhile
                try:
                    trailer, _ = read_trailer(fd)
                finally:
                    os.close(fd)
                parts.append((int(name[len("part-") :]), str(trailer["etag"])))
            return parts

        async with self._call("ListParts"):
            return await self._run(scan)
