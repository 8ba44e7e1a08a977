"""Fixtures of the Spark pipeline tests.

- `spark` (session): one local[2] SparkSession for every test that needs one (a JVM start costs seconds).
- `tiered` (session): a real tsproxy (embedded local backend) holding Kafka segments built with
  kafka-python's record builder, in the Aiven tiered-storage layout, plus what a reader should get.
- `tiered_weed` (module): the same data written through a tsproxy whose backend is a real SeaweedFS
  (encrypted and compressed there), for reads straight from the backend with the key ring.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.server.harness import ACCESS_KEY, SECRET_KEY, RunningProxy
from tests.spark.kafkadata import BuiltSegment, PartitionWriter, Row, kafka_uuid, upload_aiven
from tsproxy.format import KeyRing

BASE_TS = 1_700_000_000_000
RANGE_SEGMENTS = 6
RANGE_BATCHES = 40  # per segment, 5 records each, 10 ms apart
Headers = tuple[tuple[str, bytes | None], ...]


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from tsproxy.spark.session import spark_session

    session = spark_session(
        "local[2]",
        "tsproxy-tests",
        {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
        },
    )
    yield session
    session.stop()


def build_orders() -> dict[tuple[str, int], PartitionWriter]:
    """Every codec, headers (with null values), null keys and values, transactions, LogAppendTime."""
    p0 = PartitionWriter("orders", 0)
    ts = BASE_TS

    def rows(n: int, tag: str) -> list[tuple[int, bytes | None, bytes | None, Headers]]:
        nonlocal ts
        out: list[tuple[int, bytes | None, bytes | None, Headers]] = []
        for i in range(n):
            key = None if i % 4 == 0 else f"{tag}-key-{i}".encode()
            value = (
                None if i % 9 == 5 else (b"" if i % 9 == 6 else f"{tag}-value-{i}-".encode() * (1 + i % 5))
            )
            headers: Headers = (("trace", f"{tag}{i}".encode()), ("ünïcode", None)) if i % 3 == 1 else ()
            out.append((ts + (i * 7) % 13, key, value, headers))
        ts += 50
        return out

    p0.batch(rows(20, "none"), codec="none")
    p0.batch(rows(20, "gzip"), codec="gzip")
    p0.roll()
    p0.batch(rows(20, "snappy"), codec="snappy")
    p0.batch(rows(20, "lz4"), codec="lz4")
    p0.roll()
    p0.batch(rows(10, "txn"), codec="zstd", transactional=True, producer_id=42)
    p0.marker(commit=True, producer_id=42, timestamp=ts)
    p0.batch(rows(5, "aborted"), codec="none", transactional=True, producer_id=43)
    p0.marker(commit=False, producer_id=43, timestamp=ts)
    p0.roll()
    p0.batch(rows(15, "append"), codec="zstd", log_append_time=ts + 1000)
    p0.batch(rows(15, "zstd"), codec="zstd")
    p0.roll()
    p1 = PartitionWriter("orders", 1, start_offset=1000)
    for n in range(2):
        p1.batch(rows(25, f"p1-{n}"), codec="gzip")
        p1.roll()
    return {("orders", 0): p0, ("orders", 1): p1}


def build_ranges() -> PartitionWriter:
    """One partition, segments of monotonic timestamps: segment n covers n * 2000 .. n * 2000 + 1999 ms."""
    writer = PartitionWriter("ranges", 0, index_interval=1024)
    for seg in range(RANGE_SEGMENTS):
        for b in range(RANGE_BATCHES):
            ts = BASE_TS + seg * 2000 + b * 50
            writer.batch([(ts + i * 10, b"k%d" % i, bytes([65 + b % 26]) * 120, ()) for i in range(5)])
        writer.roll()
    return writer


@dataclass
class Tiered:
    """Segments stored in a tsproxy, and what reading them should give."""

    proxy: RunningProxy
    bucket: str
    prefix: str
    writers: dict[tuple[str, int], PartitionWriter]
    keys: dict[str, str] = field(default_factory=dict)  # segment key -> topic

    def options(self, **extra: str) -> dict[str, str]:
        return {"endpoint": self.proxy.endpoint, "bucket": self.bucket, "prefix": self.prefix,
                "accessKey": ACCESS_KEY, "secretKey": SECRET_KEY, **extra}  # fmt: skip

    def segments(self, topic: str, partition: int = 0) -> list[BuiltSegment]:
        return self.writers[(topic, partition)].segments

    def rows(self, topic: str) -> list[tuple[str, int, Row]]:
        return [
            (t, p, row)
            for (t, p), w in sorted(self.writers.items())
            if t == topic
            for seg in w.segments
            for row in seg.rows
        ]

    def client_gets(self) -> int:
        """GetObject requests the proxy has answered (any status)."""
        total = 0.0
        for metric in self.proxy.proxy.metrics.registry.collect():
            for sample in metric.samples:
                if sample.name == "tsproxy_requests_total" and sample.labels.get("operation") == "GetObject":
                    total += sample.value
        return int(total)

    def bytes_sent(self) -> int:
        value = self.proxy.proxy.metrics.registry.get_sample_value("tsproxy_client_sent_bytes_total")
        return int(value or 0)


def _store(proxy: RunningProxy, writers: dict[tuple[str, int], PartitionWriter]) -> Tiered:
    client = proxy.client()
    bucket = f"tiered-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    tiered = Tiered(proxy, bucket, "cluster-a/", writers)
    topic_ids: dict[str, str] = {}
    for (topic, _), writer in writers.items():
        topic_id = topic_ids.setdefault(topic, kafka_uuid())
        for key in upload_aiven(client, bucket, tiered.prefix, writer.segments, topic_id):
            tiered.keys[key] = topic
    return tiered


def _all_writers() -> dict[tuple[str, int], PartitionWriter]:
    return {**build_orders(), ("ranges", 0): build_ranges()}


@pytest.fixture(scope="session")
def tiered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiered]:
    tmp = tmp_path_factory.mktemp("tiered")
    KeyRing.new().save(tmp / "ring.json")
    proxy = RunningProxy({"backend": f"file://{tmp / 'data'}", "cache_dir": str(tmp / "cache"),
                          "key_ring": str(tmp / "ring.json"), "chunk_size": "64KiB",
                          "metadata_ttl": "0s"})  # fmt: skip
    try:
        yield _store(proxy, _all_writers())
    finally:
        proxy.stop()


@dataclass
class WeedTiered(Tiered):
    """Segments written through a tsproxy into SeaweedFS; read back straight from SeaweedFS."""

    weed: Any = None
    ring: Path | None = None

    def direct_options(self, **extra: str) -> dict[str, str]:
        return {"endpoint": self.weed.endpoint, "bucket": self.bucket, "prefix": self.prefix,
                "accessKey": self.weed.access_key, "secretKey": self.weed.secret_key,
                "keyRing": str(self.ring), **extra}  # fmt: skip


@pytest.fixture(scope="module")
def tiered_weed(tmp_path_factory: pytest.TempPathFactory, seaweed: Any) -> Iterator[WeedTiered]:
    tmp = tmp_path_factory.mktemp("tiered-weed")
    ring = tmp / "ring.json"
    KeyRing.new().save(ring)
    proxy = RunningProxy({"backend": seaweed.endpoint, "backend_access_key": seaweed.access_key,
                          "backend_secret_key": seaweed.secret_key, "cache_dir": str(tmp / "cache"),
                          "key_ring": str(ring), "chunk_size": "64KiB", "compression": "on",
                          "metadata_ttl": "0s"})  # fmt: skip
    try:
        base = _store(proxy, _all_writers())
        yield WeedTiered(**{**base.__dict__, "weed": seaweed, "ring": ring})
    finally:
        proxy.stop()
        seaweed.remove_bucket(base.bucket)
