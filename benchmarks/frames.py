"""Format 2's frame size: what it costs to store and what a partial read inflates, one size beside another.

A compressed chunk of format 2 is a run of zstd frames of `frame_size` original bytes each, and a read
of part of a chunk inflates only the frames that hold it. Smaller frames mean less inflated for a
consumer's 1 MiB fetch inside a 4 MiB chunk, and more frames (each with its header, and a fresh
compression window) for everything else. For each frame size, on a Kafka-like segment (uncompressed
record batches with JSON-like values, as benchmarks/fetch.py stores) in 4 MiB chunks at the default
level, encrypted, through tsproxy's own encoder and decoder:

- stored: stored bytes per original byte;
- seal_s_per_gib: CPU seconds per GiB to store it (SegmentEncoder, compress and seal);
- open_s_per_gib: CPU seconds per GiB to decode every chunk whole (as a forward reader does);
- part_ms: CPU milliseconds to decode a 1 MiB range at a random batch start inside a chunk, the
  mean over `--parts` ranges (as a seeking consumer's read does: the whole chunk verified, its
  frames holding the range inflated).

Each figure is the best of `--repeat` runs; ratios are against the first frame size given.

    .venv/bin/python benchmarks/frames.py [--size 64] [--frame-sizes 1024,512,256,128] [--json out.json]
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from typing import Any

from common import best_of, markdown, write_json
from fetch_support import MIB, build_segment

from tsproxy import defaults
from tsproxy.format import (
    ChunkDecoder,
    KeyRing,
    ObjectContext,
    SegmentEncoder,
    TransformSettings,
    build_manifest,
)

KIB = 1024
GIB = 1 << 30


def measure(
    data: bytes, positions: Sequence[int], frame_size: int, parts: int, repeat: int
) -> dict[str, Any]:
    settings = TransformSettings(compression="on", encryption=True, frame_size=frame_size)
    ring = KeyRing.new(key_id="frames-bench")
    ctx = ObjectContext.new(settings, ring)

    def seal() -> tuple[list[bytes], Any]:
        encoder = SegmentEncoder(ctx, settings, 1)
        view = memoryview(data)
        out: list[bytes] = []
        for pos in range(0, len(data), MIB):  # fed 1 MiB at a time, as the server receives
            out += encoder.feed(view[pos : pos + MIB])
        out += encoder.finish()
        return out, encoder.info

    seal_s = best_of(repeat, seal)
    chunks, info = seal()
    manifest = build_manifest(
        ctx, settings, [info], etag=info.md5.hex(), md5=info.md5, content_type=None, metadata={}, headers={}
    )
    decoder = ChunkDecoder(manifest, ctx)
    refs = list(manifest.index)

    def open_all() -> None:
        for ref, chunk in zip(refs, chunks, strict=True):
            decoder.decode(ref, chunk)

    rng = random.Random(5)
    size = settings.chunk_size
    ranges: list[tuple[int, int]] = []
    while len(ranges) < parts:
        start = rng.choice(positions)
        i = start // size
        if i < len(refs) and start - i * size + MIB <= refs[i].original_len:  # inside one chunk
            ranges.append((i, start - i * size))

    def read_parts() -> None:
        for i, offset in ranges:
            decoder.decode_range(refs[i], chunks[i], offset, offset + MIB)

    gib = len(data) / GIB
    return {
        "frame_kib": frame_size // KIB,
        "stored": sum(len(c) for c in chunks) / len(data),
        "seal_s_per_gib": seal_s / gib,
        "open_s_per_gib": best_of(repeat, open_all) / gib,
        "part_ms": best_of(repeat, read_parts) / parts * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=64, help="segment size in MiB (default 64)")
    ap.add_argument("--frame-sizes", default="1024,512,256,128", help="frame sizes in KiB, comma-separated")
    ap.add_argument("--parts", type=int, default=200, help="1 MiB ranges decoded per run (default 200)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the rows here as a JSON list")
    args = ap.parse_args(argv)
    segment = build_segment(args.size * MIB)
    rows = [
        measure(segment.data, segment.positions, int(kib) * KIB, args.parts, args.repeat)
        for kib in args.frame_sizes.split(",")
    ]
    first = rows[0]
    for row in rows:
        for name in ("seal_s_per_gib", "open_s_per_gib", "part_ms"):
            row[f"{name}_vs_first"] = row[name] / first[name]
    chunk_mib, level = defaults.CHUNK_SIZE // MIB, defaults.COMPRESSION_LEVEL
    print(
        f"\nFormat 2 frame sizes: {args.size} MiB Kafka-like segment, {chunk_mib} MiB chunks, zstd level "
        f"{level}, AES-256-GCM; ratios against {first['frame_kib']} KiB frames\n"
    )
    columns: tuple[str, ...] = ("frame_kib", "stored", "seal_s_per_gib", "open_s_per_gib", "part_ms")
    columns += tuple(f"{c}_vs_first" for c in columns[2:])
    print(markdown(rows, columns))
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
