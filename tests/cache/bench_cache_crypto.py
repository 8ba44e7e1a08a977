"""Micro-benchmark: what encryption at rest costs the chunk cache (run by hand, not collected by pytest).

    .venv/bin/python tests/cache/bench_cache_crypto.py [chunk MiB] [chunks]

Puts then gets 4 MiB chunks (by default) through a ChunkCache on a temporary directory, once with
CRC32C-checked plain entries and once with AES-256-GCM sealed entries, on one thread, and prints MiB/s
and milliseconds per chunk, wall clock and this thread's CPU time (CPU time is the steadier number on a
busy machine; the difference is the file system).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from tsproxy.cache.chunks import ChunkCache, ChunkKey

MIB = 1 << 20


def run(chunk: int, count: int, key: bytes | None) -> dict[str, float]:
    data = os.urandom(chunk)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as directory:
        cache = ChunkCache(directory, 2 * chunk * count, encryption_key=key)
        keys = [ChunkKey(b"\x07" * 16, 1, n) for n in range(count)]
        wall, cpu = time.perf_counter(), time.thread_time()
        for k in keys:
            cache._put_sync(k, data)
        out["put"], out["put_cpu"] = time.perf_counter() - wall, time.thread_time() - cpu
        wall, cpu = time.perf_counter(), time.thread_time()
        for k in keys:
            assert cache._get_sync(k) is not None
        out["get"], out["get_cpu"] = time.perf_counter() - wall, time.thread_time() - cpu
        cache.close()
    return out


def main() -> None:
    chunk = int(sys.argv[1]) * MIB if len(sys.argv) > 1 else 4 * MIB
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    total = chunk * count / MIB
    run(chunk, 4, None)  # warm up imports and the file system
    print(f"{count} chunks of {chunk // MIB} MiB, one thread")
    for name, key in (("plain + CRC32C", None), ("AES-256-GCM", os.urandom(32))):
        t = run(chunk, count, key)
        print(
            f"{name:15s} put {total / t['put']:6.0f} MiB/s, {t['put'] / count * 1000:5.2f} ms/chunk"
            f" ({t['put_cpu'] / count * 1000:5.2f} CPU)"
            f"   get {total / t['get']:6.0f} MiB/s, {t['get'] / count * 1000:5.2f} ms/chunk"
            f" ({t['get_cpu'] / count * 1000:5.2f} CPU)"
        )


if __name__ == "__main__":
    main()
