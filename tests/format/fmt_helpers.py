"""Shared test data and key rings for the format tests."""

from __future__ import annotations

import hashlib
import random
import struct

from tsproxy.format import KeyRing, ObjectContext, SegmentEncoder, SegmentInfo, TransformSettings
from tsproxy.format.manifest import Manifest, build_manifest, encode_tail

KIB = 1024
DATA_KINDS = ("random", "text", "mixed", "zeros")


def make_data(kind: str, size: int, seed: int) -> bytes:
    """Deterministic test data: incompressible, compressible, a mix of both, or all zeros."""
    rnd = random.Random(seed)
    if kind == "random":
        return rnd.randbytes(size)
    if kind == "zeros":
        return bytes(size)
    if kind == "text":
        return _text(rnd, size)
    out = bytearray()
    while len(out) < size:
        block = rnd.choice((3000, 20000, 70000))
        out += rnd.randbytes(block) if rnd.random() < 0.5 else _text(rnd, block)
    return bytes(out[:size])


def _text(rnd: random.Random, size: int) -> bytes:
    words = [
        b"alpha",
        b"beta",
        b"gamma",
        b"delta",
        b"offset",
        b"topic",
        b"value",
        b"key",
        b"\xc3\xa9t\xc3\xa9",
    ]
    parts: list[bytes] = []
    total = 0
    i = rnd.randrange(1 << 30)
    while total < size:
        line = b'{"id": %d, "name": "%s", "score": %d}\n' % (i, rnd.choice(words), rnd.randrange(1000))
        parts.append(line)
        total += len(line)
        i += 1
    return b"".join(parts)[:size]


def encode_multipart(
    parts: list[tuple[int, bytes]],
    settings: TransformSettings,
    ring: KeyRing | None,
    *,
    ctx: ObjectContext | None = None,
    salts: dict[int, bytes] | None = None,
    metadata: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    content_type: str | None = "application/octet-stream",
) -> tuple[bytes, Manifest]:
    """Encode (segment_no, data) parts as a multipart upload would, concatenated in segment order."""
    ctx = ctx or ObjectContext.new(settings, ring)
    data_area = bytearray()
    infos: list[SegmentInfo] = []
    for segment_no, data in sorted(parts):
        enc = SegmentEncoder(ctx, settings, segment_no, salt=(salts or {}).get(segment_no))
        for piece in enc.feed(data):
            data_area += piece
        for piece in enc.finish():
            data_area += piece
        infos.append(enc.info)
    etag = hashlib.md5(b"".join(i.md5 for i in infos), usedforsecurity=False).hexdigest() + f"-{len(infos)}"
    manifest = build_manifest(
        ctx,
        settings,
        infos,
        etag=etag,
        md5=None,
        content_type=content_type,
        metadata=metadata or {},
        headers=headers or {},
    )
    return bytes(data_area) + encode_tail(manifest, ctx), manifest


def aiven_codec_length(sizes: list[int]) -> int:
    """Encoded length under the base-plus-minimum-bytes codec of Aiven's tiered storage plugin."""
    if not sizes:
        return 4
    if len(sizes) == 1:
        return 8
    leading = sizes[:-1]
    base = min(leading)
    spread = max(leading) - base
    width = 1 if spread <= 0xFF else 2 if spread <= 0xFFFF else 3 if spread <= 0xFFFFFF else 4
    return 4 + 4 + 1 + width * len(leading) + 4


def record_batch_header(base_offset: int, length: int, magic: int, crc: int, attributes: int) -> bytes:
    """The first 23 bytes of a Kafka record batch v2 header, for hand-made non-Kafka look-alikes."""
    return struct.pack(">qiibIh", base_offset, length, 0, magic, crc, attributes)
