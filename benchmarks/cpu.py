"""CPU seconds tsproxy spends per GiB uploaded and per GiB served cold, against this machine's bare limit.

The bare limit is the primitive work the same bytes need, done in this process with the libraries tsproxy
uses, on the same chunks, measured in the same run:

- upload: zstd at tsproxy's level (kept only when smaller, as tsproxy does), AES-256-GCM seal, the MD5
  of the part for its ETag (which also answers a Content-MD5 check), the SHA-256 of the payload when the
  client signs it, the CRC32 when it sends one, and the MD5 of the stored bytes that tsproxy sends its
  backend as Content-MD5;
- cold read: AES-256-GCM open and zstd inflate of every chunk once.

The bare limit leaves out what serving a read costs whatever the server does to the bytes: the HTTP
exchange and the copy into the client's socket. So each read scenario is also run, with the same
client and ranges, against a bare aiohttp server in its own process that holds the segment in memory
(`benchmarks/http_floor.py --serve`: no signature check, no backend, no cache, no decoding); its CPU
seconds per GiB are the serving floor, and `ratio_over_floor` is tsproxy's time over bare limit plus
floor. The goal stays the issue's (`ratio`); the floor says how much of the rest an aiohttp server
pays with no work of its own.

tsproxy runs as `tsproxy serve` in its own process over a real SeaweedFS (fetch_support.TsproxySystem,
default settings: 4 MiB chunks, compression auto, encryption on). Its CPU time (user + system, all
threads) comes from /proc/<pid>/stat before and after each scenario, once the process has gone quiet.
The client's CPU time (signing, hashing what it sends, reading answers) is this process's own and is
reported apart; so is SeaweedFS'.

Scenarios: a Kafka segment (uncompressed v2 batches with JSON-like values, which tsproxy compresses)
uploaded as a broker's plugin does, multipart with 25 MiB parts sent one after another, once per
`--client-checks` mode (none: UNSIGNED-PAYLOAD; md5: Content-MD5; sha256: signed payload; or both;
crc32: aws-chunked with a CRC32 trailer, as current SDKs send by default);
then, on a freshly started tsproxy with an empty cache each time, a consumer's sequential 1 MiB fetches
to the end, and the plugin's 4 MiB chunk reads to the end. Every byte read is checked.

`--profile DIR` attaches py-spy (`pip install py-spy`) to tsproxy for each scenario and prints the
functions where its samples fall; the figures of a profiled run carry the profiler's cost.

    .venv/bin/python benchmarks/cpu.py [--size 256] [--client-checks none,sha256+md5] [--json out.json]
        [--setting cache_direct_io=true]
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from common import add_setting_option, best_of, free_port, markdown, settings_of, start_seaweed
from fetch_support import (
    CHUNK_BYTES,
    MIB,
    PART_BYTES,
    LeanS3,
    SeaweedFS,
    TsproxySystem,
    boto3_client,
    build_segment,
    chunk_reads,
    consumer_fetches,
    lean_client,
)

from tsproxy import defaults

GIB = 1 << 30
SEGMENT_KEY = "clicks-AAAAAAAAAAAAAAAAAAAAAA/0/00000000000000000000-BBBBBBBBBBBBBBBBBBBBBB.log"
CLIENT_CHECKS = ("none", "md5", "sha256", "sha256+md5", "crc32")
TRAILER_CHUNK = 64 << 10  # payload bytes per aws-chunked chunk in crc32 mode
UPLOAD = "upload 25MiB parts, 1 in flight"
SEQ_COLD = "seq 1MiB cold"
CHUNKS_COLD = "chunks 4MiB cold"
COLUMNS = (
    "scenario",
    "client_checks",
    "gib",
    "tsproxy_cpu_s",
    "tsproxy_s_per_gib",
    "bare_s_per_gib",
    "ratio",
    "client_s_per_gib",
    "seaweedfs_s_per_gib",
    "wall_s",
    "floor_s_per_gib",
    "ratio_over_floor",
)
TICK = os.sysconf("SC_CLK_TCK")


# -- CPU time of a process ---------------------------------------------------------------------------


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads, from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # fields from the third (state) on
    return (int(fields[11]) + int(fields[12])) / TICK


def quiet_cpu(pid: int, interval: float = 0.5, limit: float = 20.0) -> float:
    """The process's CPU seconds once it used none for `interval` seconds (or after `limit` seconds):
    start-up work and replies still in flight are not counted in the next scenario."""
    deadline = time.monotonic() + limit
    previous = process_cpu(pid)
    while time.monotonic() < deadline:
        time.sleep(interval)
        current = process_cpu(pid)
        if current - previous < 1 / TICK + 1e-9:
            return current
        previous = current
    return previous


# -- the client --------------------------------------------------------------------------------------


class CheckingClient(LeanS3):
    """LeanS3 that can also sign the payload (x-amz-content-sha256 = its hex SHA-256) and send a
    Content-MD5, as SDKs do over plain http or when told to."""

    def put_part(  # type: ignore[override]
        self,
        bucket: str,
        key: str,
        upload_id: str,
        number: int,
        body: bytes,
        *,
        sha256: bool,
        md5: bool,
        crc32: bool,
    ) -> str:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        query = f"partNumber={number}&uploadId={urllib.parse.quote(upload_id, safe='')}"
        path = self.path(bucket, key, query)
        headers: dict[str, str] = {}
        if md5:
            headers["Content-MD5"] = base64.b64encode(hashlib.md5(body).digest()).decode()
        if crc32:
            # What current SDKs send by default: aws-chunked, unsigned, with a CRC32 trailer.
            headers["Content-Encoding"] = "aws-chunked"
            headers["X-Amz-Decoded-Content-Length"] = str(len(body))
            headers["X-Amz-Trailer"] = "x-amz-checksum-crc32"
            headers["X-Amz-Content-SHA256"] = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
            crc = base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()
            view = memoryview(body)
            framed = bytearray()
            for pos in range(0, len(body), TRAILER_CHUNK):
                piece = view[pos : pos + TRAILER_CHUNK]
                framed += b"%x\r\n" % len(piece)
                framed += piece
                framed += b"\r\n"
            framed += f"0\r\nx-amz-checksum-crc32:{crc}\r\n\r\n".encode()
            body = bytes(framed)
        else:
            headers["X-Amz-Content-SHA256"] = (
                hashlib.sha256(body).hexdigest() if sha256 else "UNSIGNED-PAYLOAD"
            )
        headers["Content-Length"] = str(len(body))
        signed = AWSRequest(method="PUT", url=self.endpoint + path, headers=headers)
        # With signing "enabled" botocore keeps the X-Amz-Content-SHA256 given above and signs it.
        signed.context["payload_signing_enabled"] = True
        SigV4Auth(self.credentials, "s3", self.region).add_auth(signed)
        conn = self._connection(fresh=True)
        conn.putrequest("PUT", path, skip_accept_encoding=True)
        for name, value in signed.headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        assert conn.sock is not None
        conn.sock.sendall(memoryview(body))
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"UploadPart {number} of {key}: {response.status} {data[:300]!r}")
        return response.getheader("ETag") or ""


def upload(system: TsproxySystem, key: str, data: bytes, checks: str) -> float:
    """A multipart upload in PART_BYTES parts, one after another; returns the client's CPU seconds."""
    sha256, md5, crc32 = "sha256" in checks, "md5" in checks, "crc32" in checks
    begin = time.process_time()
    client = boto3_client(system)
    lean = CheckingClient(system.endpoint, *system.keys)
    upload_id = client.create_multipart_upload(Bucket=system.bucket, Key=key)["UploadId"]
    parts = []
    for number, pos in enumerate(range(0, len(data), PART_BYTES), start=1):
        body = data[pos : pos + PART_BYTES]
        etag = lean.put_part(system.bucket, key, upload_id, number, body, sha256=sha256, md5=md5, crc32=crc32)
        parts.append({"PartNumber": number, "ETag": etag})
    client.complete_multipart_upload(
        Bucket=system.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    return time.process_time() - begin


def read(
    system: TsproxySystem, key: str, ranges: list[tuple[int, int]], expected: bytes
) -> tuple[float, int]:
    """Read `ranges` one after another; (client CPU seconds outside the checks, bytes served)."""
    client = lean_client(system)
    cpu = 0.0
    served = 0
    for start, end in ranges:
        begin = time.process_time()
        body = client.get_range(system.bucket, key, start, end)
        cpu += time.process_time() - begin
        if body != expected[start:end]:
            raise AssertionError(f"bytes {start}-{end - 1} of {key} read back wrong")
        served += len(body)
    return cpu, served


# -- the serving floor -------------------------------------------------------------------------------

HTTP_FLOOR = Path(__file__).with_name("http_floor.py")


@contextlib.contextmanager
def serving_floor(data: bytes, workdir: Path) -> Iterator[tuple[int, LeanS3]]:
    """A bare aiohttp server of `data` in its own process: (its pid, a client of it)."""
    path = workdir / "floor-segment"
    path.write_bytes(data)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(HTTP_FLOOR), "--serve", str(path), "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise RuntimeError("the serving floor's server did not start")
        yield server.pid, LeanS3(f"http://127.0.0.1:{port}", "floor", "floor-secret")
    finally:
        server.terminate()
        server.wait(30)


def floor_cpu(pid: int, client: LeanS3, ranges: list[tuple[int, int]], expected: bytes) -> float:
    """The floor server's CPU seconds per GiB for `ranges`, every answer checked."""
    before = quiet_cpu(pid)
    served = 0
    for start, end in ranges:
        if client.get_range("floor", "segment", start, end) != expected[start:end]:
            raise AssertionError(f"the floor server answered bytes {start}-{end - 1} wrong")
        served += end - start
    return (quiet_cpu(pid) - before) / (served / GIB)


# -- the bare limit ----------------------------------------------------------------------------------


def bare_limit(
    data: bytes, chunk_size: int, level: int, runs: int = 3, *, compress_chunks: bool = True
) -> tuple[dict[str, float], float]:
    """CPU seconds of each primitive over `data`, chunk by chunk as tsproxy cuts it, and the stored size.
    compress_chunks False: tsproxy stores the chunks as they are (batches the producer compressed), so
    they are sealed uncompressed and "zstd compress" is what it would have cost (not part of the limit)."""
    import zstandard
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    view = memoryview(data)
    chunks = [view[i : i + chunk_size] for i in range(0, len(data), chunk_size)]
    aead = AESGCM(os.urandom(32))
    nonce, aad = os.urandom(12), os.urandom(24)
    compressor = zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=True)

    def compress() -> list[bytes | memoryview]:
        out: list[bytes | memoryview] = []
        for chunk in chunks:
            packed = compressor.compress(chunk)
            out.append(packed if len(packed) < len(chunk) else chunk)
        return out

    payloads = compress() if compress_chunks else list(chunks)
    sealed = [aead.encrypt(nonce, p, aad) for p in payloads]
    stored = sum(len(s) for s in sealed)
    decompressor = zstandard.ZstdDecompressor()

    def digest(kind: str, pieces: list[Any]) -> None:
        h = hashlib.new(kind)
        for piece in pieces:
            h.update(piece)
        h.digest()

    def inflate() -> None:
        for payload, chunk in zip(payloads, chunks, strict=True):
            if len(payload) < len(chunk):
                decompressor.decompress(payload, max_output_size=len(chunk))

    seconds = {
        "zstd compress": best_of(runs, compress),
        "aes-gcm seal": best_of(runs, lambda: [aead.encrypt(nonce, p, aad) for p in payloads]),
        "md5 of payload": best_of(runs, lambda: digest("md5", chunks)),
        "sha256 of payload": best_of(runs, lambda: digest("sha256", chunks)),
        "crc32 of payload": best_of(runs, lambda: [zlib.crc32(c) for c in chunks]),
        "md5 of stored": best_of(runs, lambda: digest("md5", sealed)),
        "aes-gcm open": best_of(runs, lambda: [aead.decrypt(nonce, s, aad) for s in sealed]),
        "zstd inflate": best_of(runs, inflate),
    }
    return seconds, stored


def upload_primitives(checks: str, compressed: bool = True) -> tuple[str, ...]:
    """What an upload's bytes need: one MD5 of the payload serves both the ETag and a Content-MD5."""
    needed: tuple[str, ...] = ("zstd compress",) if compressed else ()
    needed += ("aes-gcm seal", "md5 of payload", "md5 of stored")
    return (
        needed
        + (("sha256 of payload",) if "sha256" in checks else ())
        + (("crc32 of payload",) if "crc32" in checks else ())
    )


READ_PRIMITIVES = ("aes-gcm open", "zstd inflate")


# -- profiling ---------------------------------------------------------------------------------------


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


@contextlib.contextmanager
def profiled(pid: int, out: Path | None) -> Iterator[None]:
    """py-spy sampling `pid` for the duration of the block, its raw (collapsed) stacks written to `out`."""
    if out is None:
        yield
        return
    spy = py_spy()
    if spy is None:
        raise RuntimeError("--profile needs py-spy: pip install py-spy")
    args = [spy, "record", "--pid", str(pid), "--native", "--threads", "-r", "100", "-f", "raw"]
    recorder = subprocess.Popen([*args, "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)
        try:
            recorder.wait(60)
        except subprocess.TimeoutExpired:
            recorder.kill()


# Frames a thread sits in while it waits (for a lock, the GIL, a queue, the event loop's poll): py-spy
# cannot tell those samples from working ones in every environment, so they are left out.
IDLE_FRAMES = (
    "epoll_wait",
    "epoll_pwait",
    "PyThread_acquire_lock_timed",
    "take_gil",
    "pthread_cond_wait",
    "pthread_cond_timedwait",
    "sem_clockwait",
    "sem_timedwait",
    "select (",
    "poll (",
)


def hot_spots(raw: Path, top: int = 15) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]]:
    """From py-spy's collapsed stacks, idle samples left out: (working samples, the share of them by
    innermost Python frame, the share by innermost native frame). Threads are merged."""
    python: collections.Counter[str] = collections.Counter()
    native: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if not f.startswith(("thread ", "process "))]
        if not frames or any(marker in f for f in frames for marker in IDLE_FRAMES):
            continue
        n = int(count)
        total += n
        python[next((f for f in reversed(frames) if ".py:" in f), "(no Python frame)")] += n
        leaf = frames[-1]
        # An unresolved address names only its library (in libc: memcpy, memset, syscalls, malloc).
        native[leaf.split(" ", 1)[1] if leaf.startswith("0x") else leaf] += n
    if not total:
        return 0, [], []
    return (
        total,
        [(f, n / total) for f, n in python.most_common(top)],
        [(f, n / total) for f, n in native.most_common(top)],
    )


# -- the run -----------------------------------------------------------------------------------------


def parse_checks(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or any(n not in CLIENT_CHECKS for n in names):
        raise argparse.ArgumentTypeError(
            f"client checks are a comma-separated subset of {','.join(CLIENT_CHECKS)}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=256, help="segment size in MiB (default 256; 1024 for 1 GiB)")
    ap.add_argument(
        "--client-checks",
        type=parse_checks,
        default=["none", "sha256+md5"],
        help=f"upload once per mode, of {','.join(CLIENT_CHECKS)} (default none,sha256+md5)",
    )
    ap.add_argument("--json", help="write the rows here as a JSON list")
    ap.add_argument(
        "--profile", type=Path, help="sample tsproxy with py-spy; raw stacks go to this directory"
    )
    ap.add_argument(
        "--workdir", type=Path, help="keep tsproxy's logs and caches here (default: a temporary dir)"
    )
    ap.add_argument(
        "--producer-codec",
        choices=("none", "gzip", "snappy", "lz4", "zstd"),
        default="none",
        help="the segment's batches compressed by their producer: tsproxy stores them uncompressed, and the "
        "bare limit then has no zstd (default none)",
    )
    add_setting_option(ap, "cache_direct_io=false")
    args = ap.parse_args(argv)
    if args.size < 8:
        ap.error("--size must be at least 8 (MiB)")
    settings = settings_of(ap, args)

    load_before = os.getloadavg()[0]
    codec = ("none", "gzip", "snappy", "lz4", "zstd").index(args.producer_codec)
    segment = build_segment(args.size * MIB, codec=codec)
    data = segment.data
    gib = len(data) / GIB
    print(f"segment: {len(data) / MIB:.1f} MiB, {len(segment.positions)} batches", file=sys.stderr)

    primitives, stored = bare_limit(
        data, defaults.CHUNK_SIZE, defaults.COMPRESSION_LEVEL, compress_chunks=not codec
    )
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    profiles: list[tuple[str, Path]] = []

    def measure(
        system: TsproxySystem, weed: SeaweedFS, name: str, checks: str, work: Callable[[], tuple[float, int]]
    ) -> None:
        assert system.process is not None
        pid = system.process.pid
        out = None if args.profile is None else args.profile / f"{name.split()[0]}-{checks}.txt"
        with profiled(pid, out):
            before, weed_before = quiet_cpu(pid), process_cpu(weed.process.pid)
            begin = time.perf_counter()
            client_cpu, served = work()
            wall = time.perf_counter() - begin
            after, weed_after = quiet_cpu(pid), process_cpu(weed.process.pid)
        if out is not None:
            profiles.append((f"{name} ({checks})", out))
        served_gib = served / GIB
        needed = upload_primitives(checks, not codec) if name == UPLOAD else READ_PRIMITIVES
        # The bare work is the object's, whatever overlap the reads had: each chunk decoded once.
        bare = sum(primitives[p] for p in needed)
        row = {
            "scenario": name,
            "client_checks": checks,
            "gib": served_gib,
            "tsproxy_cpu_s": after - before,
            "tsproxy_s_per_gib": (after - before) / served_gib,
            "bare_s_per_gib": bare / served_gib,
            "ratio": (after - before) / bare,
            "client_s_per_gib": client_cpu / served_gib,
            "seaweedfs_s_per_gib": (weed_after - weed_before) / served_gib,
            "wall_s": wall,
            "bare_parts": {p: primitives[p] / gib for p in needed},
        }
        rows.append(row)
        print(f"  {name:32} {checks:11} ratio {row['ratio']:.2f}", file=sys.stderr)

    with contextlib.ExitStack() as stack:
        tmp = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tsp-cpu-")))
        weed = start_seaweed()
        stack.callback(weed.stop)
        system = TsproxySystem(weed, "cpu-tsproxy", tmp / "tsproxy", settings=settings)
        stack.callback(system.stop)
        for checks in args.client_checks:
            key = f"{SEGMENT_KEY}.{checks.replace('+', '-')}"
            measure(
                system,
                weed,
                UPLOAD,
                checks,
                lambda key=key, checks=checks: (upload(system, key, data, checks), len(data)),
            )
        key = f"{SEGMENT_KEY}.{args.client_checks[0].replace('+', '-')}"
        # One floor server for both read scenarios (it writes the segment out and reads it back once).
        floor_pid, floor_client = stack.enter_context(serving_floor(data, tmp))
        for name, ranges in (
            (SEQ_COLD, consumer_fetches(segment)),
            (CHUNKS_COLD, chunk_reads(len(data), CHUNK_BYTES)),
        ):
            system.go_cold()
            measure(system, weed, name, "-", lambda ranges=ranges: read(system, key, ranges, data))
            floor = floor_cpu(floor_pid, floor_client, ranges, data)
            row = rows[-1]
            row["floor_s_per_gib"] = floor
            row["ratio_over_floor"] = row["tsproxy_s_per_gib"] / (row["bare_s_per_gib"] + floor)

    load_after = os.getloadavg()[0]
    print(
        f"\nCPU seconds per GiB, tsproxy against the bare limit, {len(data) / MIB:.0f} MiB Kafka segment "
        f"({args.producer_codec} batches; stored {stored / len(data):.3f}x its size: "
        f"{f'zstd level {defaults.COMPRESSION_LEVEL}' if not codec else 'uncompressed'}, AES-256-GCM, "
        f"{defaults.CHUNK_SIZE // MIB} MiB chunks; {os.cpu_count()} CPUs, 1-minute load average "
        f"{load_before:.1f} before, {load_after:.1f} after)\n"
    )
    if settings:
        print("tsproxy settings: " + ", ".join(f"{k} = {v}" for k, v in settings.items()) + "\n")
    print(markdown(rows, COLUMNS))
    print("\nBare limit, CPU seconds per GiB of the segment:\n")
    print(
        markdown(
            [{"primitive": p, "s_per_gib": s / gib} for p, s in primitives.items()],
            ("primitive", "s_per_gib"),
        )
    )
    print("\nGoal (<= 1.3x the bare limit):")
    for row in rows:
        verdict = "PASS" if row["ratio"] <= 1.3 else "FAIL"
        over = row.get("ratio_over_floor")
        beside = "" if over is None else f" ({over:.2f}x the bare limit plus the serving floor)"
        print(f"  {verdict}  {row['scenario']} ({row['client_checks']}): {row['ratio']:.2f}x{beside}")
    for title, raw in profiles:
        samples, python, native = hot_spots(raw)
        print(f"\nprofile of {title}: {samples} working samples ({raw})")
        print("  innermost Python frame:")
        for frame, share in python:
            print(f"    {share * 100:5.1f}%  {frame}")
        print("  innermost native frame:")
        for frame, share in native:
            print(f"    {share * 100:5.1f}%  {frame}")
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
