"""Shared pieces of the benchmarks: data, SeaweedFS and tsproxy processes, timing, tables and JSON."""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Benchmarks start the same servers the tests do and find ports the same way (re-exported here).
from tests.support.ports import free_port as free_port  # noqa: E402

MIB = 1 << 20
ACCESS_KEY = "bench-access"
SECRET_KEY = "bench-secret-key-0123456789"


def kafka_like(size: int, seed: int = 7) -> bytes:
    """Uncompressed-looking Kafka payload: JSON-ish records with varying fields (compresses ~4-6x)."""
    rng = random.Random(seed)
    users = [f"user-{rng.randrange(10**6):06d}" for _ in range(500)]
    events = ["click", "view", "purchase", "login", "logout", "search"]
    out = bytearray()
    i = 0
    while len(out) < size:
        rec = (
            f'{{"offset":{i},"ts":{1700000000000 + i * 7},"user":"{rng.choice(users)}",'
            f'"event":"{rng.choice(events)}","amount":{rng.random() * 100:.2f},'
            f'"session":"{rng.getrandbits(64):016x}"}}\n'
        )
        out += rec.encode()
        i += 1
    return bytes(out[:size])


class Generated:
    """A file-like object producing `size` bytes of a repeated block without holding them all in memory."""

    def __init__(self, block: bytes, size: int) -> None:
        self.block, self.size, self.pos = block, size, 0

    def read(self, n: int = -1) -> bytes:
        if self.pos >= self.size:
            return b""
        n = self.size - self.pos if n < 0 else min(n, self.size - self.pos)
        out = bytearray()
        while len(out) < n:
            off = (self.pos + len(out)) % len(self.block)
            out += self.block[off : off + n - len(out)]
        self.pos += n
        return bytes(out)

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else (self.pos + pos if whence == 1 else self.size + pos)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        """s3transfer closes what it read from once the upload is done; nothing is held open here."""


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# SeaweedFS's volume size in the benchmarks. The test suite's 16 MB volumes fill every few dozen MiB
# written, and SeaweedFS's master then grows new ones. Writing 256 MiB straight into SeaweedFS with them
# (`fetch.py --systems direct --seaweed-volume-mb 16`, two runs) went at 102-148 MiB/s one part at a time,
# 119-230 with four in flight and 126-190 in 64 MiB PutObjects, with a p99 near a second; with 1 GiB
# volumes at 179-182, 214-217 and 221-233, and with 256 MB volumes at 185-192, 223-225 and 229-230, p99 at
# most 0.6 s with either. tsproxy writes a quarter of the bytes, so it fills volumes four times less
# often: its upload ratios were flattered. 256 MB rather than more: SeaweedFS sizes its volume count by
# the free disk over the volume size, and grows several volumes for each new bucket.
SEAWEED_VOLUME_MB = 256


def start_seaweed(volume_mb: int = SEAWEED_VOLUME_MB) -> Any:
    """A SeaweedFS server for a benchmark (the test suite's launcher, with volumes of `volume_mb`)."""
    from tests.support.seaweed import SeaweedFS

    return SeaweedFS.start(volume_size_mb=volume_mb)


class Seaweed:
    """A SeaweedFS server for a benchmark run (start_seaweed's, with a client and its keys)."""

    def __init__(self, workdir: Path) -> None:
        del workdir  # SeaweedFS makes and removes its own directory
        self.server = start_seaweed()
        self.endpoint = self.server.endpoint
        self.access_key, self.secret_key = self.server.access_key, self.server.secret_key

    def client(self) -> Any:
        return self.server.boto3_client()

    def stop(self) -> None:
        self.server.stop()


class TsproxyProcess:
    """`tsproxy serve` in its own process, so its memory can be measured on its own."""

    def __init__(
        self, workdir: Path, backend: str, backend_keys: tuple[str, str] | None, **settings: str
    ) -> None:
        from tsproxy.format import KeyRing

        workdir.mkdir(parents=True, exist_ok=True)
        ring = workdir / "ring.json"
        if not ring.exists():
            KeyRing.new().save(ring)
        self.port, self.metrics_port = free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TSPROXY_")}
        env.update(TSPROXY_ACCESS_KEY=ACCESS_KEY, TSPROXY_SECRET_KEY=SECRET_KEY)
        if backend_keys:
            env.update(TSPROXY_BACKEND_ACCESS_KEY=backend_keys[0], TSPROXY_BACKEND_SECRET_KEY=backend_keys[1])
        for k, v in settings.items():
            env["TSPROXY_" + k.upper()] = v
        args = [
            sys.executable,
            "-m",
            "tsproxy.cli",
            "serve",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--metrics-listen",
            f"127.0.0.1:{self.metrics_port}",
            "--backend",
            backend,
            "--key-ring",
            str(ring),
            "--cache-dir",
            str(workdir / "cache"),
            "--log-level",
            "warning",
        ]
        self.proc = subprocess.Popen(
            args, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("tsproxy exited during startup")
            if '"msg": "tsproxy serving S3"' in line:
                break
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, max_pool_connections=64),
        )

    def metrics(self) -> dict[str, float]:
        """The server's metrics as {'name{labels}': value}."""
        import urllib.request

        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics").read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def reset_peak_rss(self) -> None:
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")

    def peak_rss_mib(self) -> float:
        return self._status_mib("VmHWM")

    def rss_mib(self) -> float:
        return self._status_mib("VmRSS")

    def _status_mib(self, field: str) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def markdown(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    """The rows as a markdown table (columns in order); a missing or NaN figure is n/a."""

    def cell(value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "n/a"
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def print_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        print("| " + " | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) + " |")


def write_json(path: str | None, rows: list[dict[str, Any]]) -> None:
    if path:
        Path(path).write_text(json.dumps(rows, indent=2))


def add_setting_option(ap: argparse.ArgumentParser, example: str) -> None:
    """`--setting NAME=VALUE`, repeatable: a tsproxy setting for the run (read it with `settings_of`)."""
    ap.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"a tsproxy setting for the run, as in docs/CONFIG.md (e.g. {example}); repeatable",
    )


def settings_of(ap: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """The `--setting` options given, by name; a usage error for one without `=`."""
    if any("=" not in s for s in args.setting):
        ap.error("--setting takes NAME=VALUE")
    return dict(s.split("=", 1) for s in args.setting)


def best_of(runs: int, work: Callable[[], Any]) -> float:
    """The least CPU seconds `work()` took in `runs` runs (this process does nothing else meanwhile)."""
    best = math.inf
    for _ in range(runs):
        begin = time.process_time()
        work()
        best = min(best, time.process_time() - begin)
    return best


def timed(fn: Any, *args: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def chunks_of(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]
