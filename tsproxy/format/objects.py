"""Whole-object conveniences for tests, tools and batch jobs: encode, decode, ranged reads, streaming.

The server uses the pieces (SegmentEncoder, decode_tail, ChunkIndex, ChunkDecoder) directly; these
helpers compose them the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping

from tsproxy.errors import IntegrityError

from .context import ObjectContext
from .decoder import ChunkDecoder
from .keyring import KeyRing
from .manifest import TRAILER_SIZE, Manifest, build_manifest, decode_tail, encode_tail, tail_length
from .segment import SegmentEncoder
from .settings import TransformSettings
from .tail import find_tail

# Chunks a streaming reader fetches per backend read: few requests, bounded memory.
READ_BATCH = 4


def encode_stream(
    source: Iterable[bytes | bytearray | memoryview],
    settings: TransformSettings,
    keyring: KeyRing | None,
    *,
    content_type: str | None = None,
    metadata: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Iterator[bytes]:
    """Stored bytes of a single-segment object, chunk by chunk, then its tail; memory of about two chunks."""
    ctx = ObjectContext.new(settings, keyring)
    encoder = SegmentEncoder(ctx, settings, 1)
    for piece in source:
        yield from encoder.feed(piece)
    yield from encoder.finish()
    info = encoder.info
    manifest = build_manifest(
        ctx,
        settings,
        [info],
        etag=info.md5.hex(),
        md5=info.md5,
        content_type=content_type,
        metadata=metadata or {},
        headers=headers or {},
    )
    yield encode_tail(manifest, ctx)


def encode_object(
    data: bytes | bytearray | memoryview,
    settings: TransformSettings,
    keyring: KeyRing | None,
    *,
    content_type: str | None = None,
    metadata: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> bytes:
    """The full stored object for data written by a single PUT."""
    return b"".join(
        encode_stream(
            [data], settings, keyring, content_type=content_type, metadata=metadata, headers=headers
        )
    )


def open_object(
    stored: bytes | bytearray | memoryview, keyring: KeyRing | None
) -> tuple[Manifest, ObjectContext]:
    """Decode the tail of a whole stored object and check the data area has the size the manifest says."""
    view = memoryview(stored).cast("B")
    manifest, ctx = decode_tail(view, keyring)
    data_size = len(view) - tail_length(view[-TRAILER_SIZE:])
    if data_size != manifest.data_size:
        raise IntegrityError(f"data area is {data_size} bytes, the manifest says {manifest.data_size}")
    return manifest, ctx


def decode_object(stored: bytes | bytearray | memoryview, keyring: KeyRing | None) -> bytes:
    """The original bytes of a whole stored object, every chunk and every MD5 verified."""
    view = memoryview(stored).cast("B")
    manifest, ctx = open_object(view, keyring)
    decoder = ChunkDecoder(manifest, ctx)
    out = bytearray()
    whole = hashlib.md5(usedforsecurity=False)
    refs = iter(manifest.index)
    for seg in manifest.segments:
        md5 = hashlib.md5(usedforsecurity=False)
        for _ in seg.stored_sizes:
            ref = next(refs)
            chunk = decoder.decode(ref, view[ref.stored_offset : ref.stored_offset + ref.stored_len])
            md5.update(chunk)
            whole.update(chunk)
            out += chunk
        if md5.digest() != seg.md5:
            raise IntegrityError(f"segment {seg.segment_no}: MD5 mismatch")
    if manifest.md5 is not None and whole.digest() != manifest.md5:
        raise IntegrityError("object MD5 mismatch")
    return bytes(out)


def read_range(
    stored: bytes | bytearray | memoryview, keyring: KeyRing | None, first: int, last: int
) -> bytes:
    """Original bytes first..last (inclusive) of a whole stored object, decoding only the chunks involved."""
    view = memoryview(stored).cast("B")
    manifest, ctx = open_object(view, keyring)
    decoder = ChunkDecoder(manifest, ctx)
    span = manifest.index.span(first, last)
    parts = [
        decoder.decode(ref, view[ref.stored_offset : ref.stored_offset + ref.stored_len])
        for ref in span.chunks
    ]
    joined = b"".join(parts)
    start = first - span.original_start
    return joined[start : start + last - first + 1]


def iter_range(
    read: Callable[[int, int], bytes],
    stored_size: int,
    keyring: KeyRing | None,
    first: int = 0,
    last: int | None = None,
) -> Iterator[bytes]:
    """Stream original bytes first..last (inclusive; last None = to the end) of a stored object.

    read(start, end) must return stored bytes start..end-1 (a file, a backend ranged GET ...). Memory is
    the tail plus READ_BATCH chunks.
    """
    if stored_size < TRAILER_SIZE:
        raise IntegrityError("object too short to hold a tsproxy trailer")
    end = read(stored_size - TRAILER_SIZE, stored_size)
    search = find_tail(end, stored_size)
    if search.read_next:
        end = read(stored_size - search.read_next, stored_size)
    manifest, ctx = decode_tail(end, keyring)  # says what is wrong with an end that holds no tail
    tail_len = search.length
    if stored_size - tail_len != manifest.data_size:
        raise IntegrityError(
            f"data area is {stored_size - tail_len} bytes, the manifest says {manifest.data_size}"
        )
    if manifest.size == 0:
        return
    last = manifest.size - 1 if last is None else last
    span = manifest.index.span(first, last)
    decoder = ChunkDecoder(manifest, ctx)
    for b in range(0, len(span.chunks), READ_BATCH):
        batch = span.chunks[b : b + READ_BATCH]
        base = batch[0].stored_offset
        data = memoryview(read(base, batch[-1].stored_offset + batch[-1].stored_len))
        for ref in batch:
            chunk = decoder.decode(
                ref, data[ref.stored_offset - base : ref.stored_offset - base + ref.stored_len]
            )
            lo = max(first - ref.original_offset, 0)
            hi = min(last - ref.original_offset + 1, ref.original_len)
            yield chunk if (lo, hi) == (0, ref.original_len) else chunk[lo:hi]
