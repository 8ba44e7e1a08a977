"""An in-memory stand-in for the bucket, for the pure planning and decoding tests (no S3 involved)."""

from __future__ import annotations

from collections.abc import Generator

from tsproxy import errors
from tsproxy.spark.bucket import Bucket
from tsproxy.spark.options import StoreOptions


class MemoryBucket(Bucket):
    """Objects held in a dict; streams in small pieces to exercise the reader's region handling."""

    def __init__(self, objects: dict[str, bytes], piece: int = 997) -> None:
        super().__init__(StoreOptions(bucket="memory"))
        self.objects = objects
        self.piece = piece
        self.reads: list[tuple[str, int, int | None]] = []

    def stream(
        self, key: str, first: int = 0, end: int | None = None, *, stored_size: int | None = None
    ) -> Generator[bytes, None, None]:
        if key not in self.objects:
            raise errors.NoSuchKey(f"{self.uri(key)}: no such object")
        self.reads.append((key, first, end))
        data = self.objects[key][first:end]
        for i in range(0, len(data), self.piece):
            yield data[i : i + self.piece]
