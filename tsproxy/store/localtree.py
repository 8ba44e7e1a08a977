"""The local backend's directory tree: where a bucket or an object lives under the root, how
directories come and go, and the thread pool every blocking filesystem call runs in.

`LocalBackend` (local.py) builds on `LocalTree` through `LocalMultipart` (localmultipart.py); the
layout is described in local.py, the object files in localfile.py.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import os
import threading
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, TypeVar

from tsproxy import errors
from tsproxy.store import localnames
from tsproxy.store.base import MIB, MIN_PART_SIZE, Body, check_key, iterate_body
from tsproxy.store.localfile import Spool, read_trailer
from tsproxy.store.observe import BackendCall, OnRequest, observer_of

R = TypeVar("R")

# run(fn, *args, key=None): blocking `fn(*args)` in the backend's thread pool, OSError as an S3 error.
Run = Callable[..., Awaitable[Any]]

WRITE_BATCH = 1 * MIB  # body pieces gathered into one thread hop


class LocalTree:
    """A root directory of buckets, with S3's semantics; the parts of the backend all others use."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        executor: Executor | None = None,
        fsync: bool = True,
        min_part_size: int = MIN_PART_SIZE,
        read_size: int = MIB,
        on_request: OnRequest | None = None,
    ) -> None:
        self.root = Path(root)
        self.executor = executor
        self.fsync = fsync
        self.min_part_size = min_part_size
        self.read_size = read_size
        self.on_request = on_request
        self.observer = observer_of(on_request)
        self._tree_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"

    def _call(self, operation: str) -> BackendCall:
        return BackendCall(self.observer, operation)

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

    # -- object files

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

    async def _fill(self, spool: Spool, body: Body, call: BackendCall, key: str) -> None:
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


def fs_error(error: OSError, key: str | None = None) -> errors.S3Error:
    """The S3 error for a failed filesystem operation."""
    if error.errno == errno.ENAMETOOLONG and key is not None:
        return errors.KeyTooLongError(Key=key)
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return errors.ServiceUnavailable("The local backend is out of space.")
    return errors.InternalError(f"local backend I/O failed: {error.strerror}")
