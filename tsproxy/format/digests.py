"""The MD5 of a stored object, made as its chunks are made, for a backend that wants it (Content-MD5)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any


class BoundedMD5:
    """The MD5 of a stored object, made as it is stored, for a backend that uses it only when the object
    fits in `limit` bytes (S3Backend sends a larger one in parts, each hashed as it goes): past the limit
    it stops hashing, since a second full pass over every stored byte would be CPU nobody uses (as many
    stored bytes as payload, for a segment whose producer compressed it). No limit: hashed
    whole. Fed in order, one call at a time (the store path's lane, then the tail).

    stored_size: the object's stored size when it is known before its bytes are (chunks stored
    uncompressed, of a declared length), else None; beyond the limit, nothing is hashed at all.
    """

    def __init__(self, limit: int | None, stored_size: Callable[[], int | None] | None = None) -> None:
        self._md5: Any = hashlib.md5(usedforsecurity=False)
        self._limit = limit
        self._stored_size = stored_size
        self._size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if self._md5 is None:
            return
        self._size += memoryview(data).nbytes
        if self._limit is not None and (
            self._size > self._limit
            or (self._stored_size is not None and (self._stored_size() or 0) > self._limit)
        ):
            self._md5 = None  # beyond what it is wanted for
            return
        self._md5.update(data)

    def digest(self) -> bytes | None:
        """The MD5 of everything fed; None once more than `limit` bytes were."""
        return None if self._md5 is None else self._md5.digest()

    def whole(self) -> bytes:
        """digest(), for a body that fits (the backend asks only then): an error, never a wrong MD5."""
        digest = self.digest()
        if digest is None:
            raise RuntimeError(f"the MD5 of a body beyond {self._limit} bytes was asked for")
        return digest
