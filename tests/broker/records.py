"""Producing records to the real broker and reading them back with a real consumer (confluent-kafka).

A record is compared whole: offset, timestamp, key, value and headers (None and empty kept apart).
Every value that is not None holds `MARK`, a string unique to the test run, so a scan of the object
store's files for it finds any record value stored in the clear.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MARK = ("tsproxy-broker-" + uuid.uuid4().hex[:16]).encode()
# Near now: the broker applies retention.ms (7 days by default) to record timestamps.
BASE_TS = int(time.time() * 1000) - 7_200_000
Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class Rec:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass(frozen=True)
class Draft:
    """A record to produce (its offset is known once the broker acknowledges it)."""

    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers


def text_value(rng: random.Random, n: int, size: int) -> bytes:
    """Kafka-like JSON lines that compress about 4x, with MARK in them, about `size` bytes."""
    users = ("alice", "bob", "carol", "dave", "erin", "frank")
    out = bytearray(b'{"mark":"' + MARK + b'","n":%d,"events":[' % n)
    while len(out) < size:
        out += b'{"user":"%s","event":"%s","amount":%.2f,"session":"%08x"},' % (
            rng.choice(users).encode(),
            rng.choice((b"click", b"view", b"purchase", b"search")),
            rng.random() * 100,
            rng.getrandbits(32),
        )
    out += b"]}"
    return bytes(out)


def noisy_value(rng: random.Random, n: int, size: int) -> bytes:
    """Hex noise (compresses about 2x) with MARK in front: a producer's codec still makes segments roll."""
    return MARK + b":%d:" % n + rng.randbytes(max(1, size // 2)).hex().encode()


def drafts(
    seed: int, count: int, size: int, *, noisy: bool = False, big_every: int = 0, big_size: int = 0
) -> list[Draft]:
    """`count` records: keys (some None), headers (some with None values, some none), null values,
    empty values, and every `big_every`-th record `big_size` bytes."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        key = None if i % 7 == 3 else b"key-%d-%d" % (seed, i % 50)
        if i % 11 == 5:
            value: bytes | None = None
        elif i % 13 == 6:
            value = b""
        else:
            n = big_size if big_every and i % big_every == big_every - 1 else rng.randint(size // 2, size)
            value = noisy_value(rng, i, n) if noisy else text_value(rng, i, n)
        headers: Headers = ()
        if i % 3 == 0:
            headers = (("trace", b"t-%d" % i), ("empty", b""), ("none", None))
        elif i % 3 == 1:
            headers = (("k", b"v"), ("k", b"second value of the same name"))
        out.append(Draft(BASE_TS + seed * 10_000 + i * 3, key, value, headers))
    return out


def producer_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 20,
        "batch.size": 256 * 1024,
        "message.max.bytes": 1_000_000,
        "enable.idempotence": True,
        "acks": "all",
    }
    config.update(extra)
    return config


def _deliver(producer: Any, topic: str, partition: int, batch: Sequence[Draft], sink: list[Any]) -> None:
    def report(err: Any, msg: Any, draft: Draft | None = None) -> None:
        sink.append((err, draft, None if msg is None else msg.offset()))

    for draft in batch:
        while True:
            try:
                producer.produce(
                    topic,
                    value=draft.value,
                    key=draft.key,
                    partition=partition,
                    timestamp=draft.timestamp,
                    headers=list(draft.headers) or None,
                    on_delivery=lambda err, msg, d=draft: report(err, msg, d),
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)


def _recs(sink: list[Any]) -> list[Rec]:
    failed = [err for err, _, _ in sink if err is not None]
    assert not failed, f"produce failed: {failed[:3]}"
    return [Rec(offset, d.timestamp, d.key, d.value, d.headers) for _, d, offset in sink]


def produce(bootstrap: str, topic: str, partition: int, batch: Sequence[Draft], **config: Any) -> list[Rec]:
    """Produce `batch` to one partition; the records as the broker stored them (with offsets)."""
    from confluent_kafka import Producer

    producer = Producer(producer_config(bootstrap, **config))
    sink: list[Any] = []
    _deliver(producer, topic, partition, batch, sink)
    assert producer.flush(120) == 0, "records left unsent"
    return sorted(_recs(sink), key=lambda r: r.offset)


def produce_transactions(
    bootstrap: str, topic: str, partition: int, transactions: Iterable[tuple[bool, Sequence[Draft]]]
) -> tuple[list[Rec], list[Rec]]:
    """Each (commit?, records) in its own transaction: (every record, the committed records)."""
    from confluent_kafka import Producer

    producer = Producer(producer_config(bootstrap, **{"transactional.id": "tx-" + uuid.uuid4().hex[:8]}))
    producer.init_transactions(60)
    every: list[Rec] = []
    committed: list[Rec] = []
    for commit, batch in transactions:
        sink: list[Any] = []
        producer.begin_transaction()
        _deliver(producer, topic, partition, batch, sink)
        producer.flush(120)
        if commit:
            producer.commit_transaction(60)
        else:
            producer.abort_transaction(60)
        recs = _recs(sink)
        every += recs
        if commit:
            committed += recs
    return sorted(every, key=lambda r: r.offset), sorted(committed, key=lambda r: r.offset)


def consume(
    bootstrap: str,
    topic: str,
    partitions: Sequence[int],
    *,
    isolation: str = "read_uncommitted",
    timeout: float = 180,
    group: str | None = None,
) -> dict[int, list[Rec]]:
    """Every record of the partitions from the earliest offset to the end, as a consumer sees it.

    Fails on any consumer error (a failed remote fetch reaches the consumer as one)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group or "check-" + uuid.uuid4().hex[:8],
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            "fetch.max.bytes": 4 * 1024 * 1024,
        }
    )
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions
        }
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        got: dict[int, list[Rec]] = {p: [] for p in partitions}
        done: set[int] = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + timeout
        while len(done) < len(partitions):
            assert time.monotonic() < deadline, f"consumer did not reach the end of {topic} {ends}"
            for msg in consumer.consume(500, 1.0):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        position = consumer.position([TopicPartition(topic, msg.partition())])[0].offset
                        if position >= ends[msg.partition()]:
                            done.add(msg.partition())
                        continue
                    raise AssertionError(f"consumer error on {topic}: {err}")
                _, ts = msg.timestamp()
                headers = tuple((k, v) for k, v in (msg.headers() or []))
                got[msg.partition()].append(Rec(msg.offset(), ts, msg.key(), msg.value(), headers))
        return got
    finally:
        consumer.close()
