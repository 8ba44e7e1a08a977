"""The embedded backend: buckets are directories under one root, objects are files.

Layout under the root::

    <bucket>/.bucket                 creation time
    <bucket>/da/db/oc                object "a/b/c" (names: see `localnames`)
    <bucket>/.uploads/<id>/upload.json, part-00001 …   multipart uploads in progress
    <bucket>/**/.tmp-*               files being written

Every object file holds its data and its metadata (see `localfile`), written to a temporary name in
the target directory and renamed into place once whole and synced, so a reader sees the old object
or the new one, never a mix and never a half-written one.

Blocking file I/O runs in a thread pool (the given executor or asyncio's default), never on the event
loop. Directory creation and removal happen under one lock, so a put never loses its directory to the
clean-up of a concurrent delete.
"""

from __future__ import annotations

import asyncio
import builtins
import errno
import functools
import json
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from tsproxy import errors
from tsproxy.store import listing, localnames
from tsproxy.store.base import (
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
    iterate_body,
    multipart_etag,
    normalize_metadata,
    resolve_range,
    unquote_etag,
)
from tsproxy.store.localfile import MAGIC, TMP_PREFIX, Spool, copy_range, info_of, read_trailer
from tsproxy.store.observe import Call

__all__ = ["MAGIC", "LocalBackend", "LocalReader"]

R = TypeVar("R")

UPLOADS = ".uploads"
BUCKET_FILE = ".bucket"
UPLOAD_FILE = "upload.json"
_UPLOAD_ID = re.compile(r"[0-9a-f]{32}")
WRITE_BATCH = 1 * MIB  # body pieces gathered into one thread hop
_Entries = list[tuple[str, str, str, str]]  # (sort key, kind, segment, path) of a directory's entries


# -- readers ---------------------------------------------------------------------------------------------


class LocalReader:
    """A body read from an open object file in bounded pieces, in the backend's thread pool."""

    def __init__(
        self,
        backend: LocalBackend,
        fd: int,
        info: ObjectInfo,
        start: int,
        end: int,
        content_range: tuple[int, int] | None,
        call: Call,
    ) -> None:
        self._backend = backend
        self._fd = fd
        self.info = info
        self.content_range = content_range
        self._pos = start
        self._end = end  # exclusive
        self._call = call

    async def _read(self, limit: int) -> bytes:
        n = min(limit, self._end - self._pos)
        if n <= 0 or self._fd < 0:
            return b""
        data = await self._backend._run(os.pread, self._fd, n, self._pos)
        if len(data) != n:
            raise errors.InternalError("local object file shrank while being read")
        self._pos += n
        self._call.bytes_in += n
        return data

    async def _pieces(self) -> AsyncIterator[bytes]:
        while piece := await self._read(self._backend.read_size):
            yield piece

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._pieces()

    async def read(self) -> bytes:
        """The rest of the body in one piece (for small bodies)."""
        return await self._read(self._end - self._pos)

    async def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            await self._backend._run(os.close, fd)
        self._call.finish()

    async def __aenter__(self) -> LocalReader:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


# -- the backend -----------------------------------------------------------------------------------------


class LocalBackend:
    """Objects in a local directory, with S3's semantics (see the module docstring for the layout)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        executor: Executor | None = None,
        fsync: bool = True,
        min_part_size: int = MIN_PART_SIZE,
        read_size: int = MIB,
        on_request: RequestObserver | None = None,
    ) -> None:
        self.root = Path(root)
        self.executor = executor
        self.fsync = fsync
        self.min_part_size = min_part_size
        self.read_size = read_size
        self.on_request = on_request
        self._tree_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LocalBackend({str(self.root)!r})"

    async def _run(self, fn: Callable[..., R], *args: Any, key: str | None = None) -> R:
        """Run blocking `fn(*args)` in the thread pool; a filesystem failure becomes an S3 error.

        Only filesystem work runs here, so an error raised by a body stream (a client that went
        away, say) never passes through and reaches the caller as it is. `key` names the object
        in the error.
        """
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self.executor, functools.partial(fn, *args)
            )
        except OSError as e:
            raise fs_error(e, key) from e

    async def _cleanup(self, fn: Callable[[], object]) -> None:
        """Run a clean-up step to its end even if the awaiting task is cancelled meanwhile."""
        future = asyncio.get_running_loop().run_in_executor(self.executor, fn)
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            pass

    # -- lifecycle

    async def start(self) -> None:
        await self._run(functools.partial(self.root.mkdir, parents=True, exist_ok=True))

    async def close(self) -> None:
        return None

    async def ping(self) -> None:
        def check() -> None:
            if not self.root.is_dir() or not os.access(self.root, os.W_OK | os.X_OK):
                raise errors.ServiceUnavailable(f"local backend root {self.root} is not a writable directory")

        await self._run(check)

    # -- paths

    def _bucket_dir(self, bucket: str) -> Path:
        # A name S3 would refuse cannot exist, and keeps `bucket` from being a path.
        if not localnames.valid_bucket_name(bucket):
            raise errors.NoSuchBucket(BucketName=bucket)
        return self.root / bucket

    def _object_path(self, bucket: str, key: str) -> Path:
        check_key(key)
        return self._bucket_dir(bucket).joinpath(*localnames.key_path(key))

    def _require_bucket(self, bucket_dir: Path) -> None:
        if not bucket_dir.is_dir():
            raise errors.NoSuchBucket(BucketName=bucket_dir.name)

    def _upload_dir(self, bucket: str, key: str, upload_id: str) -> Path:
        check_key(key)
        bucket_dir = self._bucket_dir(bucket)
        if not _UPLOAD_ID.fullmatch(upload_id):
            raise errors.NoSuchUpload(UploadId=upload_id)
        return bucket_dir / UPLOADS / upload_id

    def _make_dirs(self, bucket_dir: Path, target_dir: Path, segments: Mapping[Path, str]) -> None:
        """Create the directories from the bucket down to `target_dir` (call with the tree lock held).

        `segments` gives the key segment of each directory named by hash: it is written into the
        directory before anything else appears there, so a listing can always name it.
        """
        missing: list[Path] = []
        d = target_dir
        while d != bucket_dir and not d.is_dir():
            missing.append(d)
            d = d.parent
        for d in reversed(missing):
            try:
                d.mkdir()
            except FileExistsError:
                continue
            if d in segments:
                (d / localnames.SEGMENT_FILE).write_text(segments[d], encoding="utf-8")

    def _open_spool(self, bucket_dir: Path, final: Path, segments: Mapping[Path, str] | None = None) -> Spool:
        """A spool next to `final`, creating the directories on the way (blocking)."""
        with self._tree_lock:
            self._require_bucket(bucket_dir)
            self._make_dirs(bucket_dir, final.parent, segments or {})
            return Spool(final.parent, self.fsync)

    def _hashed_dirs(self, bucket_dir: Path, key: str) -> dict[Path, str]:
        """Directories of `key` named by hash, with the segment each stands for."""
        out: dict[Path, str] = {}
        d = bucket_dir
        for segment in key.split("/")[:-1]:
            d = d / localnames.segment_name(segment, localnames.DIRECTORY)
            if d.name[:1] == "D":
                out[d] = segment
        return out

    def _prune_dirs(self, start: Path, levels: int) -> None:
        """Remove now-empty directories from `start` up through `levels` directories (blocking).

        `levels` is the number of directories the key's segments made, so the walk never reaches
        the bucket directory itself.
        """
        d = str(start)
        with self._tree_lock:
            for _ in range(levels):
                try:
                    names = os.listdir(d)
                except FileNotFoundError:
                    d = os.path.dirname(d)
                    continue
                if names and names != [localnames.SEGMENT_FILE]:
                    return
                try:
                    if names:
                        os.unlink(os.path.join(d, localnames.SEGMENT_FILE))
                    os.rmdir(d)
                except OSError:
                    return
                d = os.path.dirname(d)

    # -- buckets

    async def list_buckets(self) -> list[tuple[str, datetime]]:
        def scan() -> list[tuple[str, datetime]]:
            out = []
            for entry in os.scandir(self.root):
                if not entry.is_dir() or not localnames.valid_bucket_name(entry.name):
                    continue
                try:
                    created = float((Path(entry.path) / BUCKET_FILE).read_text())
                except (OSError, ValueError):
                    created = entry.stat().st_mtime
                out.append((entry.name, datetime.fromtimestamp(created, UTC)))
            return sorted(out)

        with Call(self.on_request, "ListBuckets"):
            return await self._run(scan)

    async def create_bucket(self, bucket: str) -> None:
        if not localnames.valid_bucket_name(bucket):
            raise errors.InvalidBucketName(BucketName=bucket)

        def create() -> None:
            d = self.root / bucket
            try:
                d.mkdir()
            except FileExistsError:
                raise errors.BucketAlreadyOwnedByYou(BucketName=bucket) from None
            spool = Spool(d, self.fsync)
            try:
                os.write(spool.fd, repr(time.time()).encode())
                if self.fsync:
                    os.fsync(spool.fd)
                os.close(spool.fd)
                spool.fd = -1
                os.replace(spool.temp, d / BUCKET_FILE)
            finally:
                spool.discard()

        with Call(self.on_request, "CreateBucket"):
            await self._run(create)

    async def head_bucket(self, bucket: str) -> None:
        d = self._bucket_dir(bucket)
        with Call(self.on_request, "HeadBucket"):
            await self._run(self._require_bucket, d)

    async def delete_bucket(self, bucket: str) -> None:
        d = self._bucket_dir(bucket)

        def delete() -> None:
            with self._tree_lock:
                self._require_bucket(d)
                for name in os.listdir(d):
                    if name[:1] in localnames.KINDS or name.startswith(TMP_PREFIX):
                        raise errors.BucketNotEmpty(BucketName=bucket)
                # Renamed away first so the bucket disappears at once, then removed at leisure.
                trash = self.root / f".deleting-{bucket}-{secrets.token_hex(4)}"
                os.rename(d, trash)
            shutil.rmtree(trash, ignore_errors=True)

        with Call(self.on_request, "DeleteBucket"):
            await self._run(delete)

    # -- objects

    def _open_object(self, bucket: str, key: str) -> tuple[int, dict[str, Any], int]:
        """(fd, trailer, data length) of an object (blocking)."""
        path = self._object_path(bucket, key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            self._require_bucket(self._bucket_dir(bucket))
            raise errors.NoSuchKey(Key=key) from None
        except OSError as e:
            if e.errno == errno.ENAMETOOLONG:
                raise errors.NoSuchKey(Key=key) from None
            raise
        try:
            trailer, size = read_trailer(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd, trailer, size

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        def head() -> ObjectInfo:
            fd, trailer, _ = self._open_object(bucket, key)
            os.close(fd)
            return info_of(trailer)

        with Call(self.on_request, "HeadObject"):
            return await self._run(head)

    async def get(
        self,
        bucket: str,
        key: str,
        first: int | None = None,
        last: int | None = None,
        *,
        if_match: str | None = None,
    ) -> LocalReader:
        call = Call(self.on_request, "GetObject")
        try:
            fd, trailer, size = await self._run(self._open_object, bucket, key)
            try:
                info = info_of(trailer)
                if if_match is not None and unquote_etag(if_match) != info.etag:
                    raise errors.PreconditionFailed(Condition="If-Match")
                served = resolve_range(size, first, last)
            except BaseException:
                os.close(fd)
                raise
        except BaseException as e:
            call.finish(e)
            raise
        call.mark()
        start, end = (0, size) if served is None else (served[0], served[1] + 1)
        return LocalReader(self, fd, info, start, end, served, call)

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

    async def _fill(self, spool: Spool, body: Body, call: Call, key: str) -> None:
        """Write a body into a spool, gathering small pieces into fewer thread hops."""
        batch: list[bytes] = []
        batched = 0
        async for piece in iterate_body(body):
            batch.append(piece)
            batched += len(piece)
            if batched >= WRITE_BATCH:
                await self._run(spool.write, batch, key=key)
                call.bytes_out += batched
                batch, batched = [], 0
        if batch:
            await self._run(spool.write, batch, key=key)
            call.bytes_out += batched

    async def put(
        self,
        bucket: str,
        key: str,
        body: Body,
        *,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo:
        path = self._object_path(bucket, key)
        bucket_dir = self._bucket_dir(bucket)
        trailer = {
            "key": key,
            "mtime": time.time(),
            "content_type": content_type,
            "metadata": normalize_metadata(metadata),
        }
        with Call(self.on_request, "PutObject") as call:
            segments = self._hashed_dirs(bucket_dir, key)
            spool = await self._run(self._open_spool, bucket_dir, path, segments, key=key)
            try:
                await self._fill(spool, body, call, key)
                trailer["etag"] = spool.md5.hexdigest()
                written = await self._run(spool.commit, path, trailer, key=key)
            except BaseException:
                await self._cleanup(spool.discard)
                raise
            return info_of(written)

    async def delete(self, bucket: str, key: str) -> None:
        path = self._object_path(bucket, key)
        bucket_dir = self._bucket_dir(bucket)

        def delete() -> None:
            self._require_bucket(bucket_dir)
            try:
                os.unlink(path)
            except (FileNotFoundError, NotADirectoryError):
                return
            except OSError as e:
                if e.errno == errno.ENAMETOOLONG:
                    return
                raise
            self._prune_dirs(path.parent, key.count("/"))

        with Call(self.on_request, "DeleteObject"):
            await self._run(delete)

    async def delete_many(self, bucket: str, keys: Sequence[str]) -> list[tuple[str, str, str]]:
        failed: list[tuple[str, str, str]] = []
        for key in keys:
            try:
                await self.delete(bucket, key)
            except errors.NoSuchBucket:
                raise
            except errors.S3Error as e:
                failed.append((key, e.code, e.message))
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
        bucket_dir = self._bucket_dir(bucket)

        def run() -> ListPage:
            self._require_bucket(bucket_dir)
            page = listing.paginate(
                functools.partial(self._walk, bucket_dir),
                prefix=prefix,
                delimiter=delimiter or None,
                start_after=start_after,
                token=token,
                max_keys=max_keys,
            )
            objects = []
            for path in page.items:
                try:
                    fd = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    continue  # deleted since the walk saw it
                try:
                    trailer, _ = read_trailer(fd)
                finally:
                    os.close(fd)
                objects.append(info_of(trailer, with_metadata=False))
            return ListPage(objects, page.common_prefixes, page.is_truncated, page.next_token)

        with Call(self.on_request, "ListObjectsV2"):
            return await self._run(run)

    def _entries(self, d: str | Path, base: str, cursor: listing.Cursor) -> _Entries:
        """(sort key, kind, segment, path) of one directory's entries the cursor may want, sorted."""
        out = []
        try:
            scan = os.scandir(d)
        except (FileNotFoundError, NotADirectoryError):
            return []
        with scan:
            for entry in scan:
                parsed = localnames.parse_name(entry.name)
                if parsed is None:
                    continue
                kind, segment = parsed
                if segment is None:
                    segment = self._hashed_segment(entry.path, kind)
                    if segment is None:
                        continue
                if kind == localnames.DIRECTORY:
                    if not cursor.admits_subtree(base + segment + "/"):
                        continue
                elif not cursor.admits(base + segment):
                    continue
                out.append((localnames.sort_key(kind, segment), kind, segment, entry.path))
        out.sort()
        return out

    @staticmethod
    def _hashed_segment(path: str, kind: str) -> str | None:
        try:
            if kind == localnames.DIRECTORY:
                return (Path(path) / localnames.SEGMENT_FILE).read_text(encoding="utf-8")
            fd = os.open(path, os.O_RDONLY)
            try:
                key: str = read_trailer(fd)[0]["key"]
            finally:
                os.close(fd)
            return key.rsplit("/", 1)[-1]
        except (OSError, errors.S3Error, ValueError):
            return None  # still being created or already gone

    def _walk(self, bucket_dir: Path, cursor: listing.Cursor) -> Iterator[tuple[str, str]]:
        """Keys and file paths under the cursor's prefix, in S3 order (depth-first, no recursion)."""
        names, base = localnames.prefix_dirs(cursor.prefix)
        start = bucket_dir.joinpath(*names)
        stack: builtins.list[tuple[Iterator[tuple[str, str, str, str]], str]] = [
            (iter(self._entries(start, base, cursor)), base)
        ]
        while stack:
            entries, base = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                continue
            _, kind, segment, path = entry
            if kind == localnames.DIRECTORY:
                sub = base + segment + "/"
                if cursor.admits_subtree(sub):
                    stack.append((iter(self._entries(path, sub, cursor)), sub))
            elif cursor.admits(base + segment):
                yield base + segment, path

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
        dst = self._object_path(dst_bucket, dst_key)
        dst_bucket_dir = self._bucket_dir(dst_bucket)
        replace = metadata is not None or content_type is not None

        def copy() -> ObjectInfo:
            fd, src_trailer, size = self._open_object(src_bucket, src_key)
            try:
                spool = self._open_spool(dst_bucket_dir, dst, self._hashed_dirs(dst_bucket_dir, dst_key))
                try:
                    copy_range(fd, 0, size, spool)
                    trailer = {
                        "key": dst_key,
                        "mtime": time.time(),
                        "content_type": content_type if replace else src_trailer.get("content_type"),
                        "metadata": normalize_metadata(metadata)
                        if replace
                        else src_trailer.get("metadata", {}),
                        "etag": spool.md5.hexdigest(),
                    }
                    return info_of(spool.commit(dst, trailer))
                except BaseException:
                    spool.discard()
                    raise
            finally:
                os.close(fd)

        with Call(self.on_request, "CopyObject"):
            return await self._run(copy, key=dst_key)

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

        with Call(self.on_request, "CreateMultipartUpload"):
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
        self, bucket: str, key: str, upload_id: str, part_no: int, body: Body, size: int | None = None
    ) -> str:
        check_part_number(part_no)
        upload_dir = self._upload_dir(bucket, key, upload_id)
        with Call(self.on_request, "UploadPart") as call:
            spool = await self._run(self._open_part_spool, upload_dir, key, upload_id, key=key)
            try:
                await self._fill(spool, body, call, key)
                if size is not None and spool.size != size:
                    raise errors.IncompleteBody()
                trailer = {"key": key, "mtime": time.time(), "etag": spool.md5.hexdigest()}
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

        with Call(self.on_request, "UploadPartCopy"):
            return await self._run(copy, key=key)

    async def complete_multipart(
        self, bucket: str, key: str, upload_id: str, parts: Sequence[tuple[int, str]]
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

        with Call(self.on_request, "CompleteMultipartUpload"):
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

        with Call(self.on_request, "AbortMultipartUpload"):
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

        with Call(self.on_request, "ListMultipartUploads"):
            return await self._run(scan)


def fs_error(error: OSError, key: str | None = None) -> errors.S3Error:
    """The S3 error for a failed filesystem operation."""
    if error.errno == errno.ENAMETOOLONG and key is not None:
        return errors.KeyTooLongError(Key=key)
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return errors.ServiceUnavailable("The local backend is out of space.")
    return errors.InternalError(f"local backend I/O failed: {error.strerror}")
