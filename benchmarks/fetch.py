"""The Kafka fetch pattern on tiered segments: tsproxy, direct SeaweedFS and `rclone serve s3`, side by side.

A consumer that lags past local retention makes the broker read old segments from the object store:
from a start position to the segment's end, about 1 MiB per fetch, or (Aiven's plugin) one 4 MiB chunk
at a time. This runs those patterns on one segment of uncompressed record batches with JSON-like values
against three S3 endpoints over the same SeaweedFS:

- tsproxy: its own process, default settings (4 MiB chunks, 16 MiB prefetch, compression auto,
  encryption on);
- direct: SeaweedFS itself;
- rclone: `rclone serve s3 --vfs-cache-mode full` over a zstd `compress` remote over a `crypt` remote.

Scenarios, per system: a multipart upload in 25 MiB parts sent one after another (as a broker's remote
storage plugin does), the same with 4 parts in flight (as the aws cli does), the segment's first
64 MiB as four PutObjects one after another (under four keys);
sequential 1 MiB fetches from offset 0 to the end on an empty cache ("cold": tsproxy and rclone
restarted on a new cache directory), then the same again ("warm"); sequential 4 MiB chunk reads, cold;
random 1 MiB fetches, cold. A fetch
starts at a record batch, as a broker's does, so fetches overlap by a partial batch and cross chunk
boundaries anywhere. Requests are signed and sent by a lean client (fetch_support.LeanS3) so that the
client's own cost stays small beside the servers', or with `--client boto3` by boto3 as applications
send them (its own CPU per request then counts for every system alike); every body read is checked
against the segment. `first_ms` is the latency of a scenario's first request (on a cold read, the one
that finds the object and starts its read-ahead).
Backend figures are SeaweedFS' own counters for the system's bucket: GET requests (HEADs count as GETs
there) per MiB the client read, and body bytes SeaweedFS sent (received, for the upload) per client byte.
The machine's load average is printed with the table: other processes move every figure.

    .venv/bin/python benchmarks/fetch.py [--size 256] [--systems tsproxy,direct,rclone] [--json out.json]
        [--scenarios chunks,random] [--chunk-size 1MiB] [--client lean|boto3]
        [--setting prefetch=32MiB --setting memory_cache_size=64MiB]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import SEAWEED_VOLUME_MB, add_setting_option, markdown, settings_of, start_seaweed
from fetch_support import (
    CLIENTS,
    MIB,
    SCENARIOS,
    SYSTEMS,
    DirectSystem,
    RcloneSystem,
    System,
    TsproxySystem,
    build_segment,
    check_goals,
    parse_scenarios,
    run_system,
    started,
)

COLUMNS = (
    "system",
    "scenario",
    "mib_s",
    "vs_direct",
    "p50_ms",
    "p99_ms",
    "first_ms",
    "backend_gets_per_mib",
    "backend_bytes_ratio",
    "backend_requests",
)
# Where a Kafka broker with Aiven's plugin would put the segment (topic "clicks", partition 0).
SEGMENT_KEY = "clicks-AAAAAAAAAAAAAAAAAAAAAA/0/00000000000000000000-BBBBBBBBBBBBBBBBBBBBBB.log"


def parse_systems(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"systems are a comma-separated subset of {','.join(SYSTEMS)}")
    return names


def parse_scenario_list(text: str) -> list[str]:
    try:
        return parse_scenarios(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=256, help="segment size in MiB (default 256)")
    ap.add_argument("--systems", type=parse_systems, default=list(SYSTEMS), help="default: all three")
    ap.add_argument(
        "--random-reads", type=int, default=0, help="random 1 MiB fetches (default: half the size in MiB)"
    )
    ap.add_argument(
        "--scenarios",
        type=parse_scenario_list,
        default=list(SCENARIOS),
        help='comma-separated, by name or unique prefix ("chunks,random"), or "reads"; default: all',
    )
    ap.add_argument("--chunk-size", help="tsproxy's chunk size for the objects it writes (default: its own)")
    ap.add_argument(
        "--producer-codec",
        choices=("none", "gzip", "snappy", "lz4", "zstd"),
        default="none",
        help="the segment's batches compressed by their producer (tsproxy then stores them uncompressed)",
    )
    ap.add_argument(
        "--client",
        choices=CLIENTS,
        default="lean",
        help="who sends the scenarios' requests: LeanS3 (default) or boto3, as applications do",
    )
    add_setting_option(ap, "prefetch=32MiB")
    ap.add_argument(
        "--seaweed-volume-mb",
        type=int,
        default=SEAWEED_VOLUME_MB,
        help=f"SeaweedFS's volume size in MB (default {SEAWEED_VOLUME_MB}; the test suite's 16 shows its "
        "waits for new volumes)",
    )
    ap.add_argument("--json", help="write the rows here as a JSON list")
    ap.add_argument(
        "--workdir",
        type=Path,
        help="keep the systems' logs, configs and caches here (default: a temporary dir)",
    )
    args = ap.parse_args(argv)
    if args.size < 2:
        ap.error("--size must be at least 2 (MiB)")
    settings = settings_of(ap, args)
    random_count = args.random_reads or max(8, args.size // 2)

    # Other processes on the machine move every figure: say how busy it was.
    load_before = os.getloadavg()[0]
    started_at = time.perf_counter()
    codec = ("none", "gzip", "snappy", "lz4", "zstd").index(args.producer_codec)
    segment = build_segment(args.size * MIB, codec=codec)
    print(
        f"segment: {segment.size / MIB:.1f} MiB, {len(segment.positions)} batches "
        f"(built in {time.perf_counter() - started_at:.0f}s)",
        file=sys.stderr,
    )
    rows: list[dict[str, Any]] = []

    def report(row: dict[str, Any]) -> None:
        rows.append(row)
        print(f"  {row['system']:8} {row['scenario']:17} {row['mib_s']:9.1f} MiB/s", file=sys.stderr)

    with contextlib.ExitStack() as stack:
        tmp = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tsp-fetch-")))
        weed = start_seaweed(args.seaweed_volume_mb)
        try:
            factories: dict[str, Any] = {
                "tsproxy": lambda: TsproxySystem(
                    weed, "fetch-tsproxy", tmp / "tsproxy", args.chunk_size, settings=settings
                ),
                "direct": lambda: DirectSystem(weed, "fetch-direct"),
                "rclone": lambda: RcloneSystem(weed, "fetch", "fetch-rclone", tmp / "rclone"),
            }
            for name in args.systems:
                print(f"{name}:", file=sys.stderr)
                system: System
                with started(factories[name]) as system:
                    run_system(
                        system, weed, segment, SEGMENT_KEY, random_count, report, args.scenarios, args.client
                    )
        finally:
            weed.stop()

    load_after = os.getloadavg()[0]
    order = {s: i for i, s in enumerate(SCENARIOS)}
    rows.sort(key=lambda r: (order[r["scenario"]], SYSTEMS.index(r["system"])))
    print(
        f"\nKafka fetch pattern, {segment.size / MIB:.0f} MiB segment ({args.producer_codec} batches), "
        f"{random_count} random fetches, "
        f"{args.client} client ({os.cpu_count()} CPUs, 1-minute load average {load_before:.1f} before, "
        f"{load_after:.1f} after)\n"
    )
    if settings:
        print("tsproxy settings: " + ", ".join(f"{k} = {v}" for k, v in settings.items()) + "\n")
    direct = {r["scenario"]: r["mib_s"] for r in rows if r["system"] == "direct"}
    for r in rows:
        r["vs_direct"] = r["mib_s"] / direct[r["scenario"]] if direct.get(r["scenario"]) else None
    print(markdown(rows, COLUMNS))
    print("\nGoals:")
    for goal in check_goals(rows):
        print("  " + goal.line())
    if args.json:
        clean = [
            {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in rows
        ]
        Path(args.json).write_text(json.dumps(clean, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
