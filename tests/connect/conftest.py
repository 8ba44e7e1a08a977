"""Fixtures of the Kafka Connect tests (every test here is `slow`).

- `stack`, `dataset` (session): the real-broker tests' broker, tsproxy and SeaweedFS, and their topics
  (uncompressed, every producer codec, transactions with aborts, segments uploaded in parts), tiered.
- `archive` (session): a standalone Connect worker running two S3 sinks of deploy/kafka/s3-sink.properties
  through that tsproxy, one writing plain JSON lines and one with the sink's own gzip, each into a bucket
  of its own, until each has committed every topic of `dataset` to its end. The worker reads with
  read_committed (deploy/kafka/connect-worker.properties): aborted transactions are not archived.

Skips when the jars of `make kafka-jars` (the worker, or the sink's plugin folder) are missing.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.broker.fixtures import BIG, Dataset, Stack
from tests.connect.worker import ConnectWorker, Sink, connect_jars, wait_archived


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def connect_folder() -> Path:
    jars = connect_jars()
    if jars is None:
        pytest.skip("no Kafka Connect or S3 sink jars: run `make kafka-jars` (docs/CONNECT.md)")
    return jars


@dataclass
class Archive:
    stack: Stack
    worker: ConnectWorker
    plain: str  # bucket of the sink writing JSON lines as they are
    gzipped: str  # bucket of the sink writing them gzipped
    topics: dict[str, int]
    gzipped_topics: tuple[str, ...]

    def client(self) -> Any:
        return self.stack.tsproxy.boto3_client()


@pytest.fixture(scope="session")
def archive(stack: Stack, dataset: Dataset, connect_folder: Path) -> Iterator[Archive]:
    tag = uuid.uuid4().hex[:8]
    plain, gzipped = f"archive-{tag}", f"archive-gz-{tag}"
    for bucket in (plain, gzipped):
        stack.weed.boto3_client().create_bucket(Bucket=bucket)
    topics = tuple(sorted(dataset.partitions))
    # The gzip sink archives the topics with headers, nulls, every codec and aborted transactions; the
    # big compressible one only goes through the plain sink (the machine's CPU is the limit here).
    gz_topics = tuple(t for t in topics if t != BIG)
    endpoint = stack.tsproxy.endpoint
    worker = ConnectWorker(
        stack.workdir / "connect",
        connect_folder,
        stack.broker.bootstrap,
        [
            Sink(f"s3-archive-{tag}", plain, topics, endpoint, "none"),
            Sink(f"s3-archive-gz-{tag}", gzipped, gz_topics, endpoint, "gzip"),
        ],
    )
    try:
        worker.start()
        targets = {
            t: {p: dataset.committed[(t, p)][-1].offset + 1 for p in range(n)}
            for t, n in dataset.partitions.items()
        }
        wait_archived(stack.broker, worker, targets)
        worker.stop()
        yield Archive(stack, worker, plain, gzipped, dict(dataset.partitions), gz_topics)
    finally:
        worker.kill()
        for bucket in (plain, gzipped):
            stack.weed.remove_bucket(bucket)
        shutil.rmtree(stack.workdir / "connect", ignore_errors=True)
