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
import os
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import unquote

from tsproxy import errors
from tsproxy.store import listing, localnames
from tsproxy.store.base import (
    Body,
    BodyMD5,
    ListPage,
    ObjectInfo,
    normalize_metadata,
    resolve_range,
    unquote_etag,
)
from tsproxy.store.localfile import MAGIC, TMP_PREFIX, Spool, copy_range, info_of, read_trailer
from tsproxy.store.localmultipart import LocalMultipart
from tsproxy.store.localtree import Run
from tsproxy.store.observe import BackendCall
from tsproxy.store.registry import BackendKind, register

__all__ = ["MAGIC", "LocalBackend", "LocalReader"]

BUCKET_FILE = ".bucket"
_Entries = list[tuple[str, str, str, str]]  # (sort key, kind, segment, path) of a directory's entries


# -- readers ---------------------------------------------------------------------------------------------


class LocalReader:
    """A body read from an open object file in bounded pieces, in the backend's thread pool."""

    def __init__(
        self,
        fd: int,
        info: ObjectInfo,
        start: int,
        end: int,
        content_range: tuple[int, int] | None,
        call: BackendCall,
        *,
        run: Run,
        read_size: int,
    ) -> None:
        self._run = run
        self._read_size = read_size
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
        data = await self._run(os.pread, self._fd, n, self._pos)
        if len(data) != n:
            raise errors.InternalError("local object file shrank while being read")
        self._pos += n
        self._call.bytes_in += n
        return data

    async def _pieces(self) -> AsyncIterator[bytes]:
        while piece := await self._read(self._read_size):
            yield piece

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._pieces()

    async def read(self) -> bytes:
        """The rest of the body in one piece (for small bodies)."""
        return await self._read(self._end - self._pos)

    async def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            await self._run(os.close, fd)
        self._call.finish()

    async def __aenter__(self) -> LocalReader:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


# -- the backend -----------------------------------------------------------------------------------------


class LocalBackend(LocalMultipart):
    """Objects in a local directory, with S3's semantics (see the module docstring for the layout).

    Implements `Backend`, `MultipartCapable` and `BucketCapable`; the directory tree and the thread
    pool are `LocalTree`'s, multipart uploads `LocalMultipart`'s.
    """

    # -- lifecycle

    async def start(self) -> None:
        await self._run(functools.partial(self.root.mkdir, parents=True, exist_ok=True))

    async def close(self) -> None:
        return None

    async def remove_leftovers(self, older_than: float) -> int:
        """Remove the files and directories a killed process left being written or removed (see
        `LOCAL_TEMPORARY`) that were last written before `older_than`."""
        return await asyncio.to_thread(_remove_temporary, self.root, older_than)  # OSError as it is

    async def ping(self) -> None:
        def check() -> None:
            if not self.root.is_dir() or not os.access(self.root, os.W_OK | os.X_OK):
                raise errors.ServiceUnavailable(f"local backend root {self.root} is not a writable directory")

        await self._run(check)

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

        async with self._call("ListBuckets"):
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

        async with self._call("CreateBucket"):
            await self._run(create)

    async def head_bucket(self, bucket: str) -> None:
        d = self._bucket_dir(bucket)
        async with self._call("HeadBucket"):
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

        async with self._call("DeleteBucket"):
            await self._run(delete)

    # -- objects
    async def head(self, bucket: str, key: str) -> ObjectInfo:
        def head() -> ObjectInfo:
            fd, trailer, _ = self._open_object(bucket, key)
            os.close(fd)
            return info_of(trailer)

        async with self._call("HeadObject"):
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
        call = self._call("GetObject")
        await call.admit()
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
        return LocalReader(fd, info, start, end, served, call, run=self._run, read_size=self.read_size)

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
        path = self._object_path(bucket, key)
        bucket_dir = self._bucket_dir(bucket)
        trailer = {
            "key": key,
            "mtime": time.time(),
            "content_type": content_type,
            "metadata": normalize_metadata(metadata),
        }
        async with self._call("PutObject") as call:
            segments = self._hashed_dirs(bucket_dir, key)
            spool = await self._run(self._open_spool, bucket_dir, path, segments, key=key)
            try:
                await self._fill(spool, body, call, key)
                trailer["etag"] = spool.check_md5(content_md5)
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

        async with self._call("DeleteObject"):
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

        async with self._call("ListObjectsV2"):
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

        async with self._call("CopyObject"):
            return await self._run(copy, key=dst_key)


# Files being written, buckets being removed: what a killed process leaves in the directory.
LOCAL_TEMPORARY = (TMP_PREFIX, ".deleting-")


def _remove_temporary(root: Path, cutoff: float) -> int:
    """Remove the temporary files and directories under `root` last written before `cutoff`."""
    removed = 0
    for directory, dirs, files in os.walk(root):
        for name in [d for d in dirs if d.startswith(LOCAL_TEMPORARY)]:
            path = Path(directory, name)
            if not path.is_symlink() and path.stat().st_mtime < cutoff:
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
            dirs.remove(name)
        for name in files:
            if not name.startswith(LOCAL_TEMPORARY):
                continue
            path = Path(directory, name)
            try:
                if path.lstat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue  # renamed into place or removed meanwhile
    return removed


def _open(url: str, **options: Any) -> LocalBackend:
    """`file:///abs/path` (or `file://./relative`, `file://localhost/abs/path`)."""
    rest = url[len("file://") :] if url[:7].lower() == "file://" else url[len("file:") :]
    if rest.startswith("localhost/"):
        rest = rest[len("localhost") :]
    if not rest:
        raise ValueError(f"{url!r} names no directory")
    return LocalBackend(Path(unquote(rest)), **options)


KIND = register(BackendKind("local", ("file:",), "file:///path", _open, embedded=True))
