"""Object files of the local backend, without the backend: the layout on disk and atomic writing.

An object file is its data followed by a JSON trailer (key, size, ETag, mtime, content type, user
metadata), the trailer's length (uint32, big-endian) and the magic `TSPLOBJ1`::

    data (size bytes) | trailer JSON | u32 trailer length | b"TSPLOBJ1"

The trailer comes last so the file can be written in one streaming pass: the ETag and size are known
only at the end. A `Spool` writes under a temporary name in the target directory and renames into
place (`os.replace`) once the trailer is written and (optionally) synced, so data and metadata appear
together or not at all. Every function here blocks; the backend calls them in its thread pool.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import struct
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tsproxy import errors
from tsproxy.durable import fsync_dir
from tsproxy.store.base import MIB, BodyMD5, ObjectInfo

MAGIC = b"TSPLOBJ1"
TMP_PREFIX = ".tmp-"
_TRAILER_TAIL = struct.Struct(">I8s")  # trailer length, magic


def read_trailer(fd: int) -> tuple[dict[str, Any], int]:
    """(trailer, data length) of an open object file; IntegrityError if it is not one."""
    total = os.fstat(fd).st_size
    if total < _TRAILER_TAIL.size:
        raise errors.InternalError("local object file is truncated")
    length, magic = _TRAILER_TAIL.unpack(os.pread(fd, _TRAILER_TAIL.size, total - _TRAILER_TAIL.size))
    data_len = total - _TRAILER_TAIL.size - length
    if magic != MAGIC or data_len < 0:
        raise errors.InternalError("local object file has no valid trailer")
    trailer = json.loads(os.pread(fd, length, data_len))
    if trailer.get("size") != data_len:
        raise errors.InternalError("local object file size does not match its trailer")
    return trailer, data_len


def info_of(trailer: Mapping[str, Any], *, with_metadata: bool = True) -> ObjectInfo:
    return ObjectInfo(
        key=trailer["key"],
        size=trailer["size"],
        etag=trailer["etag"],
        last_modified=datetime.fromtimestamp(trailer["mtime"], UTC),
        metadata=dict(trailer.get("metadata") or {}) if with_metadata else {},
        content_type=trailer.get("content_type"),
    )


class Spool:
    """A file being written under a temporary name next to its final place (blocking methods)."""

    def __init__(self, directory: Path, sync: bool) -> None:
        self.directory = directory
        self.sync = sync
        self.temp = directory / f"{TMP_PREFIX}{secrets.token_hex(8)}"
        self.fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.md5 = hashlib.md5()
        self.size = 0

    def write(self, pieces: Sequence[bytes | memoryview]) -> None:
        for piece in pieces:
            view = memoryview(piece)
            while view:
                view = view[os.write(self.fd, view) :]
            self.md5.update(piece)
            self.size += len(piece)

    def check_md5(self, expected: BodyMD5 | None) -> str:
        """The hex MD5 of what was written (its ETag); BadDigest when the writer's own MD5 differs."""
        if expected is not None and self.md5.digest() != (expected() if callable(expected) else expected):
            raise errors.BadDigest()
        return self.md5.hexdigest()

    def commit(self, final: Path, trailer: dict[str, Any]) -> dict[str, Any]:
        """Append the trailer, sync, and rename into place. Returns the trailer."""
        trailer = {**trailer, "size": self.size}
        encoded = json.dumps(trailer, separators=(",", ":")).encode()
        os.write(self.fd, encoded + _TRAILER_TAIL.pack(len(encoded), MAGIC))
        if self.sync:
            os.fsync(self.fd)
        os.close(self.fd)
        self.fd = -1
        os.replace(self.temp, final)
        if self.sync:
            fsync_dir(self.directory)
        return trailer

    def discard(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            os.unlink(self.temp)
        except FileNotFoundError:
            pass


def copy_range(src_fd: int, start: int, length: int, spool: Spool, chunk: int = 4 * MIB) -> None:
    end = start + length
    while start < end:
        data = os.pread(src_fd, min(chunk, end - start), start)
        if not data:
            raise errors.InternalError("local object file shrank while being copied")
        spool.write([data])
        start += len(data)
