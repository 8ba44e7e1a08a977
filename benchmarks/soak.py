"""A long broker-shaped load on tsproxy with faults at random: does anything leak or go wrong over time?

tsproxy (`tsproxy serve`, its own process) stores into a real SeaweedFS through the faulty HTTP layer
(tests/support/faulty_proxy.py: SlowDown and 500 bursts, bodies cut short) and a toxiproxy link
(tests/support/toxiproxy.py: latency spikes, connections reset, the store gone for a few seconds). Worker
threads do what brokers do to it:

- an uploader writes segments as Aiven's plugin does: the `.log` as a multipart upload of 5 MiB parts one
  at a time, then `.indexes` and `.rsm-manifest` as PutObjects; old segments go with one DeleteObjects
  of their three keys (retention);
- forward scanners read a segment from a random point to its end in 1 MiB fetches (a lagging consumer);
- random readers fetch 1 MiB from anywhere in a segment.

Every body read is checked against what was written: `wrong_bytes` must stay 0. A request that fails
counts as an error of its kind (the S3 code and status, or how the connection broke) and is not retried
by the client. Every `--sample` seconds it records tsproxy's RSS, its open sockets, its asyncio tasks
(`tsproxy_event_loop_tasks`), the backend retries it counted, and the requests, errors and verified bytes
so far, and prints them as a table at the end with the errors by kind. `flat` compares the median of the
last 10 % of samples with that of the first 10 %: RSS, sockets and tasks
must each stay within `--tolerance` (10 %), plus a slack of 8 MiB for RSS and, for the counts, of what
the clients' requests in flight may hold at the moment of a sample (4, and 2 a client); the
first `--warmup` minutes (a quarter of the run, at most 2) are left out, while caches fill.

    .venv/bin/python benchmarks/soak.py [--minutes 30] [--sample 10] [--json out.json]

Exit status 1 when a byte read back wrong, tsproxy logged a traceback, or a figure was not flat.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from common import markdown, start_seaweed
from fetch_support import TsproxySystem, s3_client

from tests.support.faulty_proxy import FaultyProxy
from tests.support.toxiproxy import Link, Toxiproxy

MIB = 1 << 20
PART = 5 * MIB
SEGMENT = 12 * MIB  # three parts: 5 + 5 + 2 MiB
KEPT = 6  # segments kept (and held here to check reads against); older ones are deleted
BUCKET = "soak"
SAMPLE_COLUMNS = (
    "minute",
    "requests",
    "errors",
    "verified_mib",
    "backend_retries",
    "rss_mib",
    "sockets",
    "tasks",
)
WATCHED = ("rss_mib", "sockets", "tasks")


class Segments:
    """The segments written and not yet deleted: key -> bytes, for checking reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, bytes] = {}

    def add(self, key: str, data: bytes) -> None:
        with self._lock:
            self._data[key] = data

    def drop(self, key: str) -> None:
        with self._lock:
            self._data.pop(key, None)

    def pick(self, rng: random.Random) -> tuple[str, bytes] | None:
        with self._lock:
            if not self._data:
                return None
            key = rng.choice(sorted(self._data))
            return key, self._data[key]

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._data)


class Tally:
    """What the workers did, shared between them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.verified = 0
        self.wrong = 0
        self.errors: Counter[str] = Counter()

    def ok(self, verified: int = 0) -> None:
        with self._lock:
            self.requests += 1
            self.verified += verified

    def failed(self, kind: str) -> None:
        with self._lock:
            self.requests += 1
            self.errors[kind] += 1

    def wrong_bytes(self, what: str) -> None:
        with self._lock:
            self.requests += 1
            self.wrong += 1
            self.errors["wrong bytes"] += 1
        print(f"WRONG BYTES: {what}", file=sys.stderr)


def kind_of(error: BaseException) -> str:
    response = getattr(error, "response", None)
    if isinstance(response, dict) and "Error" in response:
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f"{status} {response['Error'].get('Code')}"
    return type(error).__name__


def attempt(tally: Tally, call: Any, **params: Any) -> Any:
    """`call(**params)`, counted: as done, or as a failure of its kind (then None)."""
    try:
        result = call(**params)
    except Exception as e:
        tally.failed(kind_of(e))
        return None
    tally.ok()
    return result


def segment_bytes(rng: random.Random) -> bytes:
    """SEGMENT bytes that compress, as record batches do: a repeated block with fresh bytes every 4 KiB."""
    block = rng.randbytes(64 << 10)
    data = bytearray((block * (SEGMENT // len(block) + 1))[:SEGMENT])
    for i in range(0, SEGMENT, 4096):
        data[i : i + 8] = rng.randbytes(8)
    return bytes(data)


def upload_segment(client: Any, tally: Tally, key: str, body: bytes) -> bool:
    """The plugin's upload of one segment: the log in parts one at a time, then its two small objects.
    An upload that failed is aborted, as the plugin does (tsproxy's janitor takes what an abort cannot)."""
    log = key + ".log"
    created = attempt(tally, client.create_multipart_upload, Bucket=BUCKET, Key=log)
    if created is None:
        return False
    upload_id, parts = created["UploadId"], []
    for number, pos in enumerate(range(0, len(body), PART), 1):
        answer = attempt(
            tally, client.upload_part, Bucket=BUCKET, Key=log, UploadId=upload_id, PartNumber=number,
            Body=body[pos : pos + PART],
        )  # fmt: skip
        if answer is None:
            break
        parts.append({"PartNumber": number, "ETag": answer["ETag"]})
    else:
        completion = {"Parts": parts}
        if attempt(
            tally, client.complete_multipart_upload, Bucket=BUCKET, Key=log, UploadId=upload_id,
            MultipartUpload=completion,
        ) is not None:  # fmt: skip
            for suffix in (".indexes", ".rsm-manifest"):
                attempt(tally, client.put_object, Bucket=BUCKET, Key=key + suffix, Body=body[:4096])
            return True
    attempt(tally, client.abort_multipart_upload, Bucket=BUCKET, Key=log, UploadId=upload_id)
    return False


def uploader(client: Any, segments: Segments, tally: Tally, stop: threading.Event, seed: int) -> None:
    """Segments one after another; past KEPT, the oldest go with one DeleteObjects (retention)."""
    rng = random.Random(seed)
    written: list[str] = []
    number = 0
    while not stop.is_set():
        key = f"clicks-0/0/{number:020d}-{rng.getrandbits(64):016x}"
        number += 1
        body = segment_bytes(rng)
        if not upload_segment(client, tally, key, body):
            continue
        segments.add(key + ".log", body)
        written.append(key)
        while len(written) > KEPT:
            old = written.pop(0)
            segments.drop(old + ".log")
            objects = [{"Key": old + suffix} for suffix in (".log", ".indexes", ".rsm-manifest")]
            attempt(tally, client.delete_objects, Bucket=BUCKET, Delete={"Objects": objects})


segments_alive = Segments()  # the uploader's, for telling a read of a deleted segment from a lost one


def read_range(client: Any, tally: Tally, key: str, data: bytes, start: int, end: int) -> bool:
    try:
        body = client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={start}-{end - 1}")["Body"].read()
    except Exception as e:
        kind = kind_of(e)
        if kind == "404 NoSuchKey" and key not in segments_alive.keys():
            kind = "404 NoSuchKey (deleted by retention meanwhile)"  # the right answer
        tally.failed(kind)
        return False
    if body != data[start:end]:
        tally.wrong_bytes(f"{key} bytes {start}-{end - 1}")
        return False
    tally.ok(len(body))
    return True


def scanner(client: Any, segments: Segments, tally: Tally, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        picked = segments.pick(rng)
        if picked is None:
            time.sleep(0.2)
            continue
        key, data = picked
        position = rng.randrange(0, len(data), 4096)
        while position < len(data) and not stop.is_set():
            end = min(position + MIB, len(data))
            if not read_range(client, tally, key, data, position, end):
                time.sleep(0.2)  # a consumer backs off and fetches the same offset again
                if key not in segments.keys():
                    break
                continue
            position = end


def random_reader(client: Any, segments: Segments, tally: Tally, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        picked = segments.pick(rng)
        if picked is None:
            time.sleep(0.2)
            continue
        key, data = picked
        start = rng.randrange(0, len(data) - 1)
        read_range(client, tally, key, data, start, min(start + MIB, len(data)))
        time.sleep(rng.uniform(0, 0.1))


FAULTS = ("latency spike", "resets", "store gone", "slowdown burst", "500 burst", "body cut")


def inject_faults(
    link: Link, faulty: FaultyProxy, stop: threading.Event, seed: int, every: float, seen: Counter[str]
) -> None:
    """A fault at random every `every` seconds on average, each lasting a few seconds."""
    rng = random.Random(seed)
    while not stop.wait(rng.uniform(0.5, 1.5) * every):
        fault = rng.choice(FAULTS)
        seen[fault] += 1
        if fault == "latency spike":
            with link.toxic("latency", name="spike", latency=rng.randint(200, 800), jitter=100):
                stop.wait(rng.uniform(2, 5))
        elif fault == "resets":
            with link.toxic("limit_data", name="resets", bytes=rng.randint(200_000, 3_000_000)):
                stop.wait(rng.uniform(1, 3))
        elif fault == "store gone":
            link.disable()
            try:
                stop.wait(rng.uniform(2, 6))
            finally:
                link.enable()
        elif fault == "slowdown burst":
            faulty.clear()  # the last burst's rules and the records (not needed: keeps its memory flat)
            faulty.inject("slowdown", times=rng.randint(2, 8))
        elif fault == "500 burst":
            faulty.clear()
            faulty.inject("internal_error", times=rng.randint(2, 6))
        else:
            faulty.clear()
            faulty.inject(
                "truncate", method="GET", truncate_at=rng.randint(1000, 500_000), times=rng.randint(1, 3)
            )


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


def process_figures(pid: int) -> tuple[float, int]:
    """(RSS in MiB, open sockets) of process `pid`."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    sockets = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            sockets += os.readlink(fd).startswith("socket:")
    return rss, sockets


def tsproxy_log_lines(log: Path) -> Counter[str]:
    """tsproxy's log lines by level, and its tracebacks (there must be none)."""
    found: Counter[str] = Counter()
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    found[str(json.loads(line).get("level", "?"))] += 1
            found["traceback"] += line.startswith("Traceback")
    return found


def flatness(
    samples: list[dict[str, Any]], tolerance: float, warmup: float, clients: int
) -> dict[str, dict[str, Any]]:
    """For each watched figure: the median of the first and of the last 10 % of the samples after
    `warmup` minutes (caches fill and pools open meanwhile), and whether the last stays within
    `tolerance` of the first. The slack is 8 MiB for RSS; for sockets and tasks it is what the requests
    in flight when a sample is taken may hold (4, and 2 for each of `clients`, whose request and its
    retries or prefetches hold a task or a socket each), so that a sample taken during a fault burst is
    not a leak. A leak grows with the requests served, hundreds in a short run, far past it."""
    body = [s for s in samples if s["minute"] >= warmup] or samples
    tenth = max(1, len(body) // 10)
    verdict = {}
    for name in WATCHED:
        first = statistics.median(s[name] for s in body[:tenth])
        last = statistics.median(s[name] for s in body[-tenth:])
        slack = 8.0 if name == "rss_mib" else 4.0 + 2.0 * clients
        verdict[name] = {"first": first, "last": last, "flat": last <= first * (1 + tolerance) + slack}
    return verdict


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0, help="how long (default 30)")
    ap.add_argument("--sample", type=float, default=10.0, help="seconds between samples (default 10)")
    ap.add_argument(
        "--fault-every", type=float, default=15.0, help="mean seconds between faults (default 15)"
    )
    ap.add_argument("--scanners", type=int, default=2)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument(
        "--warmup", type=float, help="minutes left out of the flatness check (default a quarter, at most 2)"
    )
    ap.add_argument("--tolerance", type=float, default=0.10, help="flatness tolerance (default 0.10)")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--json", help="write the samples, totals and verdicts here")
    args = ap.parse_args(argv)
    # The faulty layer forwarding to a link that is cut logs each broken forward; that is the fault itself.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    tally, segments, stop = Tally(), segments_alive, threading.Event()
    log_lines: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    samples: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tsp-soak-")))
        weed = start_seaweed()
        stack.callback(weed.stop)
        toxi = Toxiproxy.start()
        stack.callback(toxi.stop)
        link = toxi.link("soak-store", weed.endpoint)
        faulty = stack.enter_context(FaultyProxy.threaded(link.endpoint))
        settings = {"backend_read_timeout": "10s", "backend_max_attempts": "4", "janitor_interval": "1m"}
        system = TsproxySystem(
            weed, BUCKET, tmp / "tsproxy", settings=settings, backend_endpoint=faulty.endpoint
        )
        stack.callback(system.stop)
        assert system.pid is not None
        metrics_url = f"http://127.0.0.1:{system.metrics_port}/metrics"
        threads = [
            threading.Thread(
                target=uploader,
                args=(s3_client(system.endpoint, *system.keys), segments, tally, stop, args.seed),
            )
        ]
        threads += [
            threading.Thread(
                target=scanner,
                args=(s3_client(system.endpoint, *system.keys), segments, tally, stop, args.seed + 10 + i),
            )
            for i in range(args.scanners)
        ]
        threads += [
            threading.Thread(
                target=random_reader,
                args=(s3_client(system.endpoint, *system.keys), segments, tally, stop, args.seed + 20 + i),
            )
            for i in range(args.readers)
        ]
        threads.append(
            threading.Thread(
                target=inject_faults, args=(link, faulty, stop, args.seed + 30, args.fault_every, faults)
            )
        )
        for t in threads:
            t.start()
        begin = time.monotonic()
        try:
            while time.monotonic() - begin < args.minutes * 60:
                stop.wait(min(args.sample, args.minutes * 60 - (time.monotonic() - begin)))
                scraped = scrape(metrics_url)
                rss, sockets = process_figures(system.pid)
                sample = {
                    "minute": (time.monotonic() - begin) / 60,
                    "requests": tally.requests,
                    "errors": sum(tally.errors.values()),
                    "verified_mib": tally.verified / MIB,
                    "backend_retries": sum(
                        v for k, v in scraped.items() if k.startswith("tsproxy_backend_retries_total")
                    ),
                    "rss_mib": rss,
                    "sockets": sockets,
                    "tasks": scraped.get("tsproxy_event_loop_tasks", float("nan")),
                }
                samples.append(sample)
                print("  " + "  ".join(f"{k} {v:.1f}" for k, v in sample.items()), file=sys.stderr)
        finally:
            stop.set()
            for t in threads:
                t.join(120)
            system.stop()
            log_lines.update(tsproxy_log_lines(system.log))
    warmup = args.warmup if args.warmup is not None else min(2.0, args.minutes / 4)
    clients = 1 + args.scanners + args.readers  # and the uploader
    verdict = flatness(samples, args.tolerance, warmup, clients) if samples else {}
    print(
        f"\nsoak: {args.minutes:g} min, {args.scanners} scanners, {args.readers} random readers, an "
        f"uploader; faults {dict(faults)}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}\n"
    )
    print(markdown(samples, SAMPLE_COLUMNS))
    print("\nerrors by kind: " + (", ".join(f"{k}: {v}" for k, v in tally.errors.most_common()) or "none"))
    print(
        f"requests {tally.requests}, bytes verified {tally.verified / MIB:.0f} MiB, wrong bytes {tally.wrong}"
    )
    print(f"tsproxy's log: {dict(log_lines)}")
    print(f"flatness over the samples after {warmup:g} min of warm-up:")
    for name, v in verdict.items():
        print(
            f"{'flat' if v['flat'] else 'RISING'}  {name}: first 10 % {v['first']:.1f}, "
            f"last 10 % {v['last']:.1f}"
        )
    if args.json:
        result = {
            "samples": samples,
            "errors": dict(tally.errors),
            "faults": dict(faults),
            "requests": tally.requests,
            "verified_bytes": tally.verified,
            "wrong": tally.wrong,
            "tsproxy_log": dict(log_lines),
            "flat": verdict,
        }
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    good = tally.wrong == 0 and not log_lines["traceback"] and all(v["flat"] for v in verdict.values())
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
