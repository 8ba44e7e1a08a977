"""A topic archived three ways, side by side in one run:

  (a) sink-direct   Aiven's S3 sink (Kafka Connect, JSON lines, no gzip) straight to SeaweedFS
  (b) sink-tsproxy  the same sink through tsproxy (zstd, AES-GCM) into SeaweedFS
  (c) export        `tsproxy export` on Spark local[2] from the topic's tiered segments, through the
                    same tsproxy: Parquet files on local disk, no broker involved

One broker tiers through tsproxy: --size-mib of uncompressed Kafka-like JSON records (1 KiB each) over two
partitions, produced once and tiered. For (a) and (b) a standalone worker starts (not timed) and the time
runs until the sink has committed every record; (c) runs the export command. Records per second,
bytes the archive takes in the store (or on disk), and CPU seconds of every process involved (worker,
broker, tsproxy, SeaweedFS; for the export its Spark driver and Python workers) from /proc. The export's
time splits into its per-byte work (the seconds its tasks spent on segments, over its two cores:
`busy_records_s`) and the rest, its fixed cost (`fixed_s`: JVM and Spark start, planning, the Python
workers' start, Spark's stop).

    .venv/bin/python benchmarks/connect.py [--size-mib 256] [--json F]

Needs the jars of `make kafka-jars`, the S3 sink's included (docs/CONNECT.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from broker import PARTITIONS, TOPIC, cpu_seconds, produce, stored_bytes
from common import MIB, print_table, write_json

from tests.broker.stack import ACCESS_KEY, SECRET_KEY, KafkaBroker, TsproxyServer, kafka_jars
from tests.connect.archive import run_export
from tests.connect.worker import ConnectWorker, Sink, committed, connect_jars, end_offsets
from tests.support.seaweed import SeaweedFS

COLUMNS = [
    "system", "records", "seconds", "records_s", "mib_s", "store_mib", "store_vs_json", "cpu_s", "fixed_s",
    "busy_records_s",
]  # fmt: skip
EXPORT_CORES = 2  # local[2]


def wait_tiered(broker: KafkaBroker, timeout: float = 3600) -> None:
    deadline = time.monotonic() + timeout
    while any(len(local := broker.local_segments(TOPIC, p)) != 1 or local[0] == 0 for p in range(PARTITIONS)):
        assert time.monotonic() < deadline, "segments not tiered"
        time.sleep(1)


def run_sink(
    name: str, endpoint: str, keys: tuple[str, str], weed: SeaweedFS, tsproxy: TsproxyServer,
    broker: KafkaBroker, folder: Path, work: Path, records: int,
) -> dict[str, Any]:  # fmt: skip
    bucket = f"bench-{name}-{uuid.uuid4().hex[:6]}"
    weed.boto3_client().create_bucket(Bucket=bucket)
    sink = Sink(f"bench-{name}", bucket, (TOPIC,), endpoint, "none")
    worker = ConnectWorker(work / name, folder, broker.bootstrap, [sink], credentials=keys, heap="1g")
    ends = end_offsets(broker, TOPIC, PARTITIONS)
    worker.start()
    assert worker.process is not None
    pids = [worker.process.pid, broker.process.pid if broker.process else None]
    pids += [tsproxy.process.pid if tsproxy.process else None, weed.process.pid if weed.process else None]
    cpu0 = sum(cpu_seconds(p) for p in pids)
    started = time.monotonic()
    while committed(broker, f"connect-{sink.name}", TOPIC, PARTITIONS) != ends:
        assert worker.running and time.monotonic() - started < 7200, worker.log_tail()
        time.sleep(0.5)
    seconds = time.monotonic() - started
    cpu = sum(cpu_seconds(p) for p in pids) - cpu0
    worker.stop()
    json_bytes = sum(
        o["Size"]
        for page in tsproxy.boto3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for o in page.get("Contents", [])
    ) if endpoint == tsproxy.endpoint else stored_bytes(weed, bucket)[1]  # fmt: skip
    stored = stored_bytes(weed, bucket)[1]
    weed.remove_bucket(bucket)
    return {
        "system": name, "records": records, "seconds": seconds, "records_s": records / seconds,
        "mib_s": json_bytes / MIB / seconds, "store_mib": stored / MIB, "json_mib": json_bytes / MIB,
        "store_vs_json": stored / json_bytes, "cpu_s": cpu, "fixed_s": float("nan"),
        "busy_records_s": float("nan"),
    }  # fmt: skip


def _tree_cpu(root_marker: bytes, seen: dict[int, float]) -> None:
    """Record the CPU seconds of every process under the one whose command line holds `root_marker`."""
    parents: dict[int, int] = {}
    roots = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if root_marker in (entry / "cmdline").read_bytes():
                roots.add(int(entry.name))
        except OSError:
            continue
        parents[int(entry.name)] = int(stat[1])
    for pid in parents:
        walk = pid
        while walk in parents and walk not in roots and walk > 1:
            walk = parents[walk]
        if walk in roots:
            cpu = cpu_seconds(pid)
            if cpu == cpu:  # not NaN: the process is still there
                seen[pid] = max(seen.get(pid, 0.0), cpu)


def run_tsproxy_export(
    tsproxy: TsproxyServer, weed: SeaweedFS, bucket: str, work: Path, records: int
) -> dict[str, Any]:
    """The export command, timed; CPU of tsproxy, SeaweedFS and the command's whole process tree (its
    Spark JVM and Python workers), sampled from /proc every 0.2 s (a process's last 0.2 s may be missed)."""
    out = work / "export"
    pids = [tsproxy.process.pid if tsproxy.process else None, weed.process.pid if weed.process else None]
    cpu0 = sum(cpu_seconds(p) for p in pids)
    tree: dict[int, float] = {}
    result: list[Any] = []
    started = time.monotonic()
    thread = threading.Thread(
        target=lambda: result.append(
            run_export(
                tsproxy.endpoint, bucket, [TOPIC], out / "files", "read_uncommitted", out / "summary.json"
            )
        )
    )
    thread.start()
    while thread.is_alive():
        _tree_cpu(b"tsproxy.cli\x00export", tree)
        time.sleep(0.2)
    seconds = time.monotonic() - started
    assert result and result[0].returncode == 0, result[0].stderr[-3000:] if result else "no result"
    cpu = sum(cpu_seconds(p) for p in pids) - cpu0 + sum(tree.values())
    written = sum(p.stat().st_size for p in (out / "files").rglob("*.parquet"))
    summary = json.loads((out / "summary.json").read_text())
    # Per-byte work: the seconds tasks spent on segments, spread over the cores; the rest is fixed cost
    # (JVM and Spark start, planning, Python workers' start, Spark's stop).
    busy = summary["task_seconds"] / EXPORT_CORES
    return {
        "system": "export", "records": records, "seconds": seconds, "records_s": records / seconds,
        "mib_s": float("nan"), "store_mib": written / MIB, "store_vs_json": float("nan"), "cpu_s": cpu,
        "fixed_s": seconds - busy, "busy_records_s": records / busy,
        "spark_start_s": seconds - summary["seconds"],
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=256, help="record bytes produced")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    jars, folder = kafka_jars(), connect_jars()
    if jars is None or folder is None:
        print("no broker, plugin or Connect jars: run `make kafka-jars` (docs/CONNECT.md)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="tsp-bench-connect-"))
    weed = SeaweedFS.start(volume_size_mb=256)
    rows = []
    tsproxy = TsproxyServer(work / "tsproxy", weed.endpoint, (weed.access_key, weed.secret_key))
    broker = None
    try:
        tiered = f"bench-tiered-{uuid.uuid4().hex[:6]}"
        weed.boto3_client().create_bucket(Bucket=tiered)
        tsproxy.start()
        broker = KafkaBroker(work / "broker", jars, tsproxy.endpoint, tiered, heap="1g")
        broker.start()
        broker.create_topic(TOPIC, PARTITIONS, segment_bytes=str(16 * MIB))
        print(f"[connect] producing {args.size_mib} MiB ...", file=sys.stderr, flush=True)
        records = produce(broker.bootstrap, args.size_mib * MIB)
        wait_tiered(broker)
        for name, endpoint, keys in (
            ("sink-direct", weed.endpoint, (weed.access_key, weed.secret_key)),
            ("sink-tsproxy", tsproxy.endpoint, (ACCESS_KEY, SECRET_KEY)),
        ):
            print(f"[connect] {name} ...", file=sys.stderr, flush=True)
            rows.append(run_sink(name, endpoint, keys, weed, tsproxy, broker, folder, work, records))
            print(f"[connect] {rows[-1]}", file=sys.stderr, flush=True)
        print("[connect] export ...", file=sys.stderr, flush=True)
        rows.append(run_tsproxy_export(tsproxy, weed, tiered, work, records))
    finally:
        if broker is not None:
            broker.stop()
        tsproxy.stop()
        weed.stop()
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows, COLUMNS)
    by = {r["system"]: r for r in rows}
    ratios = {
        "system": "ratios",
        "tsproxy_vs_direct_rate": by["sink-tsproxy"]["records_s"] / by["sink-direct"]["records_s"],
        "tsproxy_store_vs_json": by["sink-tsproxy"]["store_vs_json"],
        "export_vs_sink_rate": by["export"]["records_s"] / by["sink-tsproxy"]["records_s"],
        "export_busy_vs_sink_rate": by["export"]["busy_records_s"] / by["sink-tsproxy"]["records_s"],
    }
    print()
    print("goals: tsproxy_vs_direct_rate >= 1.0, tsproxy_store_vs_json <= 0.5, export_vs_sink_rate >= 2")
    print_table([ratios], list(ratios))
    rows.append(ratios)
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
