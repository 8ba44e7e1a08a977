"""The floor under the fetch benchmark's warm reads: what the client and one loopback HTTP round trip cost.

A bare aiohttp server (uvloop when installed, as tsproxy uses) answers 1 MiB ranged GETs from memory,
with no signature check, cache or decoding, to the same lean SigV4 client that benchmarks/fetch.py uses.
No S3 server answering over HTTP on this machine can do a warm 1 MiB fetch faster than this for that
client; compare its p50 with the warm rows of the fetch table.

With `--serve FILE` it is only that server, in the foreground on `--port`, answering ranged GETs of any
path from FILE's bytes held in memory: benchmarks/cpu.py measures the CPU time it takes to serve a
segment, the part of serving a read that no decoding is in.

    .venv/bin/python benchmarks/http_floor.py [--requests 2000] [--json out.json]
    .venv/bin/python benchmarks/http_floor.py --serve FILE --port N
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from common import MIB, free_port, median, percentile, print_table, write_json
from fetch_support import LeanS3

OBJECT = bytes(range(256)) * (16 * MIB // 256)


def _ranged(data: bytes) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        first, _, last = request.headers["Range"].removeprefix("bytes=").partition("-")
        a, b = int(first), int(last)
        response = web.StreamResponse(status=206, headers={"Content-Range": f"bytes {a}-{b}/{len(data)}"})
        response.content_length = b - a + 1
        await response.prepare(request)
        await response.write(memoryview(data)[a : b + 1])
        await response.write_eof()
        return response

    return handler


def _serve(port: int, started: threading.Event, data: bytes = OBJECT) -> None:
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", _ranged(data))
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    started.set()
    loop.run_forever()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--json", help="write the rows here as a JSON list")
    ap.add_argument("--serve", type=Path, help="only serve this file's bytes, in the foreground")
    ap.add_argument("--port", type=int, help="with --serve: the port")
    args = ap.parse_args()
    if args.serve is not None:
        started = threading.Event()

        def announce() -> None:
            started.wait()
            print("ready", flush=True)

        threading.Thread(target=announce, daemon=True).start()
        _serve(args.port, started, args.serve.read_bytes())
        return 0
    port = free_port()
    started = threading.Event()
    threading.Thread(target=_serve, args=(port, started), daemon=True).start()
    if not started.wait(30):
        raise RuntimeError("the floor server did not start")
    client = LeanS3(f"http://127.0.0.1:{port}", "floor", "floor-secret")
    latencies = []
    for i in range(args.requests + 100):
        start = (i * MIB + 777) % (len(OBJECT) - MIB)
        t = time.perf_counter()
        data = client.get_range("floor", "segment", start, start + MIB)
        elapsed = time.perf_counter() - t
        if len(data) != MIB:
            raise RuntimeError(f"short answer: {len(data)} bytes")
        if i >= 100:  # the first ones warm up the connection and the allocator
            latencies.append(elapsed)
    rows: list[dict[str, Any]] = [
        {
            "system": "bare aiohttp",
            "scenario": "1 MiB ranged GET from memory",
            "mib_s": len(latencies) / sum(latencies),
            "p50_ms": median(latencies) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000,
        }
    ]
    print_table(rows, ["system", "scenario", "mib_s", "p50_ms", "p99_ms"])
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
