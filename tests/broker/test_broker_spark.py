"""tsproxy's Spark source (`tiered-kafka`, Aiven layout) reads what the real plugin wrote, through
tsproxy, and returns exactly the records a consumer reads from those segments (the active segment is
still on the broker only, so it is left out of the comparison)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.broker.fixtures import CODECS, PLAIN, TXN, Dataset, Stack
from tests.broker.records import Rec
from tests.broker.stack import ACCESS_KEY, REGION, SECRET_KEY

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from tsproxy.spark.session import spark_session

    session = spark_session(
        "local[2]",
        "tsproxy-broker-tests",
        {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
        },
    )
    yield session


def _read(spark: Any, stack: Stack, topics: str, isolation: str) -> dict[tuple[str, int], list[Rec]]:
    frame = (
        spark.read.format("tiered-kafka")
        .option("endpoint", stack.tsproxy.endpoint)
        .option("bucket", stack.bucket)
        .option("accessKey", ACCESS_KEY)
        .option("secretKey", SECRET_KEY)
        .option("region", REGION)
        .option("topics", topics)
        .option("includeHeaders", "true")
        .option("isolationLevel", isolation)
        .load()
        .selectExpr("topic", "partition", "offset", "unix_millis(timestamp) AS ts", "key", "value", "headers")
    )
    out: dict[tuple[str, int], list[Rec]] = {}
    for row in frame.collect():
        headers = tuple(
            (h["key"], None if h["value"] is None else bytes(h["value"])) for h in row["headers"] or []
        )
        key = None if row["key"] is None else bytes(row["key"])
        value = None if row["value"] is None else bytes(row["value"])
        out.setdefault((row["topic"], row["partition"]), []).append(
            Rec(row["offset"], row["ts"], key, value, headers)
        )
    return {k: sorted(v, key=lambda r: r.offset) for k, v in out.items()}


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_spark_source_returns_what_the_consumer_reads(
    spark: Any, stack: Stack, dataset: Dataset, isolation: str
) -> None:
    """What the consumer reads is what was produced (test_broker_roundtrip), so the records produced
    stand for it here. BIG is left out: more of the same uncompressed batches, and slow in Spark."""
    if isolation == "read_uncommitted":
        topics, expected = [PLAIN, CODECS, TXN], dataset.produced
    else:
        topics, expected = [TXN], dataset.committed
    got = _read(spark, stack, ",".join(topics), isolation)
    compared = 0
    for topic in topics:
        for p in range(dataset.partitions[topic]):
            remote_end = stack.broker.local_segments(topic, p)[0]  # the active segment's base offset
            want = [r for r in expected[(topic, p)] if r.offset < remote_end]
            assert want, (topic, p)
            assert got.get((topic, p), []) == want, (topic, p)
            compared += len(want)
    assert compared > (5_000 if isolation == "read_uncommitted" else 500)
    assert set(got) == {(t, p) for t in topics for p in range(dataset.partitions[t])}
