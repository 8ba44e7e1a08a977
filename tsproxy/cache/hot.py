"""Hot chunks: the most recently used chunks, in memory, in front of the disk cache.

Kafka reads about 1 MiB per fetch while chunks are typically 4 MiB, so a forward reader asks for the same
chunk several times in a row. Keeping the latest chunks' plaintext in memory serves those repeats without
reading, checking and copying the whole chunk from disk each time. A reader seeking about an object
(random 1 MiB reads) inflates only part of a chunk, so what it keeps is the chunk's stored bytes, under
`Sealed(key)`: a quarter of the plaintext's size for Kafka data, verified when they were fetched, and
decoded again (only the part needed) on the next seek into the chunk. Both share one byte bound and one
LRU order. Keyed like the disk cache (object version, segment, chunk), so it can never serve another
version's bytes. Event-loop only: no locking.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from .chunks import ChunkKey


class Sealed(NamedTuple):
    """The key of a chunk's stored bytes (rather than its plaintext) in HotChunks."""

    key: ChunkKey


class HotChunks:
    """A byte-bounded LRU map of chunk plaintexts (by ChunkKey) and stored chunks (by Sealed)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes cannot be negative")
        self.max_bytes = max_bytes
        self._chunks: OrderedDict[ChunkKey | Sealed, bytes | memoryview] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._chunks)

    def __contains__(self, key: ChunkKey | Sealed) -> bool:
        return key in self._chunks

    @property
    def size_bytes(self) -> int:
        """Bytes held (plaintexts and stored chunks)."""
        return self._bytes

    def get(self, key: ChunkKey | Sealed) -> bytes | memoryview | None:
        """The bytes held under key (now the most recently used), else None."""
        data = self._chunks.get(key)
        if data is not None:
            self._chunks.move_to_end(key)
        return data

    def put(self, key: ChunkKey | Sealed, data: bytes | memoryview) -> None:
        """Hold a chunk, dropping the least recently used ones to stay within max_bytes."""
        if len(data) > self.max_bytes:
            return
        old = self._chunks.pop(key, None)
        if old is not None:
            self._bytes -= len(old)
        self._chunks[key] = data
        self._bytes += len(data)
        while self._bytes > self.max_bytes:
            _, dropped = self._chunks.popitem(last=False)
            self._bytes -= len(dropped)

    def discard(self, key: ChunkKey | Sealed) -> None:
        """Drop what is held under key, if anything."""
        data = self._chunks.pop(key, None)
        if data is not None:
            self._bytes -= len(data)

    def clear(self) -> None:
        """Drop everything."""
        self._chunks.clear()
        self._bytes = 0
