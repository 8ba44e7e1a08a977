"""A real Kafka broker with Aiven's tiered storage plugin, writing through `tsproxy serve` into SeaweedFS.

- `kafka_jars()`: the broker and plugin jars `make kafka-jars` put in the cache (None if missing).
- `TsproxyServer`: `tsproxy serve` as a subprocess through the installed entry point, its TOML written
  to a work folder; stop, SIGKILL and start again on the same port with the same cache and key ring.
- `KafkaBroker`: a one-node KRaft broker started from deploy/kafka/tiered-broker.properties, with only
  ports, paths, the tsproxy endpoint and bucket filled in, plus `FAST_TIERING` (segments go remote
  within seconds). Its log goes to a file that `log_tail()` reads.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.ports import HOST, free_port
from tests.support.seaweed import _die_with_parent

ROOT = Path(__file__).resolve().parents[2]
JARS_SCRIPT = ROOT / "deploy" / "kafka" / "jars.sh"
BROKER_CONFIG = ROOT / "deploy" / "kafka" / "tiered-broker.properties"
ACCESS_KEY = "broker-" + uuid.uuid4().hex[:8]
SECRET_KEY = uuid.uuid4().hex + uuid.uuid4().hex[:8]
REGION = "us-east-1"
PART_SIZE = 5 * 1024 * 1024  # the plugin's multipart part size in the tests (S3's minimum)

# What the tests add to the deploy file: everything happens within seconds instead of minutes.
FAST_TIERING = {
    "remote.log.manager.task.interval.ms": "1000",
    "log.retention.check.interval.ms": "1000",
    "log.segment.delete.delay.ms": "1000",
    "log.initial.task.delay.ms": "1000",
    "rlmm.config.remote.log.metadata.topic.num.partitions": "1",
    "group.initial.rebalance.delay.ms": "0",
    # One partition for each internal topic instead of 50: the broker starts and loads them faster.
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.num.partitions": "1",
    "rsm.config.storage.s3.multipart.upload.part.size": str(PART_SIZE),
    # A failed copy is tried again on the next task run; keep the wait between them short.
    "remote.log.manager.copier.thread.pool.size": "2",
}
# Settings of the deploy file that the tests fill in (each must be in the file).
FILLED_IN = (
    "controller.quorum.voters",
    "listeners",
    "advertised.listeners",
    "log.dirs",
    "remote.log.storage.manager.class.path",
    "rsm.config.storage.s3.endpoint.url",
    "rsm.config.storage.s3.bucket.name",
)


def kafka_jars() -> Path | None:
    """The folder with `broker/` and `plugin/` jars from `make kafka-jars`, or None if it is not complete."""
    try:
        out = subprocess.run(["sh", str(JARS_SCRIPT), "--dir"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    folder = Path(out.stdout.strip())
    if not (folder / ".complete").exists() or not any((folder / "plugin").glob("*.jar")):
        return None
    return folder


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def tsproxy_binary() -> str:
    """The `tsproxy` console script of the running Python's environment."""
    beside = Path(sys.executable).parent / "tsproxy"
    if beside.exists():
        return str(beside)
    found = shutil.which("tsproxy")
    if found is None:
        raise RuntimeError("the tsproxy entry point is not installed (pip install -e .)")
    return found


class ChildProcess:
    """A process a test starts and owns: whether it runs, a graceful stop, a kill."""

    process: subprocess.Popen[bytes] | None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def terminate(self, timeout: float) -> None:
        """SIGTERM (a graceful stop), SIGKILL if it outlasts `timeout`."""
        if self.running:
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def kill(self) -> None:
        if self.running:
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            self.process.wait(10)


@dataclass
class TsproxyServer(ChildProcess):
    """`tsproxy serve` in front of a SeaweedFS; a `start()` after `stop()`/`kill()` keeps port and state."""

    workdir: Path
    backend_endpoint: str
    backend_keys: tuple[str, str]
    settings: dict[str, Any] = field(default_factory=dict)
    port: int = 0
    metrics_port: int = 0
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.metrics_port = self.metrics_port or free_port()
        self.key_ring = self.workdir / "ring.json"
        self.cache_dir = self.workdir / "cache"
        self.config_path = self.workdir / "tsproxy.toml"
        self.log_path = self.workdir / "tsproxy.log"
        if not self.key_ring.exists():
            self.cli("keys", "init", "--key-ring", str(self.key_ring), "--id", "kek-1")

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def cli(self, *args: str, timeout: float = 300) -> str:
        """Run `tsproxy ARGS` with this server's configuration in the environment; its stdout."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TSPROXY_")}
        # Spark's Python workers (tsproxy jobs) must run this interpreter, not the first python3 on PATH.
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        if self.config_path.exists():
            env["TSPROXY_CONFIG"] = str(self.config_path)
        proc = subprocess.run(
            [tsproxy_binary(), *args],
            cwd=self.workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"tsproxy {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            )
        return proc.stdout

    def _write_config(self) -> None:
        values: dict[str, Any] = {
            "listen": f"{HOST}:{self.port}",
            "metrics_listen": f"{HOST}:{self.metrics_port}",
            "backend": self.backend_endpoint,
            "backend_region": REGION,
            "backend_access_key": self.backend_keys[0],
            "backend_secret_key": self.backend_keys[1],
            "key_ring": str(self.key_ring),
            "key_ring_check": "1s",
            "cache_dir": str(self.cache_dir),
            "cache_size": "512MiB",
            "region": REGION,
            "backend_check": "2s",
        }
        values.update(self.settings)
        lines = [f"{k} = {_toml(v)}" for k, v in values.items()]
        lines += [
            "",
            "[[credentials]]",
            f"access_key = {_toml(ACCESS_KEY)}",
            f"secret_key = {_toml(SECRET_KEY)}",
        ]
        self.config_path.write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 60) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        self._write_config()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TSPROXY_")}
        with open(self.log_path, "ab") as log:
            log.write(b"--- start\n")
            self.process = subprocess.Popen(
                [tsproxy_binary(), "serve", "--config", str(self.config_path)],
                cwd=self.workdir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent(),  # a test run killed outright leaves no server behind
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tsproxy exited with {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://{HOST}:{self.metrics_port}/readyz", timeout=2) as r:
                    if r.status == 200:
                        return
            time.sleep(0.1)
        raise RuntimeError(f"tsproxy not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 40) -> None:
        self.terminate(timeout)

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://{HOST}:{self.metrics_port}/metrics", timeout=10) as r:
            text: str = r.read().decode()
            return text

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` whose labels include `labels`."""
        total = 0.0
        for line in self.metrics_text().splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            metric, _, label_text = head.partition("{")
            if metric != name:
                continue
            found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', label_text))
            if all(found.get(k) == v for k, v in labels.items()):
                total += float(value)
        return total

    def boto3_client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=Config(
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                retries={"max_attempts": 5, "mode": "standard"},
            ),
        )

    def log_tail(self, lines: int = 60) -> str:
        return _tail(self.log_path, lines)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def broker_properties(overrides: dict[str, str]) -> str:
    """deploy/kafka/tiered-broker.properties with `overrides` put in place (or appended if new)."""
    lines = BROKER_CONFIG.read_text().splitlines()
    present = {line.split("=", 1)[0].strip() for line in lines if "=" in line and not line.startswith("#")}
    missing = [key for key in FILLED_IN if key not in present]
    assert not missing, f"{BROKER_CONFIG} lost settings the tests fill in: {missing}"
    out = []
    done = set()
    for line in lines:
        key = line.split("=", 1)[0].strip() if "=" in line and not line.startswith("#") else None
        if key is not None and key in overrides:
            out.append(f"{key}={overrides[key]}")
            done.add(key)
        else:
            out.append(line)
    out.append("")
    out.append("# ----- added by tests/broker -----")
    out += [f"{k}={v}" for k, v in overrides.items() if k not in done]
    return "\n".join(out) + "\n"


LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c{1})%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.kafkaorg.name = org.apache.kafka
logger.kafkaorg.level = INFO
logger.rlm.name = kafka.log.remote
logger.rlm.level = INFO
logger.rlmorg.name = org.apache.kafka.server.log.remote
logger.rlmorg.level = INFO
logger.aiven.name = io.aiven
logger.aiven.level = INFO
"""


@dataclass
class KafkaBroker(ChildProcess):
    """One KRaft node (broker and controller) on free loopback ports."""

    workdir: Path
    jars: Path
    tsproxy_endpoint: str
    bucket: str
    extra: dict[str, str] = field(default_factory=dict)
    credentials: tuple[str, str] = (ACCESS_KEY, SECRET_KEY)  # the S3 key pair the plugin signs with
    heap: str = "1g"
    port: int = 0
    controller_port: int = 0
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.controller_port = self.controller_port or free_port()
        self.log_dir = self.workdir / "data"
        self.log_path = self.workdir / "broker.log"
        self.config_path = self.workdir / "server.properties"

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def properties(self) -> dict[str, str]:
        settings = {
            "controller.quorum.voters": f"1@{HOST}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self.port}",
            "log.dirs": str(self.log_dir),
            "remote.log.storage.manager.class.path": str(self.jars / "plugin" / "*"),
            "rsm.config.storage.s3.endpoint.url": self.tsproxy_endpoint,
            "rsm.config.storage.s3.bucket.name": self.bucket,
        }
        settings.update(FAST_TIERING)
        settings.update(self.extra)
        return settings

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            "java",
            "-Xms256m",
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            "-cp",
            str(self.jars / "broker" / "*"),
            main,
            *args,
        ]

    def start(self, timeout: float = 120) -> None:
        self.config_path.write_text(broker_properties(self.properties()))
        (self.workdir / "log4j2.properties").write_text(LOG4J2)
        if not (self.log_dir / "meta.properties").exists():
            cluster_id = subprocess.run(
                self._java("kafka.tools.StorageTool", "random-uuid"),
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            formatted = subprocess.run(
                self._java(
                    "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.config_path)
                ),
                capture_output=True,
                text=True,
            )
            if formatted.returncode != 0:
                raise RuntimeError(f"kafka storage format failed:\n{formatted.stdout}\n{formatted.stderr}")
        env = dict(os.environ, TSPROXY_ACCESS_KEY=self.credentials[0], TSPROXY_SECRET_KEY=self.credentials[1])
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self._java("kafka.Kafka", str(self.config_path)),
                cwd=self.workdir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent(),  # a test run killed outright leaves no server behind
            )
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"kafka exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                metadata = admin.list_topics(timeout=2)
                if metadata.brokers:
                    return
            except Exception:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"kafka not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, name: str, partitions: int = 1, **configs: str) -> None:
        from confluent_kafka.admin import NewTopic

        settings = {
            "remote.storage.enable": "true",
            "segment.bytes": str(1024 * 1024),
            "local.retention.bytes": "1",
            "file.delete.delay.ms": "1000",
        }
        settings.update({k.replace("_", "."): v for k, v in configs.items()})
        admin = self.admin()
        futures = admin.create_topics([NewTopic(name, partitions, 1, config=settings)])
        for future in futures.values():
            future.result(60)

    def delete_topic(self, name: str) -> None:
        admin = self.admin()
        for future in admin.delete_topics([name]).values():
            future.result(60)

    def local_segments(self, topic: str, partition: int) -> list[int]:
        """Base offsets of the segment files in the broker's log dir (files marked deleted left out)."""
        folder = self.log_dir / f"{topic}-{partition}"
        return sorted(int(p.name[:-4]) for p in folder.glob("*.log"))

    def stop(self, timeout: float = 30) -> None:
        self.terminate(timeout)

    def log_tail(self, lines: int = 80) -> str:
        return _tail(self.log_path, lines)


def wait_for(check: Any, timeout: float, what: str, on_fail: Any = None) -> Any:
    """Poll `check()` until it returns something true; fail with `what` and `on_fail()` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            detail = on_fail() if on_fail else ""
            raise AssertionError(f"{what} (after {timeout:.0f}s)\n{detail}")
        time.sleep(0.5)


@contextlib.contextmanager
def running(thing: Any) -> Iterator[Any]:
    thing.start()
    try:
        yield thing
    finally:
        thing.stop()
