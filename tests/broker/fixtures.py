"""The real-broker stack and its dataset, shared by every test that needs a broker (tests/broker and
tests/connect): registered once in tests/conftest.py, so one session starts one broker.

- `stack` (session): a SeaweedFS of its own, a `tsproxy serve` subprocess in front of it and a Kafka
  4.0 broker whose tiered storage is Aiven's plugin pointed at that tsproxy. Skips when the jars of
  `make kafka-jars` are missing. The SeaweedFS is not the session's: that tsproxy's janitor runs every
  2 s and removes uploads quiet for 10 s in every bucket of its store (it maps buckets one to one), so
  on the shared store it would end the uploads of every test that runs after it.
- `dataset` (session): topics produced once and tiered (every closed segment remote, its local copy
  gone): uncompressed over three partitions, one partition per producer codec, transactions with
  aborts, and a topic whose segments are multipart uploads. Tests read it; none changes it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.broker.records import Rec, drafts, produce, produce_transactions
from tests.broker.stack import PART_SIZE, KafkaBroker, TsproxyServer, kafka_jars, wait_for
from tests.support.seaweed import SeaweedFS

MIB = 1024 * 1024
# Larger than the plugin's part size: these segments go up as multipart uploads.
BIG_SEGMENT = 2 * PART_SIZE + MIB


@dataclass
class Stack:
    weed: SeaweedFS
    tsproxy: TsproxyServer
    broker: KafkaBroker
    bucket: str
    workdir: Path

    def s3(self) -> object:
        """A boto3 client of the SeaweedFS behind tsproxy (what the store really holds)."""
        return self.weed.boto3_client()

    def stored_keys(self, prefix: str = "") -> dict[str, int]:
        """Keys under `prefix` in the backend bucket with their stored sizes."""
        client = self.weed.boto3_client()
        out: dict[str, int] = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                out[obj["Key"]] = obj["Size"]
        return out

    def client_keys(self, prefix: str = "") -> dict[str, int]:
        """Keys under `prefix` as clients see them through tsproxy, with their original sizes."""
        client = self.tsproxy.boto3_client()
        out: dict[str, int] = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                out[obj["Key"]] = obj["Size"]
        return out

    def topic_prefix(self, topic: str) -> str:
        """The plugin's key prefix of a topic: `<topic>-<topic id>/`."""
        keys = [k for k in self.client_keys(topic + "-") if k.startswith(topic + "-") and "/" in k]
        prefixes = {k.split("/", 1)[0] + "/" for k in keys if len(k.split("/", 1)[0]) == len(topic) + 23}
        assert len(prefixes) == 1, f"expected one key prefix for {topic}, found {sorted(prefixes)}"
        return prefixes.pop()

    def logs(self) -> str:
        return (
            f"--- broker log {self.broker.log_path}\n{self.broker.log_tail(80)}\n"
            f"--- tsproxy log {self.tsproxy.log_path}\n{self.tsproxy.log_tail(30)}"
        )

    def wait_tiered(self, topic: str, partitions: int, timeout: float = 180) -> None:
        """Until every closed segment of the topic is remote and its local copy gone."""

        def tiered() -> bool:
            for p in range(partitions):
                local = self.broker.local_segments(topic, p)
                if len(local) != 1 or local[0] == 0:
                    return False
            return True

        wait_for(tiered, timeout, f"segments of {topic} not tiered", self.logs)


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    jars = kafka_jars()
    if jars is None:
        pytest.skip("no Kafka broker and tiered storage plugin jars: run `make kafka-jars`")
    if shutil.which("java") is None:
        pytest.skip("no java on PATH")
    # A folder of its own (not pytest's numbered ones, which other runs on the machine rotate away),
    # kept when TSP_KEEP_BROKER_DIR is set, for reading the logs after the run.
    workdir = Path(tempfile.mkdtemp(prefix="tsp-broker-"))
    bucket = "kafka-tiered-" + uuid.uuid4().hex[:8]
    seaweed = SeaweedFS.start()
    tsproxy: TsproxyServer | None = None
    broker: KafkaBroker | None = None
    try:
        seaweed.boto3_client().create_bucket(Bucket=bucket)
        tsproxy = TsproxyServer(
            workdir / "tsproxy",
            seaweed.endpoint,
            (seaweed.access_key, seaweed.secret_key),
            settings={"janitor_interval": "2s", "leftover_age": "10s"},
        )
        tsproxy.start()
        broker = KafkaBroker(workdir / "broker", jars, tsproxy.endpoint, bucket)
        broker.start()
        yield Stack(seaweed, tsproxy, broker, bucket, workdir)
    finally:
        if broker is not None:
            broker.stop()
        if tsproxy is not None:
            tsproxy.stop()
        seaweed.stop()
        if not os.environ.get("TSP_KEEP_BROKER_DIR"):
            shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class Dataset:
    # (topic, partition) -> the records as produced (read_uncommitted), and the committed ones
    produced: dict[tuple[str, int], list[Rec]] = field(default_factory=dict)
    committed: dict[tuple[str, int], list[Rec]] = field(default_factory=dict)
    partitions: dict[str, int] = field(default_factory=dict)
    codecs: dict[int, str] = field(default_factory=dict)


PLAIN, CODECS, TXN, BIG = "plain", "codecs", "txn", "big"


@pytest.fixture(scope="session")
def dataset(stack: Stack) -> Dataset:
    broker = stack.broker
    data = Dataset()
    broker.create_topic(PLAIN, 3)
    broker.create_topic(CODECS, 4)
    broker.create_topic(TXN, 1)
    broker.create_topic(BIG, 1, segment_bytes=str(BIG_SEGMENT))
    data.partitions = {PLAIN: 3, CODECS: 4, TXN: 1, BIG: 1}

    for p in range(3):  # uncompressed; small records and some of 200 KiB
        batch = drafts(10 + p, 1400, 2000, big_every=150, big_size=200_000)
        data.produced[(PLAIN, p)] = produce(broker.bootstrap, PLAIN, p, batch)
    for p, codec in enumerate(("gzip", "snappy", "lz4", "zstd")):
        data.codecs[p] = codec
        batch = drafts(20 + p, 1500, 2400, noisy=True, big_every=200, big_size=120_000)
        data.produced[(CODECS, p)] = produce(
            broker.bootstrap, CODECS, p, batch, **{"compression.type": codec}
        )
    transactions = [(i % 3 != 1, drafts(40 + i, 250, 2000)) for i in range(9)]
    every, committed = produce_transactions(broker.bootstrap, TXN, 0, transactions)
    data.produced[(TXN, 0)] = every
    data.committed[(TXN, 0)] = committed
    # Compressible records, segments of 11 MiB: three 5 MiB parts each.
    data.produced[(BIG, 0)] = produce(broker.bootstrap, BIG, 0, drafts(50, 2600, 10_000))
    for topic, n in data.partitions.items():
        for p in range(n):
            data.committed.setdefault((topic, p), data.produced[(topic, p)])
        stack.wait_tiered(topic, n)
    return data
