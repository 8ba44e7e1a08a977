"""Upload and ranged-read throughput and latency through tsproxy beside direct access to the same
SeaweedFS, in one run; peak RSS of the tsproxy process during a large upload and during 32 parallel
ranged readers, and its RSS once it has been quiet for a while after the large upload (`idle_rss_mib`:
tsproxy runs with `malloc_idle_release` at IDLE_RELEASE, and the script waits twice that).

    .venv/bin/python benchmarks/proxy.py [--size-mib 256] [--rss-upload-mib 1024] [--json out.json]
        [--setting memory_cache_size=64MiB] [--data segment|json-lines]

The data (an 8 MiB block, repeated): by default a segment of Kafka record batches with JSON values, as
benchmarks/fetch.py stores. `json-lines` is JSON records one per line with no batch framing: it
compresses a little better, so a 25 MiB part becomes less than the backend's 5 MiB minimum part size and
takes tsproxy's small-part path (held until the completion), the worst case for tsproxy's memory. It is
also what SeaweedFS itself stores gzipped (text-like chunks), inflating a whole stored chunk for every
ranged GET: direct's 1 MiB GETs take 27 ms at p50 with it against 6.4 ms with the segment (this script's
own rows), so direct's read figures with it are those of SeaweedFS's gzip, not of its S3 path.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig
from common import (
    MIB,
    Generated,
    Seaweed,
    TsproxyProcess,
    add_setting_option,
    kafka_like,
    median,
    percentile,
    print_table,
    settings_of,
    write_json,
)
from fetch_support import build_segment

IDLE_RELEASE = 2.0  # seconds; the default of 10 s would only make the script wait longer
TRANSFER = TransferConfig(multipart_threshold=25 * MIB, multipart_chunksize=25 * MIB, max_concurrency=4)


def upload(client: Any, bucket: str, key: str, block: bytes, size: int) -> float:
    start = time.perf_counter()
    client.upload_fileobj(Generated(block, size), bucket, key, Config=TRANSFER)
    return time.perf_counter() - start


def sequential_reads(client: Any, bucket: str, key: str, size: int, step: int, limit: int) -> list[float]:
    latencies = []
    for pos in range(0, min(size, limit), step):
        start = time.perf_counter()
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={pos}-{min(pos + step, size) - 1}")[
            "Body"
        ].read()
        latencies.append(time.perf_counter() - start)
        assert len(body) == min(step, size - pos)
    return latencies


def parallel_random_reads(
    client: Any, bucket: str, key: str, size: int, readers: int, per_reader: int
) -> tuple[float, list[float]]:
    def reader(seed: int) -> list[float]:
        rng = random.Random(seed)
        out = []
        for _ in range(per_reader):
            pos = rng.randrange(0, size - MIB)
            start = time.perf_counter()
            client.get_object(Bucket=bucket, Key=key, Range=f"bytes={pos}-{pos + MIB - 1}")["Body"].read()
            out.append(time.perf_counter() - start)
        return out

    start = time.perf_counter()
    with ThreadPoolExecutor(readers) as pool:
        results = list(pool.map(reader, range(readers)))
    return time.perf_counter() - start, [x for r in results for x in r]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size-mib", type=int, default=256, help="object size for the throughput runs")
    ap.add_argument("--rss-upload-mib", type=int, default=1024, help="upload size for the peak-RSS run")
    ap.add_argument("--readers", type=int, default=32)
    ap.add_argument("--reads-per-reader", type=int, default=8)
    ap.add_argument(
        "--data",
        choices=("segment", "json-lines"),
        default="segment",
        help="what is uploaded (see the module docstring; default: segment)",
    )
    ap.add_argument("--json", help="write the results here")
    add_setting_option(ap, "memory_cache_size=64MiB")
    args = ap.parse_args()
    settings = {"cache_size": "2GiB", **settings_of(ap, args)}
    settings.setdefault("malloc_idle_release", f"{IDLE_RELEASE}s")
    size = args.size_mib * MIB
    block = build_segment(8 * MIB).data if args.data == "segment" else kafka_like(8 * MIB)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tsproxy-bench-") as tmp:
        weed = Seaweed(Path(tmp) / "weed")
        proxy = TsproxyProcess(
            Path(tmp) / "proxy",
            weed.endpoint,
            (weed.access_key, weed.secret_key),
            **settings,
        )
        try:
            systems = {"direct": weed.client(), "tsproxy": proxy.client()}
            systems["direct"].create_bucket(Bucket="bench-direct")
            systems["tsproxy"].create_bucket(Bucket="bench-proxy")
            buckets = {"direct": "bench-direct", "tsproxy": "bench-proxy"}
            for name, client in systems.items():
                bucket = buckets[name]
                seconds = upload(client, bucket, "seg", block, size)
                rows.append({"system": name, "scenario": "upload", "mib_s": args.size_mib / seconds})
                lat = sequential_reads(client, bucket, "seg", size, MIB, size)
                rows.append(
                    {
                        "system": name,
                        "scenario": "sequential 1MiB (cold)",
                        "mib_s": len(lat) / sum(lat),
                        "p50_ms": median(lat) * 1000,
                        "p99_ms": percentile(lat, 0.99) * 1000,
                    }
                )
                lat = sequential_reads(client, bucket, "seg", size, MIB, size)
                rows.append(
                    {
                        "system": name,
                        "scenario": "sequential 1MiB (again)",
                        "mib_s": len(lat) / sum(lat),
                        "p50_ms": median(lat) * 1000,
                        "p99_ms": percentile(lat, 0.99) * 1000,
                    }
                )
                if name == "tsproxy":
                    proxy.reset_peak_rss()
                wall, lat = parallel_random_reads(
                    client, bucket, "seg", size, args.readers, args.reads_per_reader
                )
                row = {
                    "system": name,
                    "scenario": f"{args.readers} parallel random 1MiB",
                    "mib_s": len(lat) / wall,
                    "p50_ms": median(lat) * 1000,
                    "p99_ms": percentile(lat, 0.99) * 1000,
                }
                if name == "tsproxy":
                    row["peak_rss_mib"] = proxy.peak_rss_mib()
                rows.append(row)
            proxy.reset_peak_rss()
            seconds = upload(systems["tsproxy"], "bench-proxy", "big", block, args.rss_upload_mib * MIB)
            rows.append(
                {
                    "system": "tsproxy",
                    "scenario": f"upload {args.rss_upload_mib} MiB",
                    "mib_s": args.rss_upload_mib / seconds,
                    "peak_rss_mib": proxy.peak_rss_mib(),
                }
            )
            busy = proxy.rss_mib()
            time.sleep(2 * IDLE_RELEASE)
            rows[-1].update(rss_at_end_mib=busy, idle_rss_mib=proxy.rss_mib())
        finally:
            proxy.stop()
            weed.stop()
    by = {(r["system"], r["scenario"]): r for r in rows}
    for r in rows:
        direct = by.get(("direct", r["scenario"]))
        if r["system"] == "tsproxy" and direct:
            r["vs_direct"] = r["mib_s"] / direct["mib_s"]
    print(f"data: {args.data}" + (", tsproxy settings: " + ", ".join(args.setting) if args.setting else ""))
    columns = ["system", "scenario", "mib_s", "p50_ms", "p99_ms", "vs_direct", "peak_rss_mib"]
    print_table(rows, [*columns, "rss_at_end_mib", "idle_rss_mib"])
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
