"""tsproxy against SeaweedFS itself when the store is a network away: latency and per-connection bandwidth.

Every other benchmark has the store on loopback, answering in about a millisecond at any bandwidth. Here
toxiproxy (tests/support/toxiproxy.py) sits between each system and SeaweedFS, one link per system with the
same network on both: `latency` ms (± `jitter`) more on every round trip, each connection limited to
`bandwidth` MB/s (10**6 bytes) each way. tsproxy's clients still talk to it over loopback, as a broker
talks to its sidecar; direct's clients go through their link to SeaweedFS.

For each network of the matrix, tsproxy and direct take turns (in reverse order every other round), each
round running, on one 64 MiB segment of uncompressed record batches (fetch_support.build_segment):

- `upload 1 in flight`: the plugin's upload, 25 MiB parts one after another;
- `put 64MiB`: one PutObject of the segment;
- `first byte`: a fresh tsproxy (empty cache) whose connections are warm (it has served a small object),
  then the first 1 MiB read of a segment it never read: the time to its first body byte (`first_ms`);
- `chunks 4MiB cold`: the plugin's fetch, 4 MiB chunk GETs one after another, on an empty cache;
- `seq 1MiB cold`, then `seq 1MiB warm`: a consumer's 1 MiB fetches from the start to the end;
- `random 1MiB cold`: 1 MiB fetches from random batch starts.

Every body read is checked against the segment. The table shows, per network and scenario, the median over
the rounds of each system's MiB/s (for `first byte`: milliseconds to the first byte), `vs_direct` as the
median of each round's ratio (tsproxy's speed over direct's: above 1 is faster; for `first byte`, direct's
time over tsproxy's) with its range, and the backend requests and bytes SeaweedFS saw for each system's
bucket (bytes per client byte).

    .venv/bin/python benchmarks/network.py [--latency 0,10,30,80] [--bandwidth 0,20,100] [--jitter 10%]
        [--rounds 3] [--size 64] [--scenarios chunks,first] [--json out.json]

`--latency` and `--bandwidth` are lists: the matrix is every latency with unlimited bandwidth, then every
bandwidth (but 0) at each latency of `--bandwidth-latency` (default 0 and 30); `--cross` runs the full
cross product instead.
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common import SEAWEED_VOLUME_MB, add_setting_option, markdown, settings_of, start_seaweed
from fetch_support import (
    CHUNKS_COLD,
    MIB,
    RANDOM_COLD,
    SEQ_COLD,
    SEQ_WARM,
    UPLOAD_SERIAL,
    DirectSystem,
    LeanS3,
    Measurement,
    Network,
    Segment,
    System,
    Traffic,
    TsproxySystem,
    build_segment,
    chunk_reads,
    consumer_fetches,
    cpu_use,
    lean_client,
    measure_put,
    measure_reads,
    measure_upload,
    random_fetches,
    settled_traffic,
    shape_links,
    started,
    store_links,
)

PUT_ONE = "put 64MiB"
FIRST_BYTE = "first byte"
SCENARIOS = (UPLOAD_SERIAL, PUT_ONE, FIRST_BYTE, CHUNKS_COLD, SEQ_COLD, SEQ_WARM, RANDOM_COLD)
SYSTEMS = ("tsproxy", "direct")
SEGMENT_KEY = "clicks-AAAAAAAAAAAAAAAAAAAAAA/0/00000000000000000000-BBBBBBBBBBBBBBBBBBBBBB.log"
WARM_UP_KEY = "warm-up"
COLUMNS = (
    "network",
    "scenario",
    "tsproxy",
    "direct",
    "vs_direct",
    "vs_direct_range",
    "tsproxy_p50_ms",
    "direct_p50_ms",
    "tsproxy_backend_requests",
    "direct_backend_requests",
    "tsproxy_backend_bytes_ratio",
    "direct_backend_bytes_ratio",
)


def numbers(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of numbers, not {text!r}") from None


def scenario_list(text: str) -> list[str]:
    chosen = []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        matches = [s for s in SCENARIOS if s == word] or [s for s in SCENARIOS if s.startswith(word)]
        if len(matches) != 1:
            raise argparse.ArgumentTypeError(f"{word!r} names {len(matches)} of: {', '.join(SCENARIOS)}")
        chosen += matches
    return [s for s in SCENARIOS if s in chosen]


def matrix(args: argparse.Namespace) -> list[Network]:
    """The networks to run, in order (see the module's notes)."""

    def jitter(latency: float) -> float:
        text = str(args.jitter)
        return latency * float(text[:-1]) / 100 if text.endswith("%") else min(float(text), latency)

    pairs: list[tuple[float, float]] = []
    if args.cross:
        pairs = [(lat, bw) for bw in args.bandwidth for lat in args.latency]
    else:
        pairs = [(lat, 0.0) for lat in args.latency]
        pairs += [(lat, bw) for lat in args.bandwidth_latency for bw in args.bandwidth if bw > 0]
    seen: list[Network] = []
    for lat, bw in pairs:
        network = Network(lat, jitter(lat), bw)
        if network not in seen:
            seen.append(network)
    return seen


def measure_first_byte(system: System, weed: Any, key: str, expected: bytes) -> Measurement:
    """A fresh system, its connections warmed by a small read, then the first 1 MiB read of `key`: the
    latencies are (seconds to the first byte, seconds to the last)."""
    system.go_cold()
    client = lean_client(system)
    client.get_range(system.bucket, WARM_UP_KEY, 0, 1)  # the process is up and has met the store
    before = settled_traffic(weed, system.backend_bucket)
    cpu_before = cpu_use(system, weed)
    first, total, body = client.first_byte(system.bucket, key, 0, MIB)
    if body != expected[:MIB]:
        raise AssertionError(f"{system.name}: the first MiB of {key} read back wrong")
    after = settled_traffic(weed, system.backend_bucket)
    return Measurement(len(body), total, (first, total), after - before, cpu_use(system, weed) - cpu_before)


def run_scenarios(
    system: System,
    weed: Any,
    segment: Segment,
    scenarios: Sequence[str],
    random_count: int,
    report: Callable[[str, Measurement], None],
) -> None:
    """The chosen scenarios against one system, in SCENARIOS order, each read on an empty cache but the
    warm one. The objects read are written once per system (by the upload scenarios, or unreported)."""
    wanted = set(scenarios)
    key = SEGMENT_KEY
    if UPLOAD_SERIAL in wanted or not getattr(system, "_segment_stored", False):
        serial = measure_upload(system, weed, key, segment.data, concurrency=1)
        if UPLOAD_SERIAL in wanted:
            report(UPLOAD_SERIAL, serial)
    if PUT_ONE in wanted or not getattr(system, "_segment_stored", False):
        put = measure_put(system, weed, key + ".put", segment.data[: 64 * MIB], count=1)
        if PUT_ONE in wanted:
            report(PUT_ONE, put)
    if not getattr(system, "_segment_stored", False):
        LeanS3(system.endpoint, *system.keys).request(
            "PUT", LeanS3.path(system.bucket, WARM_UP_KEY), body=b"w"
        )
        system._segment_stored = True  # type: ignore[attr-defined]

    def reads(ranges: Sequence[tuple[int, int]]) -> Measurement:
        return measure_reads(system, weed, key, ranges, segment.data)

    if FIRST_BYTE in wanted:
        # The PutObject's copy (key + ".put0"): an object this fresh process has never read.
        report(FIRST_BYTE, measure_first_byte(system, weed, key + ".put0", segment.data))
    if CHUNKS_COLD in wanted:
        system.go_cold()
        report(CHUNKS_COLD, reads(chunk_reads(segment.size)))
    if wanted & {SEQ_COLD, SEQ_WARM}:
        system.go_cold()
        sequential = consumer_fetches(segment)
        cold = reads(sequential)
        if SEQ_COLD in wanted:
            report(SEQ_COLD, cold)
        if SEQ_WARM in wanted:
            report(SEQ_WARM, reads(sequential))
    if RANDOM_COLD in wanted:
        system.go_cold()
        report(RANDOM_COLD, reads(random_fetches(segment, random_count)))


def row_of(network: Network, system: str, scenario: str, round_no: int, m: Measurement) -> dict[str, Any]:
    """One JSON row. `speed` is what `vs_direct` compares: MiB/s, or 1/seconds to the first byte."""
    row = m.row(system, scenario)
    first = m.latencies[0] if m.latencies else math.nan
    row.update(
        network=network.label(),
        latency_ms=network.latency_ms,
        jitter_ms=network.jitter_ms,
        mb_per_s=network.mb_per_s,
        round=round_no,
        seconds=m.seconds,
        client_bytes=m.client_bytes,
        backend=_traffic(m.backend),
        speed=1 / first if scenario == FIRST_BYTE else row["mib_s"],
        shown=first * 1000 if scenario == FIRST_BYTE else row["mib_s"],
    )
    return row


def _traffic(t: Traffic) -> dict[str, float]:
    return {"gets": t.gets, "requests": t.requests, "sent": t.sent, "received": t.received}


def summarize(rows: list[dict[str, Any]], networks: list[Network], scenarios: Sequence[str]) -> list[dict]:
    """Per network and scenario: medians over the rounds, and the median of each round's ratio."""
    out = []
    for network in networks:
        for scenario in scenarios:
            group = [r for r in rows if r["network"] == network.label() and r["scenario"] == scenario]
            if not group:
                continue
            mine = {r["round"]: r for r in group if r["system"] == "tsproxy"}
            theirs = {r["round"]: r for r in group if r["system"] == "direct"}
            ratios = [
                mine[n]["speed"] / theirs[n]["speed"] for n in mine if n in theirs and theirs[n]["speed"]
            ]
            line: dict[str, Any] = {"network": network.label(), "scenario": scenario}
            for name, by in (("tsproxy", mine), ("direct", theirs)):
                line[name] = _median([r["shown"] for r in by.values()])
                line[f"{name}_p50_ms"] = _median([r["p50_ms"] for r in by.values()])
                line[f"{name}_backend_requests"] = _median([r["backend_requests"] for r in by.values()])
                line[f"{name}_backend_bytes_ratio"] = _median([r["backend_bytes_ratio"] for r in by.values()])
            line["vs_direct"] = _median(ratios)
            line["vs_direct_range"] = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else None
            out.append(line)
    return out


def _median(values: Sequence[float]) -> float | None:
    clean = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return statistics.median(clean) if clean else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--latency", type=numbers, default=[0, 10, 30, 80], help="ms (default 0,10,30,80)")
    ap.add_argument("--jitter", default="10%", help="± ms on each latency, or a share of it (default 10%%)")
    ap.add_argument(
        "--bandwidth", type=numbers, default=[20, 100], help="MB/s per connection (default 20,100; 0: none)"
    )
    ap.add_argument(
        "--bandwidth-latency",
        type=numbers,
        default=[0, 30],
        help="the latencies the limited links run at (default 0,30)",
    )
    ap.add_argument("--cross", action="store_true", help="every latency with every bandwidth instead")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per network (default 3)")
    ap.add_argument("--size", type=int, default=64, help="segment size in MiB (default 64)")
    ap.add_argument("--random-reads", type=int, default=16, help="random 1 MiB fetches (default 16)")
    ap.add_argument("--scenarios", type=scenario_list, default=list(SCENARIOS), help="default: all")
    add_setting_option(ap, "prefetch=32MiB")
    ap.add_argument("--json", help="write every round's rows and the summary here")
    ap.add_argument("--workdir", type=Path, help="keep tsproxy's logs and caches here")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.size < 2:
        ap.error("--rounds must be at least 1 and --size at least 2")
    settings = settings_of(ap, args)
    networks = matrix(args)
    load_before = os.getloadavg()[0]
    begin = time.perf_counter()
    segment = build_segment(args.size * MIB)
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        tmp = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tsp-network-")))
        weed = start_seaweed(SEAWEED_VOLUME_MB)
        stack.callback(weed.stop)
        links = store_links(stack, weed, SYSTEMS)
        factories: dict[str, Callable[[], System]] = {
            "tsproxy": lambda: TsproxySystem(
                weed,
                "net-tsproxy",
                tmp / "tsproxy",
                settings=settings,
                backend_endpoint=links["tsproxy"].endpoint,
            ),
            "direct": lambda: DirectSystem(weed, "net-direct", endpoint=links["direct"].endpoint),
        }
        systems = {name: stack.enter_context(started(factory)) for name, factory in factories.items()}
        for network in networks:
            shape_links(links, network)
            for round_no in range(1, args.rounds + 1):
                for name in SYSTEMS if round_no % 2 else SYSTEMS[::-1]:
                    print(f"{network.label()}, {name}, round {round_no}:", file=sys.stderr)

                    def report(
                        scenario: str,
                        m: Measurement,
                        name: str = name,
                        round_no: int = round_no,
                        network: Network = network,
                    ) -> None:
                        row = row_of(network, name, scenario, round_no, m)
                        rows.append(row)
                        print(f"  {scenario:18} {row['shown']:9.1f}", file=sys.stderr)

                    run_scenarios(systems[name], weed, segment, args.scenarios, args.random_reads, report)
    table = summarize(rows, networks, args.scenarios)
    print(
        "\ntsproxy and SeaweedFS direct with the store a network away (toxiproxy), "
        f"{segment.size / MIB:.0f} MiB segment, {args.random_reads} random fetches, median of {args.rounds} "
        f"rounds; {os.cpu_count()} CPUs, load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} "
        f"after, {(time.perf_counter() - begin) / 60:.0f} min\n"
        "tsproxy / direct: MiB/s (first byte: ms to the first byte); vs_direct: tsproxy's speed over "
        "direct's (first byte: direct's time over tsproxy's), median of the rounds' ratios\n"
    )
    if settings:
        print("tsproxy settings: " + ", ".join(f"{k} = {v}" for k, v in settings.items()) + "\n")
    print(markdown(table, COLUMNS))
    if args.json:
        clean = json.loads(json.dumps({"rows": rows, "summary": table}, default=str).replace("NaN", "null"))
        Path(args.json).write_text(json.dumps(clean, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
