"""Stored objects in memory and a counting fetch function over them, for the chunk reader tests."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tsproxy.format import (
    KeyRing,
    Manifest,
    ObjectContext,
    SegmentEncoder,
    SegmentInfo,
    TransformSettings,
    build_manifest,
)
from tsproxy.format.zstdframes import FRAME_SIZE

KIB = 1024
MIB = 1024 * 1024


@dataclass
class StoredObject:
    """One stored object version: its original bytes, its data area and what a reader needs."""

    data: bytes
    stored: bytearray  # the data area (the tail is not needed: the manifest is in hand)
    manifest: Manifest
    ctx: ObjectContext


def make_object(
    data: bytes,
    *,
    chunk_size: int = 256 * KIB,
    compression: str = "off",
    ring: KeyRing | None = None,
    segment_sizes: list[int] | None = None,
    frame_size: int = FRAME_SIZE,
) -> StoredObject:
    """Encode data as tsproxy stores it: one segment, or one per entry of segment_sizes (multipart);
    compressed chunks in frames of frame_size (by default, the writer's)."""
    settings = TransformSettings(
        chunk_size=chunk_size,
        compression=compression,  # type: ignore[arg-type]
        encryption=ring is not None,
        frame_size=frame_size,
    )
    ctx = ObjectContext.new(settings, ring)
    sizes = segment_sizes or [len(data)]
    assert sum(sizes) == len(data)
    stored = bytearray()
    infos: list[SegmentInfo] = []
    pos = 0
    for segment_no, size in enumerate(sizes, start=1):
        enc = SegmentEncoder(ctx, settings, segment_no)
        for piece in enc.feed(data[pos : pos + size]):
            stored += piece
        for piece in enc.finish():
            stored += piece
        infos.append(enc.info)
        pos += size
    etag = hashlib.md5(data, usedforsecurity=False).hexdigest()
    manifest = build_manifest(
        ctx, settings, infos, etag=etag, md5=None, content_type=None, metadata={}, headers={}
    )
    return StoredObject(data, stored, manifest, ctx)


def random_data(size: int, seed: int = 0) -> bytes:
    """Incompressible bytes, deterministic per seed."""
    return random.Random(seed).randbytes(size)


def text_data(size: int, seed: int = 0) -> bytes:
    """Compressible bytes (JSON-ish lines), deterministic per seed."""
    rnd = random.Random(seed)
    out = bytearray()
    i = 0
    while len(out) < size:
        out += b'{"offset": %d, "key": "k%d", "value": %d}\n' % (i, rnd.randrange(100), rnd.randrange(10**6))
        i += 1
    return bytes(out[:size])


@dataclass
class CountingFetch:
    """A FetchStored over a StoredObject's data area that records every call.

    `delay` makes each call take a little while (so concurrent readers overlap); `gate`, when set,
    holds every call until the test opens it.
    """

    obj: StoredObject
    delay: float = 0.0
    gate: asyncio.Event | None = None
    calls: list[tuple[int, int]] = field(default_factory=list)
    fail: Exception | None = None
    piece: int = 100_003  # bytes per piece of an answer

    async def __call__(self, start: int, end: int) -> AsyncIterator[bytes]:
        self.calls.append((start, end))
        if self.gate is not None:
            await self.gate.wait()
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        # In pieces that need not line up with chunks, as a backend answer arrives.
        for pos in range(start, end, self.piece):
            yield bytes(self.obj.stored[pos : min(end, pos + self.piece)])
            await asyncio.sleep(0)

    @property
    def bytes_fetched(self) -> int:
        return sum(end - start for start, end in self.calls)
