"""A standalone Kafka Connect worker running Aiven's S3 sink, started from the deploy files.

- `connect_jars()`: the worker and connector jars `make kafka-jars` put in the cache (None if missing).
- `ConnectWorker`: `ConnectStandalone` with deploy/kafka/connect-worker.properties and
  deploy/kafka/s3-sink.properties, with only the settings those files name as filled in changed (free
  REST port, offsets file in its work folder); stop (SIGTERM: the worker flushes and commits), SIGKILL,
  and start again with the same consumer group, so it resumes from the offsets the sink committed.
- `properties()`: a deploy file with some settings put in place.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.broker.stack import ACCESS_KEY, LOG4J2, SECRET_KEY, ChildProcess, KafkaBroker, _tail, wait_for
from tests.support.ports import HOST, free_port
from tests.support.seaweed import _die_with_parent

ROOT = Path(__file__).resolve().parents[2]
JARS_SCRIPT = ROOT / "deploy" / "kafka" / "connect-jars.sh"
WORKER_CONFIG = ROOT / "deploy" / "kafka" / "connect-worker.properties"
SINK_CONFIG = ROOT / "deploy" / "kafka" / "s3-sink.properties"
CONNECTOR_CLASS = "io.aiven.kafka.connect.s3.AivenKafkaConnectS3SinkConnector"
# Settings of the deploy files that the tests fill in (each must be in its file).
WORKER_FILLED_IN = ("bootstrap.servers", "listeners", "offset.storage.file.filename", "plugin.path")
SINK_FILLED_IN = ("name", "topics", "aws.s3.endpoint", "aws.s3.bucket.name", "file.compression.type")
# The tests flush every second instead of every minute: files are small and many, restarts land mid-way.
FAST_FLUSH = {"offset.flush.interval.ms": "1000"}


def connect_jars() -> Path | None:
    """The folder with `connect/` and `plugins/s3-sink/` jars, or None if either is missing."""
    try:
        out = subprocess.run(["sh", str(JARS_SCRIPT), "--dir"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    folder = Path(out.stdout.strip())
    if not (folder / ".complete").exists() or not any((folder / "plugins" / "s3-sink").glob("*.jar")):
        return None
    return folder


def properties(path: Path, overrides: dict[str, str], filled_in: tuple[str, ...]) -> str:
    """The properties file at `path` with `overrides` put in place (appended when new)."""
    lines = path.read_text().splitlines()
    present = {line.split("=", 1)[0].strip() for line in lines if "=" in line and not line.startswith("#")}
    missing = [key for key in filled_in if key not in present]
    assert not missing, f"{path} lost settings the tests fill in: {missing}"
    out, done = [], set()
    for line in lines:
        key = line.split("=", 1)[0].strip() if "=" in line and not line.startswith("#") else None
        if key is not None and key in overrides:
            out.append(f"{key}={overrides[key]}")
            done.add(key)
        else:
            out.append(line)
    out += ["", "# ----- added by tests/connect -----"]
    out += [f"{k}={v}" for k, v in overrides.items() if k not in done]
    return "\n".join(out) + "\n"


def deploy_setting(path: Path, key: str) -> str:
    """The value of `key` in the properties file at `path`."""
    for line in path.read_text().splitlines():
        if line.startswith(key + "="):
            return line.split("=", 1)[1]
    raise AssertionError(f"{path} has no {key}")


@dataclass
class Sink:
    """One S3 sink connector: what it archives, where, and with which of the connector's compressions."""

    name: str
    bucket: str
    topics: tuple[str, ...]
    endpoint: str  # the S3 endpoint it writes to (a tsproxy, or the store itself)
    compression: str = "none"
    extra: dict[str, str] = field(default_factory=dict)

    def properties(self) -> dict[str, str]:
        settings = {
            "name": self.name,
            "topics": ",".join(self.topics),
            "aws.s3.endpoint": self.endpoint,
            "aws.s3.bucket.name": self.bucket,
            "file.compression.type": self.compression,
        }
        if self.compression == "gzip":  # as the deploy file says: the connector adds no extension itself
            settings["file.name.template"] = deploy_setting(SINK_CONFIG, "file.name.template") + ".gz"
        settings.update(self.extra)
        return settings


@dataclass
class ConnectWorker(ChildProcess):
    """ConnectStandalone running `sinks`, on a free REST port."""

    workdir: Path
    jars: Path
    bootstrap: str
    sinks: list[Sink]
    credentials: tuple[str, str] = (ACCESS_KEY, SECRET_KEY)
    extra: dict[str, str] = field(default_factory=dict)
    heap: str = "512m"
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.log_path = self.workdir / "connect.log"

    @property
    def rest(self) -> str:
        return f"http://{HOST}:{self.port}"

    def worker_properties(self) -> dict[str, str]:
        settings = {
            "bootstrap.servers": self.bootstrap,
            "listeners": self.rest,
            "offset.storage.file.filename": str(self.workdir / "connect.offsets"),
            "plugin.path": str(self.jars / "plugins"),
        }
        settings.update(FAST_FLUSH)
        settings.update(self.extra)
        return settings

    def start(self, timeout: float = 240) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        worker = self.workdir / "worker.properties"
        worker.write_text(properties(WORKER_CONFIG, self.worker_properties(), WORKER_FILLED_IN))
        sink_files = []
        for sink in self.sinks:
            path = self.workdir / f"{sink.name}.properties"
            path.write_text(properties(SINK_CONFIG, sink.properties(), SINK_FILLED_IN))
            sink_files.append(str(path))
        (self.workdir / "log4j2.properties").write_text(LOG4J2)
        env = dict(os.environ, TSPROXY_ACCESS_KEY=self.credentials[0], TSPROXY_SECRET_KEY=self.credentials[1])
        java = [
            "java",
            "-Xms128m",
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            "-cp",
            str(self.jars / "connect" / "*"),
            "org.apache.kafka.connect.cli.ConnectStandalone",
            str(worker),
            *sink_files,
        ]
        with open(self.log_path, "ab") as log:
            log.write(b"--- start\n")
            self.process = subprocess.Popen(
                java,
                cwd=self.workdir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent(),  # a test run killed outright leaves no worker behind
            )
        self.wait_running(timeout)

    def wait_running(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"connect exited with {self.process.returncode}:\n{self.log_tail()}")
            states = self.task_states()
            if len(states) == len(self.sinks) and all(s == ["RUNNING"] for s in states.values()):
                return
            if any("FAILED" in s for s in states.values()):
                raise RuntimeError(f"a sink task failed: {states}\n{self.log_tail()}")
            time.sleep(0.5)
        raise RuntimeError(f"connect not running after {timeout:.0f}s:\n{self.log_tail()}")

    def _get(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(f"{self.rest}{path}", timeout=5) as r:
                return json.loads(r.read())
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def task_states(self) -> dict[str, list[str]]:
        """Each connector's task states from the REST API (empty while the worker does not answer)."""
        out = {}
        for sink in self.sinks:
            doc = self._get(f"/connectors/{sink.name}/status")
            if doc:
                out[sink.name] = [t.get("state", "") for t in doc.get("tasks", [])]
        return out

    def restart_failed_tasks(self) -> int:
        """Restart every FAILED task through the REST API; how many were."""
        restarted = 0
        for sink in self.sinks:
            doc = self._get(f"/connectors/{sink.name}/status") or {}
            for task in doc.get("tasks", []):
                if task.get("state") == "FAILED":
                    request = urllib.request.Request(
                        f"{self.rest}/connectors/{sink.name}/tasks/{task['id']}/restart", method="POST"
                    )
                    with urllib.request.urlopen(request, timeout=10):
                        restarted += 1
        return restarted

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM: the worker stops the tasks, which write what they hold, and commits their offsets."""
        self.terminate(timeout)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 80) -> str:
        return _tail(self.log_path, lines)


def end_offsets(broker: KafkaBroker, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "ends-" + uuid.uuid4().hex})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def committed(broker: KafkaBroker, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The offsets the sink's consumer group (connect-<name>) committed; negative where none; {} while
    the broker cannot tell yet."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition

    # The group coordinator still loading (or moving) answers so without marking the error retriable.
    not_yet = {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
    }

    admin = broker.admin()
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])
    try:
        result = admin.list_consumer_group_offsets([request])[group].result(30)
    except KafkaException as failed:
        if failed.args and (failed.args[0].retriable() or failed.args[0].code() in not_yet):
            return {}
        raise
    return {tp.partition: tp.offset for tp in result.topic_partitions}


def wait_archived(
    broker: KafkaBroker, worker: ConnectWorker, targets: dict[str, dict[int, int]], timeout: float = 900
) -> None:
    """Until every sink of `worker` committed each partition of its topics up to `targets` (the offset
    after the last record it reads there: Connect commits that, not its consumer's position, so a
    transaction marker at the end of a partition is never passed)."""

    def done() -> bool:
        states = worker.task_states()
        assert not any("FAILED" in s for s in states.values()), f"{states}\n{worker.log_tail()}"
        for sink in worker.sinks:
            for topic in sink.topics:
                want = targets[topic]
                if committed(broker, f"connect-{sink.name}", topic, len(want)) != want:
                    return False
        return True

    wait_for(done, timeout, f"the sinks did not commit {targets}", lambda: worker.log_tail(40))
