"""Throughput of the store and read paths of the stored format, beside the bare library limit.

For each data set (Kafka-like uncompressed record batches, random bytes), chunk size and mode
(compression off/auto/on x encryption on/off) it measures:

* store: SegmentEncoder fed 1 MiB at a time (as the server does) plus manifest and tail;
* read: ChunkDecoder over every chunk of the stored object;
* bare: the same primitives with no format around them, in the same run -- zstd alone (level 3, per
  chunk), AES-256-GCM alone (over what the store path seals), MD5 alone, CRC32C alone -- and the
  sum of the times of those the mode uses. efficiency = bare time / store time.

It also compares the chunk index's size with the base-plus-minimum-bytes codec of Aiven's tiered
storage plugin (implemented here for comparison only). Data sets repeat an 8 MiB unique block, far
beyond zstd level 3's 2 MiB window, so repetition does not flatter compression.

    python benchmarks/transform.py [--size 64MiB] [--chunk-sizes 256KiB,1MiB,4MiB,16MiB] [--json PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import zstandard
from awscrt.checksums import crc32c
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tsproxy.format import (
    ChunkDecoder,
    KeyRing,
    ObjectContext,
    SegmentEncoder,
    TransformSettings,
    build_manifest,
    encode_tail,
)
from tsproxy.format.index import encode_sizes

MIB = 1 << 20
FEED = 1 * MIB
UNIQUE = 8 * MIB
MODES = [(c, e) for e in (True, False) for c in ("off", "auto", "on")]


def parse_size(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": MIB, "mib": MIB, "g": 1 << 30, "gib": 1 << 30}
    t = text.strip().lower()
    digits = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    return int(float(digits) * units[t[len(digits) :]])


def kafka_like(size: int) -> bytes:
    """Uncompressed record batches v2 with JSON values, built by kafka-python's record builder."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    rnd = random.Random(42)
    events = (b"click", b"view", b"purchase", b"refund", b"login")
    block = bytearray()
    n = 0
    while len(block) < min(size, UNIQUE):
        builder = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=DefaultRecordBatchBuilder.CODEC_NONE,
            is_transactional=False,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            batch_size=1 << 20,
        )
        for i in range(500):
            value = b'{"user": "u%d", "event": "%s", "amount": %d.%02d, "session": "%x"}' % (
                rnd.randrange(10**6),
                rnd.choice(events),
                rnd.randrange(1000),
                rnd.randrange(100),
                rnd.getrandbits(48),
            )
            builder.append(
                i, timestamp=1_700_000_000_000 + n, key=b"%d" % (n % 1000), value=value, headers=[]
            )
            n += 1
        block += builder.build()
    return _tile(bytes(block), size)


def random_data(size: int) -> bytes:
    return _tile(os.urandom(min(size, UNIQUE)), size)


def _tile(block: bytes, size: int) -> bytes:
    return (block * (size // len(block) + 1))[:size]


def best_time(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def chunks_of(data: bytes, chunk: int) -> list[memoryview]:
    view = memoryview(data)
    return [view[i : i + chunk] for i in range(0, len(data), chunk)]


def store(data: bytes, cfg: TransformSettings, ring: KeyRing, keep: bool) -> tuple[list[bytes], bytes, Any]:
    """Run the store path; stored chunks are dropped as they come (as a server sends them) unless keep."""
    ctx = ObjectContext.new(cfg, ring)
    enc = SegmentEncoder(ctx, cfg)
    view = memoryview(data)
    out: list[bytes] = []
    for i in range(0, len(data), FEED):
        done = enc.feed(view[i : i + FEED])
        if keep:
            out += done
    out += enc.finish()
    manifest = build_manifest(
        ctx,
        cfg,
        [enc.info],
        etag=enc.info.md5.hex(),
        md5=enc.info.md5,
        content_type=None,
        metadata={},
        headers={},
    )
    return out, encode_tail(manifest, ctx), (manifest, ctx)


def read(stored: list[bytes], manifest: Any, ctx: ObjectContext) -> int:
    decoder = ChunkDecoder(manifest, ctx)
    total = 0
    for ref, chunk in zip(manifest.index, stored, strict=True):
        total += len(decoder.decode(ref, chunk))
    return total


def aiven_codec_length(sizes: Sequence[int]) -> int:
    """Length under Aiven's ChunkSizesBinaryCodec: count, base, width, values minus base, last in full."""
    if not sizes:
        return 4
    if len(sizes) == 1:
        return 8
    leading = sizes[:-1]
    spread = max(leading) - min(leading)
    width = 1 if spread <= 0xFF else 2 if spread <= 0xFFFF else 3 if spread <= 0xFFFFFF else 4
    return 13 + width * len(leading)


def bare(data: bytes, chunk: int, level: int, repeat: int) -> dict[str, float]:
    """Seconds each primitive takes alone over the data cut in chunks."""
    pieces = chunks_of(data, chunk)
    cctx = zstandard.ZstdCompressor(level=level, write_checksum=False)
    payloads: list[bytes | memoryview] = []

    def zstd_alone() -> None:
        payloads.clear()
        for p in pieces:
            c = cctx.compress(p)
            payloads.append(c if len(c) < len(p) else p)

    aead = AESGCM(os.urandom(32))
    nonce = os.urandom(12)

    def each(fn: Callable[[Any], object], items: Sequence[Any]) -> Callable[[], None]:
        def loop() -> None:
            for item in items:
                fn(item)  # result dropped at once, as the store path's caller does

        return loop

    t_zstd = best_time(zstd_alone, repeat)
    return {
        "zstd": t_zstd,
        "aes_gcm_raw": best_time(each(lambda p: aead.encrypt(nonce, p, b""), pieces), repeat),
        "aes_gcm_compressed": best_time(each(lambda p: aead.encrypt(nonce, p, b""), payloads), repeat),
        "md5": best_time(lambda: hashlib.md5(data, usedforsecurity=False).digest(), repeat),
        "crc32c_raw": best_time(each(crc32c, pieces), repeat),
        "crc32c_compressed": best_time(each(crc32c, payloads), repeat),
    }


def bare_limit(times: dict[str, float], compressed: bool, encryption: bool) -> float:
    """Sum of the times of the primitives a mode runs (compression attempted or not)."""
    total = times["md5"]
    suffix = "compressed" if compressed else "raw"
    if compressed:
        total += times["zstd"]
    total += times[f"aes_gcm_{suffix}"] if encryption else times[f"crc32c_{suffix}"]
    return total


def run(size: int, chunk_sizes: list[int], repeat: int, datasets: list[str]) -> dict[str, Any]:
    ring = KeyRing.new(key_id="bench")
    results: dict[str, Any] = {
        "size": size,
        "repeat": repeat,
        "zstd": zstandard.ZSTD_VERSION,
        "rows": [],
        "index": [],
    }
    makers = {"kafka": kafka_like, "random": random_data}
    for name in datasets:
        data = makers[name](size)
        for chunk in chunk_sizes:
            times = bare(data, chunk, 3, repeat)
            mib = size / MIB
            for compression, encryption in MODES:
                cfg = TransformSettings(chunk_size=chunk, compression=compression, encryption=encryption)  # type: ignore[arg-type]
                row, sizes = measure(name, data, cfg, ring, times, repeat)
                results["rows"].append(row)
                if compression == "on" and encryption:
                    results["index"].append(_index_row(name, chunk, sizes))
            results.setdefault("bare", []).append(
                {"data": name, "chunk_size": chunk, **{k: mib / v for k, v in times.items()}}
            )
    # A long compressed sequence like the plugin's own example: 2000 chunks of 1 MiB + up to 300 bytes.
    rnd = random.Random(7)
    synthetic = [MIB + rnd.randrange(300) for _ in range(2000)] + [12345]
    results["index"].append(_index_row("synthetic 1MiB+rand(300)", MIB, synthetic))
    return results


def measure(
    name: str, data: bytes, cfg: TransformSettings, ring: KeyRing, times: dict[str, float], repeat: int
) -> tuple[dict[str, Any], list[int]]:
    """One table row: store and read MiB/s of one mode, and its efficiency against the bare limit."""
    t_store = best_time(lambda: store(data, cfg, ring, keep=False), repeat)
    chunks, tail, (manifest, ctx) = store(data, cfg, ring, keep=True)
    t_read = best_time(lambda: read(chunks, manifest, ctx), repeat)
    info = manifest.segments[0]
    limit = bare_limit(times, info.compressed, cfg.encryption)
    mib = len(data) / MIB
    row = {
        "data": name,
        "chunk_size": cfg.chunk_size,
        "compression": cfg.compression,
        "encryption": cfg.encryption,
        "compressed": info.compressed,
        "store_mib_s": mib / t_store,
        "read_mib_s": mib / t_read,
        "bare_mib_s": mib / limit,
        "efficiency": limit / t_store,
        "stored_ratio": (sum(map(len, chunks)) + len(tail)) / len(data),
        "tail_bytes": len(tail),
    }
    return row, list(info.stored_sizes)


def _index_row(name: str, chunk: int, sizes: list[int]) -> dict[str, Any]:
    ours = len(encode_sizes(sizes))
    theirs = aiven_codec_length(sizes)
    n = max(len(sizes), 1)
    return {
        "data": name,
        "chunk_size": chunk,
        "chunks": len(sizes),
        "bytes": ours,
        "reference_bytes": theirs,
        "bytes_per_chunk": ours / n,
        "reference_bytes_per_chunk": theirs / n,
    }


def human(n: int) -> str:
    return f"{n // MIB}MiB" if n >= MIB else f"{n // 1024}KiB"


def print_table(results: dict[str, Any]) -> None:
    print(f"data size {human(results['size'])}, best of {results['repeat']}, libzstd {results['zstd']}")
    print()
    print("bare library limits, MiB/s of original bytes")
    print(f"{'data':8} {'chunk':>6} {'zstd':>8} {'aes-gcm':>8} {'md5':>8} {'crc32c':>8}")
    for b in results["bare"]:
        print(
            f"{b['data']:8} {human(b['chunk_size']):>6} {b['zstd']:8.0f} {b['aes_gcm_raw']:8.0f} "
            f"{b['md5']:8.0f} {b['crc32c_raw']:8.0f}"
        )
    print()
    print("store and read paths, MiB/s of original bytes; efficiency = bare sum-of-times / store time")
    print(
        f"{'data':8} {'chunk':>6} {'comp':>5} {'enc':>4} {'store':>8} {'bare':>8} {'effic.':>7} {'read':>8} "
        f"{'ratio':>7}"
    )
    for r in results["rows"]:
        print(
            f"{r['data']:8} {human(r['chunk_size']):>6} {r['compression']:>5} "
            f"{'yes' if r['encryption'] else 'no':>4} {r['store_mib_s']:8.0f} {r['bare_mib_s']:8.0f} "
            f"{r['efficiency']:7.0%} {r['read_mib_s']:8.0f} {r['stored_ratio']:7.3f}"
        )
    print()
    print("chunk index size (compression on), ours vs base + minimum bytes per value")
    print(
        f"{'data':26} {'chunk':>6} {'chunks':>7} {'bytes':>7} {'ref':>7} {'B/chunk':>8} {'ref B/chunk':>12}"
    )
    for i in results["index"]:
        print(
            f"{i['data']:26} {human(i['chunk_size']):>6} {i['chunks']:7} {i['bytes']:7} "
            f"{i['reference_bytes']:7} {i['bytes_per_chunk']:8.2f} {i['reference_bytes_per_chunk']:12.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size", default="64MiB", help="bytes per data set (default 64MiB)")
    parser.add_argument("--chunk-sizes", default="256KiB,1MiB,4MiB,16MiB", help="comma-separated chunk sizes")
    parser.add_argument("--data", default="kafka,random", help="data sets: kafka, random")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs (default 3)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    results = run(
        parse_size(args.size),
        [parse_size(c) for c in args.chunk_sizes.split(",")],
        args.repeat,
        args.data.split(","),
    )
    print_table(results)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
