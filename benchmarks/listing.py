"""Listing through tsproxy against SeaweedFS' own listing of the same keys, cold and warm.

A listing must report original sizes and ETags, which the backend's listing does not know. This writes
N small objects through one tsproxy process (the "writer" instance), stops it, starts a fresh tsproxy on
an empty cache (another instance, as after a reschedule) and lists the bucket through it with boto3's
ListObjectsV2 paginator, twice: cold, then warm. The same keys are listed straight from SeaweedFS as the
baseline. Every size tsproxy lists is checked against what was written.

Backend requests are tsproxy's own counters (`tsproxy_backend_requests_total`, all operations) for
tsproxy, and the number of list pages for SeaweedFS.

    .venv/bin/python benchmarks/listing.py [--counts 2000,100000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import ROOT, start_seaweed
from fetch_support import DirectSystem, LeanS3, TsproxySystem, boto3_client, lean_client

sys.path.insert(0, str(ROOT))
from tests.support.seaweed import SeaweedFS

WRITERS = 16


def backend_requests(system: TsproxySystem) -> float:
    """tsproxy's count of requests it sent to the backend, all operations and outcomes."""
    url = f"http://127.0.0.1:{system.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("tsproxy_backend_requests_total{")
    )


def write_objects(system: TsproxySystem, count: int, seed: int = 3) -> dict[str, int]:
    """`count` objects of 100 B to 4 KiB under Kafka-like keys, written by WRITERS threads at once."""
    rng = random.Random(seed)
    sizes = {
        f"topic-{i % 7}/{i % 12}/{i:020d}-{rng.getrandbits(40):010x}.log": rng.randrange(100, 4096)
        for i in range(count)
    }
    client = lean_client(system)

    def put(item: tuple[str, int]) -> None:
        key, size = item
        status, _, body = client.request("PUT", LeanS3.path(system.bucket, key), body=os.urandom(size))
        if status != 200:
            raise RuntimeError(f"PUT {key}: {status} {body[:200]!r}")

    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(put, sizes.items()))
    return sizes


def list_all(client: Any, bucket: str) -> tuple[dict[str, int], int, float]:
    """Every key with its size, the number of pages, and the seconds it took."""
    started = time.perf_counter()
    sizes: dict[str, int] = {}
    pages = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        pages += 1
        for entry in page.get("Contents", []):
            sizes[entry["Key"]] = entry["Size"]
    return sizes, pages, time.perf_counter() - started


def run(weed: SeaweedFS, count: int, workdir: Path) -> list[dict[str, Any]]:
    bucket = f"list-{count}"
    writer = TsproxySystem(weed, bucket, workdir / f"writer-{count}")
    try:
        started = time.perf_counter()
        written = write_objects(writer, count)
        print(f"  wrote {count} objects in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    finally:
        writer.stop()  # a clean stop: whatever the writer buffered for listings reaches the backend
    rows: list[dict[str, Any]] = []
    direct = DirectSystem(weed, bucket, create=False)  # the bucket exists already: only list it
    raw, pages, seconds = list_all(boto3_client(direct), bucket)
    visible = {k: v for k, v in raw.items() if not k.startswith(".tsproxy/")}
    assert visible.keys() == written.keys(), "the backend does not list what was written"
    rows.append(
        {
            "objects": count,
            "system": "direct",
            "scenario": "list",
            "seconds": seconds,
            "backend_requests": pages,
        }
    )
    # Another instance with the writer's key ring and an empty cache, over the writer's bucket.
    reader = TsproxySystem(weed, bucket, workdir / f"reader-{count}", writer.chunk_size, ring=writer.ring)
    try:
        client = boto3_client(reader)
        for scenario in ("cold", "warm"):
            before = backend_requests(reader)
            listed, _, seconds = list_all(client, bucket)
            wrong = sum(1 for k, size in written.items() if listed.get(k) != size)
            if wrong or len(listed) != count:
                raise RuntimeError(f"{scenario}: {wrong} sizes wrong, {len(listed)} of {count} keys listed")
            rows.append(
                {
                    "objects": count,
                    "system": "tsproxy",
                    "scenario": scenario,
                    "seconds": seconds,
                    "backend_requests": backend_requests(reader) - before,
                }
            )
    finally:
        reader.stop()
    base = rows[0]["seconds"]
    for row in rows:
        row["vs_direct"] = row["seconds"] / base
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", default="2000,100000", help="object counts, comma-separated")
    ap.add_argument("--json", help="write the rows here as a JSON list")
    args = ap.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",") if c]
    load_before = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tsp-list-") as tmp:
        weed = start_seaweed()
        try:
            for count in counts:
                print(f"{count} objects:", file=sys.stderr)
                rows += run(weed, count, Path(tmp))
        finally:
            weed.stop()
    print(
        f"\nListing ({os.cpu_count()} CPUs, 1-minute load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after)\n"
    )
    print("| objects | system | scenario | seconds | vs direct | backend requests |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['objects']} | {r['system']} | {r['scenario']} | {r['seconds']:.3f} | "
            f"{r['vs_direct']:.2f} | {r['backend_requests']:.0f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
