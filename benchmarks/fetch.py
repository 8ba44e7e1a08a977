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

A second table says who spent the CPU, in seconds per GiB of client bytes: the benchmark's own process
(the client), the system's process (tsproxy or rclone; none for direct), SeaweedFS, and every core of the
machine over the same span (those, the kernel's network work for them, and anything else running). When
the client, the system and SeaweedFS keep every core busy between them, as uploads with several parts in
flight do on two cores, throughput is bound by the machine's CPU per GiB, and `cpu_machine_vs_direct`
says how far a system's ratio to direct can go there.

On a small machine one run's ratios move by a tenth or more from run to run. `--rounds N` runs every
system's scenarios N times, the systems taking turns (in reverse order every other round) so that a
quieter or busier spell of the machine falls on both: the table then shows each figure's median over
the rounds, the ratio to direct as the median of each round's ratio (tsproxy's figure over that round's
direct one) with their range, and the goals are checked on those medians. `--json` writes every round's
rows, each with its `round`.

    .venv/bin/python benchmarks/fetch.py [--size 256] [--systems tsproxy,direct,rclone] [--json out.json]
        [--scenarios chunks,random] [--chunk-size 1MiB] [--client lean|boto3]
        [--setting prefetch=32MiB --setting memory_cache_size=64MiB] [--rounds 5]
        [--latency 30 --jitter 3 --bandwidth 20]

With `--latency`/`--bandwidth`, toxiproxy sits between each system and SeaweedFS (one link per system, the
same network on each): the store then answers as a remote one does. benchmarks/network.py runs a matrix
of such networks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import SEAWEED_VOLUME_MB, add_setting_option, markdown, settings_of, start_seaweed
from fetch_support import (
    CLIENTS,
    CPU_COLUMNS,
    MIB,
    SCENARIOS,
    SYSTEMS,
    DirectSystem,
    Goal,
    Network,
    RcloneSystem,
    Segment,
    System,
    TsproxySystem,
    build_segment,
    check_goals,
    parse_scenarios,
    run_system,
    shape_links,
    started,
    store_links,
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
# Who spent the CPU, in seconds per GiB of client bytes (fetch_support.CpuUse); the last column is the
# machine's CPU against direct's in the same round. On a machine whose cores the client, the system and
# SeaweedFS saturate together, throughput goes as the inverse of cpu_machine.
CPU_TABLE = ("system", "scenario", *CPU_COLUMNS, "cpu_machine_vs_direct")
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
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the systems' scenarios this many times, the systems taking turns; the table shows each "
        "figure's median, the goals the median of each round's ratio (default 1)",
    )
    ap.add_argument(
        "--latency",
        type=float,
        default=0.0,
        help="milliseconds the store adds to every round trip (toxiproxy between each system and "
        "SeaweedFS; default 0: no proxy)",
    )
    ap.add_argument("--jitter", type=float, default=0.0, help="± milliseconds on that latency")
    ap.add_argument(
        "--bandwidth", type=float, default=0.0, help="MB/s (10**6 B) per connection to the store, each way"
    )
    ap.add_argument("--json", help="write the rows here as a JSON list (every round's)")
    ap.add_argument(
        "--workdir",
        type=Path,
        help="keep the systems' logs, configs and caches here (default: a temporary dir)",
    )
    args = ap.parse_args(argv)
    if args.size < 2:
        ap.error("--size must be at least 2 (MiB)")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    settings = settings_of(ap, args)
    network = Network(args.latency, args.jitter, args.bandwidth)
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
    with contextlib.ExitStack() as stack:
        tmp = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tsp-fetch-")))
        weed = start_seaweed(args.seaweed_volume_mb)
        stack.callback(weed.stop)
        via: dict[str, str | None] = dict.fromkeys(SYSTEMS)
        if network.shaped:
            links = store_links(stack, weed, args.systems)
            shape_links(links, network)
            via.update({name: link.endpoint for name, link in links.items()})
        factories: dict[str, Callable[[], System]] = {
            "tsproxy": lambda: TsproxySystem(
                weed,
                "fetch-tsproxy",
                tmp / "tsproxy",
                args.chunk_size,
                settings=settings,
                backend_endpoint=via["tsproxy"],
            ),
            "direct": lambda: DirectSystem(weed, "fetch-direct", endpoint=via["direct"]),
            "rclone": lambda: RcloneSystem(weed, "fetch", "fetch-rclone", tmp / "rclone", via["rclone"]),
        }
        rows = run_rounds(stack, factories, args, weed, segment, random_count)

    load_after = os.getloadavg()[0]
    table = rows if args.rounds == 1 else summarize(rows)
    order = {s: i for i, s in enumerate(SCENARIOS)}
    table.sort(key=lambda r: (order[r["scenario"]], SYSTEMS.index(r["system"])))
    rounds = "" if args.rounds == 1 else f", median of {args.rounds} rounds"
    print(
        f"\nKafka fetch pattern, {segment.size / MIB:.0f} MiB segment ({args.producer_codec} batches), "
        f"{random_count} random fetches, "
        f"{args.client} client ({os.cpu_count()} CPUs, 1-minute load average {load_before:.1f} before, "
        f"{load_after:.1f} after){rounds}"
        + (f"; the store {network.label()} away (toxiproxy)" if network.shaped else "")
        + "\n"
    )
    if settings:
        print("tsproxy settings: " + ", ".join(f"{k} = {v}" for k, v in settings.items()) + "\n")
    print(markdown(table, COLUMNS if args.rounds == 1 else (*COLUMNS[:4], "vs_direct_range", *COLUMNS[4:])))
    print(
        "\nCPU seconds per GiB of client bytes: the benchmark's client, the system's own process, SeaweedFS, "
        "and every core of the machine (cpu_machine_vs_direct: against direct's in the same round)\n"
    )
    print(markdown(table, CPU_TABLE))
    over = "" if args.rounds == 1 else f" (the median of {args.rounds} rounds' figures, [their range])"
    print(f"\nGoals{over}:")
    for line in goal_lines(rows, args.rounds):
        print("  " + line)
    if args.json:
        clean = [
            {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in rows
        ]
        Path(args.json).write_text(json.dumps(clean, indent=2) + "\n")
    return 0


def run_rounds(
    stack: contextlib.ExitStack,
    factories: dict[str, Callable[[], System]],
    args: argparse.Namespace,
    weed: Any,
    segment: Segment,
    random_count: int,
) -> list[dict[str, Any]]:
    """Every round's rows, each with its round number and its ratio to that round's direct row. The
    systems start once (stopped with `stack`) and take turns, in reverse order every other round, so
    that neither always goes first."""
    rows: list[dict[str, Any]] = []
    systems: dict[str, System] = {}
    for round_no in range(1, args.rounds + 1):
        for name in args.systems if round_no % 2 else args.systems[::-1]:
            if name not in systems:
                systems[name] = stack.enter_context(started(factories[name]))
            print(f"{name}" + (f", round {round_no}:" if args.rounds > 1 else ":"), file=sys.stderr)

            def report(row: dict[str, Any], round_no: int = round_no) -> None:
                rows.append({**row, "round": round_no})
                print(f"  {row['system']:8} {row['scenario']:17} {row['mib_s']:9.1f} MiB/s", file=sys.stderr)

            kind = args.client
            run_system(systems[name], weed, segment, SEGMENT_KEY, random_count, report, args.scenarios, kind)
    direct = {(r["scenario"], r["round"]): r for r in rows if r["system"] == "direct"}
    for r in rows:
        theirs = direct.get((r["scenario"], r["round"]))
        r["vs_direct"] = r["mib_s"] / theirs["mib_s"] if theirs and theirs["mib_s"] else None
        machine = theirs["cpu_machine"] if theirs else None
        r["cpu_machine_vs_direct"] = r["cpu_machine"] / machine if machine else None
    return rows


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per system and scenario: the median of each figure over the rounds, the range of the
    ratio to direct (each round's tsproxy against that round's direct)."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["system"], r["scenario"]), []).append(r)
    out = []
    for (system, scenario), group in by.items():
        row: dict[str, Any] = {"system": system, "scenario": scenario, "round": "median"}
        for column in (*COLUMNS[2:], *CPU_TABLE[2:]):
            values = [float(r[column]) for r in group if isinstance(r.get(column), int | float)]
            values = [v for v in values if not math.isnan(v)]
            row[column] = statistics.median(values) if values else None
        ratios = [r["vs_direct"] for r in group if r.get("vs_direct") is not None]
        if ratios and system != "direct":
            row["vs_direct_range"] = f"{min(ratios):.2f}-{max(ratios):.2f}"
        out.append(row)
    return out


def goal_lines(rows: list[dict[str, Any]], rounds: int) -> list[str]:
    """The goals' verdicts: of the one round, or of the median of each goal's figure over the rounds."""
    per_round = [check_goals([r for r in rows if r["round"] == n]) for n in range(1, rounds + 1)]
    lines = []
    for goals in zip(*per_round, strict=True):
        values = [g.value for g in goals if g.value is not None and not math.isnan(g.value)]
        if rounds == 1 or not values:
            lines.append(goals[0].line())
            continue
        median = Goal(goals[0].name, statistics.median(values), goals[0].limit, goals[0].at_most)
        lines.append(f"{median.line()} [{min(values):.3f}-{max(values):.3f}]")
    return lines


if __name__ == "__main__":
    sys.exit(main())
