"""What a real consumer reads from tiered segments equals what was produced, record for record.

The broker's plugin uploaded every closed segment through tsproxy (compressed and encrypted into
SeaweedFS) and the broker deleted its local copies, so all but the active segment are read back
through tsproxy: the plugin's manifest GET, its ranged GETs of `.indexes` and of one chunk of `.log`
at a time.
"""

from __future__ import annotations

import json

from tests.broker.fixtures import BIG, BIG_SEGMENT, CODECS, PLAIN, TXN, Dataset, Stack
from tests.broker.records import consume
from tests.broker.stack import PART_SIZE


def _access_log(stack: Stack) -> list[dict[str, object]]:
    lines = stack.tsproxy.log_path.read_text(errors="replace").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{") and '"tsproxy.access"' in line]


def test_every_record_read_back_from_remote_segments(stack: Stack, dataset: Dataset) -> None:
    gets_before = stack.tsproxy.metric("tsproxy_requests_total", operation="GetObject")
    for topic, n in dataset.partitions.items():
        got = consume(stack.broker.bootstrap, topic, range(n))
        for p in range(n):
            want = dataset.produced[(topic, p)]
            assert len(got[p]) == len(want), (topic, p)
            for read, produced in zip(got[p], want, strict=True):
                assert read == produced, (topic, p, read.offset)
            # All but the active segment came from remote storage: the broker kept one local file.
            active = stack.broker.local_segments(topic, p)
            assert len(active) == 1 and active[0] > want[0].offset
    assert stack.tsproxy.metric("tsproxy_requests_total", operation="GetObject") > gets_before


def test_read_committed_returns_exactly_the_committed_records(stack: Stack, dataset: Dataset) -> None:
    got = consume(stack.broker.bootstrap, TXN, [0], isolation="read_committed")[0]
    committed = dataset.committed[(TXN, 0)]
    assert got == committed
    aborted = len(dataset.produced[(TXN, 0)]) - len(committed)
    assert aborted > 0
    # The aborted transactions' records are in remote segments too, and read_uncommitted sees them.
    everything = consume(stack.broker.bootstrap, TXN, [0])[0]
    assert everything == dataset.produced[(TXN, 0)]


def test_producer_codecs_and_record_shapes_survive(dataset: Dataset) -> None:
    """The data set holds what the comparison above is meant to cover (so it cannot pass vacuously)."""
    assert sorted(dataset.codecs.values()) == ["gzip", "lz4", "snappy", "zstd"]
    records = [r for (topic, _), recs in dataset.produced.items() if topic in (PLAIN, CODECS) for r in recs]
    assert any(r.key is None for r in records) and any(r.value is None for r in records)
    assert any(r.value == b"" for r in records)
    assert any(v is None for r in records for _, v in r.headers)
    assert max(len(r.value or b"") for r in records) >= 200_000


def test_segments_larger_than_a_part_went_up_as_multipart_uploads(stack: Stack, dataset: Dataset) -> None:
    prefix = stack.topic_prefix(BIG)
    logs = {k: size for k, size in stack.client_keys(prefix).items() if k.endswith(".log")}
    assert logs and all(size > PART_SIZE for size in logs.values())
    assert max(logs.values()) <= BIG_SEGMENT
    uploads = [
        e
        for e in _access_log(stack)
        if e.get("operation") == "UploadPart"
        and str(e.get("path", "")).startswith(f"/{stack.bucket}/{prefix}")
    ]
    assert len(uploads) >= 2 * len(logs)
    assert all(e["status"] == 200 for e in uploads)
