"""Hot chunks: the few most recently used plaintext chunks, in memory, in front of the disk cache.

Kafka reads about 1 MiB per fetch while chunks are typically 4 MiB, so a forward reader asks for the same
chunk several times in a row. Keeping the latest chunks in memory serves those repeats without reading,
checking and copying the whole chunk from disk each time. Keyed like the disk cache (object version,
segment, chunk), so it can never serve another version's bytes. Event-loop only: no locking.
"""

from __future__ import annotations

from collections import OrderedDict

from .chunks import ChunkKey


class HotChunks:
    """A byte-bounded LRU map of chunk plaintexts."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes cannot be negative")
        self.max_bytes = max_bytes
        self._chunks: OrderedDict[ChunkKey, bytes | memoryview] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._chunks)

    def __contains__(self, key: ChunkKey) -> bool:
        return key in self._chunks

    @property
    def size_bytes(self) -> int:
        """Plaintext bytes held."""
        return self._bytes

    def get(self, key: ChunkKey) -> bytes | memoryview | None:
        """The chunk's plaintext if held (and now the most recently used), else None."""
        data = self._chunks.get(key)
        if data is not None:
            self._chunks.move_to_end(key)
        return data

    def put(self, key: ChunkKey, data: bytes | memoryview) -> None:
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

    def clear(self) -> None:
        """Drop everything."""
        self._chunks.clear()
        self._bytes = 0
