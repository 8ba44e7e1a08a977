"""An authenticated client's GETs while unauthenticated clients flood tsproxy with kept-alive connections.

    .venv/bin/python benchmarks/flood.py [--flood 2000] [--gets 300] [--json out.json]

tsproxy (`tsproxy serve`, local backend, its default `max_connections`) runs in its own process; the
flood runs in another: `--flood` sockets, half of them sending one unauthenticated GET, reading its
answer and then holding the connection open (another request every `--resend` seconds), the other half
connecting and sending nothing. A socket tsproxy closes connects again after `--reconnect` seconds
(25 s by default, the pace of the attack in issue 31; a small value makes it a flood of requests, whose
cost is CPU rather than connection slots). The measured
client signs its requests and reads a 64 KiB object `--gets` times, in two ways: a pooled boto3 client
(kept-alive connections, as SDKs work) and a fresh connection per GET (every request needs a free
slot). Each way runs unloaded, then again with the flood established. Loopback only; each phase is
bounded by `--gets` requests with a 5 s timeout each.

The goal (issue 31): under 2,000 flood connections, at least 99 % of the GETs succeed and their p99 is
at most twice the unloaded p99.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from common import ACCESS_KEY, SECRET_KEY, TsproxyProcess, percentile, print_table, write_json

BUCKET, KEY = "flood-bench", "object"
TIMEOUT = 5.0


def _flood(port: int, sockets: int, resend: float, reconnect: float, seconds: float, ready: Any) -> None:
    """The flood: `sockets` connections kept open without credentials for `seconds` (own process)."""

    async def one(n: int, stats: dict[str, int]) -> None:
        request = f"GET /{BUCKET}/{KEY} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
        silent = n % 2 == 1
        first = True
        while True:
            if not first:
                await asyncio.sleep(reconnect)
            first = False
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                stats["connect_errors"] += 1
                continue
            stats["connects"] += 1
            try:
                while silent:
                    if not await reader.read(1):
                        break
                while not silent:
                    writer.write(request)
                    await writer.drain()
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
                    await reader.readexactly(length)
                    stats["answers"] += 1
                    # Hold the connection; a closed one shows as EOF at the next read.
                    try:
                        async with asyncio.timeout(resend):
                            if not await reader.read(1):
                                break
                    except TimeoutError:
                        pass
            except (OSError, asyncio.IncompleteReadError, IndexError, ValueError):
                pass
            finally:
                writer.close()
            stats["closed_by_server"] += 1

    async def main() -> None:
        stats = {"connects": 0, "connect_errors": 0, "answers": 0, "closed_by_server": 0}
        tasks = [asyncio.create_task(one(n, stats)) for n in range(sockets)]
        await asyncio.sleep(min(3.0, seconds))
        ready.set()
        await asyncio.sleep(max(0.0, seconds - 3.0))
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        print(f"flood: {stats}", flush=True)

    asyncio.run(main())


def _signed_headers(port: int) -> dict[str, str]:
    request = AWSRequest(method="GET", url=f"http://127.0.0.1:{port}/{BUCKET}/{KEY}")
    S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(request)
    return dict(request.headers.items())


def _fresh_connection_gets(port: int, count: int) -> tuple[list[float], int]:
    latencies, failures = [], 0
    for _ in range(count):
        start = time.perf_counter()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
            conn.request("GET", f"/{BUCKET}/{KEY}", headers=_signed_headers(port))
            response = conn.getresponse()
            body = response.read()
            conn.close()
            ok = response.status == 200 and len(body) == 64 << 10
        except OSError:
            ok = False
        if ok:
            latencies.append(time.perf_counter() - start)
        else:
            failures += 1
    return latencies, failures


def _pooled_gets(client: Any, count: int) -> tuple[list[float], int]:
    latencies, failures = [], 0
    for _ in range(count):
        start = time.perf_counter()
        try:
            ok = len(client.get_object(Bucket=BUCKET, Key=KEY)["Body"].read()) == 64 << 10
        except Exception:
            ok = False
        if ok:
            latencies.append(time.perf_counter() - start)
        else:
            failures += 1
    return latencies, failures


def _row(way: str, load: str, latencies: list[float], failures: int) -> dict[str, Any]:
    total = len(latencies) + failures
    return {
        "client": way,
        "load": load,
        "gets": total,
        "success_pct": 100.0 * len(latencies) / total if total else float("nan"),
        "p50_ms": percentile(latencies, 0.50) * 1000 if latencies else float("nan"),
        "p99_ms": percentile(latencies, 0.99) * 1000 if latencies else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flood", type=int, default=2000, help="unauthenticated kept-alive connections")
    ap.add_argument("--gets", type=int, default=300, help="GETs per client and load")
    ap.add_argument("--resend", type=float, default=25.0, help="seconds between a flood socket's requests")
    ap.add_argument("--reconnect", type=float, default=25.0, help="seconds before a closed socket reconnects")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="tsp-flood-") as tmp:
        workdir = Path(tmp)
        server = TsproxyProcess(workdir, f"file://{workdir / 'data'}", None)
        rows: list[dict[str, Any]] = []
        try:
            client = server.client()
            client.create_bucket(Bucket=BUCKET)
            client.put_object(Bucket=BUCKET, Key=KEY, Body=bytes(range(256)) * 256)
            for _ in range(20):  # warm: cache, connections, code paths
                client.get_object(Bucket=BUCKET, Key=KEY)["Body"].read()
            ways = {
                "pooled": lambda: _pooled_gets(client, args.gets),
                "fresh-connection": lambda: _fresh_connection_gets(server.port, args.gets),
            }
            for way, run in ways.items():
                rows.append(_row(way, "unloaded", *run()))
            ready = multiprocessing.Event()
            # Long enough for both measured phases; they end it early by terminating the process.
            flood = multiprocessing.Process(
                target=_flood,
                args=(server.port, args.flood, args.resend, args.reconnect, 600.0, ready),
                daemon=True,
            )
            flood.start()
            if not ready.wait(60):
                raise RuntimeError("the flood did not start")
            time.sleep(2.0)  # let it fill every slot it can
            during = server.metrics()
            for way, run in ways.items():
                rows.append(_row(way, f"flood {args.flood}, reconnect {args.reconnect:g}s", *run()))
            after = server.metrics()
            flood.terminate()
            flood.join(10)
        finally:
            server.stop()

    print_table(rows, ["client", "load", "gets", "success_pct", "p50_ms", "p99_ms"])
    print(
        f"\nserver during the flood: connections open {during.get('tsproxy_connections_open', 0):.0f}, "
        f"evicted {after.get('tsproxy_connections_evicted_total', 0):.0f}, "
        f"refused {after.get('tsproxy_connections_refused_total', 0):.0f}"
    )
    for way in ways:
        base = next(r for r in rows if r["client"] == way and r["load"] == "unloaded")
        loaded = next(r for r in rows if r["client"] == way and r["load"] != "unloaded")
        ratio = loaded["p99_ms"] / base["p99_ms"]
        goal = loaded["success_pct"] >= 99.0 and ratio <= 2.0
        verdict = "met" if goal else "missed"
        print(f"{way}: success {loaded['success_pct']:.1f} %, p99 {ratio:.2f}x unloaded: goal {verdict}")
        loaded["p99_vs_unloaded"] = ratio
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
