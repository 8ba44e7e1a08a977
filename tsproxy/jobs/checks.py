"""Checking a stored object's data area as it streams past. Pure: bytes in, verdicts out.

The verify job feeds a `ChunkVerifier` the data area in pieces of any size; it authenticates and
decodes every chunk in order (AES-GCM tag, or CRC32C without encryption), checks each segment's MD5 at
the segment's end and the whole object's MD5 at the end, and holds at most one chunk plus one piece.
"""

from __future__ import annotations

import hashlib

from tsproxy.errors import IntegrityError
from tsproxy.format import ChunkDecoder, ChunkRef, Manifest, ObjectContext

_EMPTY_MD5 = hashlib.md5(b"", usedforsecurity=False).digest()


class Truncated(IntegrityError):
    """The stored data ends before the manifest says it does."""


class ChunkVerifier:
    """Verifies an object's data area fed in order (see the module docstring). Not thread-safe."""

    def __init__(self, manifest: Manifest, ctx: ObjectContext) -> None:
        self._manifest = manifest
        self._decoder = ChunkDecoder(manifest, ctx)
        self._refs = iter(manifest.index)
        self._next: ChunkRef | None = next(self._refs, None)
        self._segments = list(manifest.segments)
        self._seg = 0  # index of the segment being read
        self._seg_chunks = 0  # chunks of it read so far
        self._seg_md5 = hashlib.md5(usedforsecurity=False)
        self._whole = hashlib.md5(usedforsecurity=False)
        self._buf = bytearray()
        self.chunks = 0
        self.stored_bytes = 0
        self.original_bytes = 0
        self._close_empty_segments()

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Take the next stored bytes; IntegrityError as soon as a chunk or a segment fails."""
        self._buf += data
        used = 0
        try:
            while self._next is not None and len(self._buf) - used >= self._next.stored_len:
                ref = self._next
                # A copy per chunk keeps no view on the buffer alive (it is resized below).
                self._chunk(ref, self._buf[used : used + ref.stored_len])
                used += ref.stored_len
                self._next = next(self._refs, None)
        finally:
            del self._buf[:used]
        if self._next is None and self._buf:
            raise IntegrityError(f"data area is longer than the manifest's {self._manifest.data_size} bytes")

    def finish(self) -> None:
        """The data area ended: Truncated if chunks are missing, IntegrityError if the object MD5 differs."""
        if self._next is not None:
            raise Truncated(
                f"data area ends after {self.stored_bytes + len(self._buf)} bytes, in chunk "
                f"{self._next.chunk_no} of segment {self._next.segment_no} (the manifest says "
                f"{self._manifest.data_size})"
            )
        if self._manifest.md5 is not None and self._whole.digest() != self._manifest.md5:
            raise IntegrityError("object MD5 mismatch")

    def _chunk(self, ref: ChunkRef, stored: bytearray) -> None:
        plain = self._decoder.decode(ref, stored)
        self._seg_md5.update(plain)
        self._whole.update(plain)
        self.chunks += 1
        self.stored_bytes += ref.stored_len
        self.original_bytes += len(plain)
        self._seg_chunks += 1
        if self._seg_chunks == len(self._segments[self._seg].stored_sizes):
            self._end_segment()
            self._close_empty_segments()

    def _end_segment(self) -> None:
        seg = self._segments[self._seg]
        if self._seg_md5.digest() != seg.md5:
            raise IntegrityError(f"segment {seg.segment_no}: MD5 mismatch")
        self._seg += 1
        self._seg_chunks = 0
        self._seg_md5 = hashlib.md5(usedforsecurity=False)

    def _close_empty_segments(self) -> None:
        # Empty segments (a zero-byte part) have no chunks; their MD5 is that of no bytes.
        while self._seg < len(self._segments) and not self._segments[self._seg].stored_sizes:
            if self._segments[self._seg].md5 != _EMPTY_MD5:
                raise IntegrityError(f"segment {self._segments[self._seg].segment_no}: MD5 mismatch")
            self._seg += 1
