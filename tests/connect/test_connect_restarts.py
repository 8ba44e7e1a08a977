"""The sink and the export across restarts: the worker stopped (SIGTERM) and killed (SIGKILL) while
records stream in, and tsproxy restarted while the sink uploads a file of several parts.

Measured on the sink side and reported as it is (Kafka Connect's S3 sinks are at least once: a worker
killed after uploading a file but before committing its offsets writes those records again, into a
file named by the same first offset when the batch starts at the same place, otherwise into a file
that overlaps); required: nothing missing there, and every copy equal to the consumer's record.
Required on the export side: each offset exactly once, equal to the consumer's record.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.broker.fixtures import Dataset, Stack
from tests.broker.records import Rec, consume, drafts, produce
from tests.broker.stack import wait_for
from tests.connect.archive import EXPORT_NAME, by_partition, read_export, read_sink_files, run_export
from tests.connect.conftest import Archive
from tests.connect.worker import ConnectWorker, Sink, committed, end_offsets, wait_archived

MIB = 1024 * 1024
pytestmark = pytest.mark.timeout(2400)  # the stack, the data set and three worker restarts


@dataclass
class Live:
    topic: str
    bucket: str
    worker: ConnectWorker
    produced: list[Rec] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # what happened, in order, for the report


def _access_log(stack: Stack) -> list[dict[str, object]]:
    lines = stack.tsproxy.log_path.read_text(errors="replace").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{") and '"tsproxy.access"' in line]


def _ops(stack: Stack, bucket: str, operation: str) -> int:
    return sum(
        1
        for e in _access_log(stack)
        if e.get("operation") == operation and str(e.get("path", "")).startswith(f"/{bucket}/")
    )


def _uploads(stack: Stack, bucket: str) -> int:
    return _ops(stack, bucket, "UploadPart")


def _sizes(stack: Stack, bucket: str, keys: Iterable[str]) -> list[int]:
    client = stack.tsproxy.boto3_client()
    return [client.head_object(Bucket=bucket, Key=k)["ContentLength"] for k in keys]


@pytest.fixture(scope="module")
def live(stack: Stack, connect_folder: Path) -> Iterator[Live]:
    tag = uuid.uuid4().hex[:8]
    topic, bucket = f"live-{tag}", f"live-{tag}"
    stack.broker.create_topic(topic, 1)
    stack.weed.boto3_client().create_bucket(Bucket=bucket)
    sink = Sink(f"s3-live-{tag}", bucket, (topic,), stack.tsproxy.endpoint, "none")
    worker = ConnectWorker(stack.workdir / f"connect-{tag}", connect_folder, stack.broker.bootstrap, [sink])
    run = Live(topic, bucket, worker)
    seed = iter(range(100, 200))

    def burst(count: int, size: int = 2000) -> None:
        run.produced += produce(stack.broker.bootstrap, topic, 0, drafts(next(seed), count, size))

    def streaming(count: int) -> threading.Thread:
        def bursts() -> None:
            for _ in range(5):
                burst(count // 5)

        thread = threading.Thread(target=bursts)
        thread.start()
        return thread

    def written() -> int:
        return committed(stack.broker, f"connect-{sink.name}", topic, 1)[0]

    try:
        burst(800)
        worker.start()
        wait_for(lambda: written() > 0, 300, "the sink committed nothing", worker.log_tail)
        # Stopped while records stream in: the worker writes what it holds and commits on the way out.
        thread = streaming(1500)
        time.sleep(2)
        worker.stop()
        run.events.append(f"worker stopped (SIGTERM) at committed offset {written()}")
        thread.join()
        worker.start()
        thread = streaming(1500)
        # Killed as soon as it completes a new file, before it commits that file's offsets (it commits
        # after the flush): what it uploaded after its last commit is written again.
        files = _ops(stack, bucket, "CompleteMultipartUpload")
        wait_for(
            lambda: _ops(stack, bucket, "CompleteMultipartUpload") > files, 300, "no file after the restart"
        )
        worker.kill()
        run.events.append(f"worker killed (SIGKILL) at committed offset {written()}")
        thread.join()
        worker.start()
        wait_archived(stack.broker, worker, {topic: {0: end_offsets(stack.broker, topic, 1)[0]}})
        # tsproxy restarted during a file of several parts: the worker stopped, 12 MiB produced, the
        # worker started with a long flush interval so the sink holds it all and writes one large file.
        worker.stop()
        burst(1200, 10_000)
        worker.extra = {"offset.flush.interval.ms": "15000"}
        before = _uploads(stack, bucket)
        worker.start()
        wait_for(lambda: _uploads(stack, bucket) > before, 300, "the sink uploaded no part", worker.log_tail)
        stack.tsproxy.stop()
        run.events.append(f"tsproxy stopped after {_uploads(stack, bucket) - before} part(s) of the upload")
        time.sleep(2)
        stack.tsproxy.start()
        deadline = time.monotonic() + 600
        while True:
            try:
                wait_archived(
                    stack.broker, worker, {topic: {0: end_offsets(stack.broker, topic, 1)[0]}}, timeout=30
                )
                break
            except AssertionError as failed:
                assert time.monotonic() < deadline, failed
                if "FAILED" in str(failed):
                    restarted = worker.restart_failed_tasks()
                    run.events.append(f"sink task failed after the tsproxy restart; restarted {restarted}")
        worker.stop()
        run.events.append(f"archived to offset {written()}")
        yield run
    finally:
        worker.kill()
        if not stack.tsproxy.running:
            stack.tsproxy.start()


@dataclass
class Exported:
    records: dict[str, list[Rec]]  # export file name -> its records
    summary: dict[str, object]
    seconds: float


@pytest.fixture(scope="module")
def exported(
    stack: Stack, dataset: Dataset, live: Live, tmp_path_factory: pytest.TempPathFactory
) -> Exported:
    stack.wait_tiered(live.topic, 1)
    out = tmp_path_factory.mktemp("export")
    topics = [*dataset.partitions, live.topic]
    started = time.monotonic()
    done = run_export(
        stack.tsproxy.endpoint, stack.bucket, topics, out / "files", "read_committed", out / "summary.json"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seconds = time.monotonic() - started
    return Exported(read_export(out / "files"), json.loads((out / "summary.json").read_text()), seconds)


def test_sink_lost_nothing_across_restarts_and_its_duplicates_are_copies(
    stack: Stack, live: Live, capsys: pytest.CaptureFixture[str]
) -> None:
    files = read_sink_files(stack.tsproxy.boto3_client(), live.bucket)
    got = by_partition(files.values()).get((live.topic, 0), [])
    want = consume(stack.broker.bootstrap, live.topic, [0], isolation="read_committed")[0]
    assert want == sorted(live.produced, key=lambda r: r.offset)
    counts = Counter(r.offset for r in got)
    sizes = {f.key: size for f, size in zip(files.values(), _sizes(stack, live.bucket, files), strict=True)}
    assert max(sizes.values()) > 5 * MIB, "no file of several parts (the tsproxy restart's)"
    missing = [r.offset for r in want if r.offset not in counts]
    assert missing == []
    by_offset = {r.offset: r for r in want}
    assert all(r == by_offset[r.offset] for r in got)  # every copy is the record itself
    duplicated = sum(n - 1 for n in counts.values())
    overlapping = sum(
        1
        for a, b in zip(
            sorted(files.values(), key=lambda f: f.first_offset),
            sorted(files.values(), key=lambda f: f.first_offset)[1:],
            strict=False,
        )
        if b.first_offset <= a.records[-1].offset
    )
    with capsys.disabled():
        print(
            f"\nsink across restarts: {len(want)} records, {len(files)} files, {duplicated} records written "
            f"twice or more, {overlapping} overlapping files; " + "; ".join(live.events)
        )


def test_export_writes_each_offset_exactly_once_equal_to_the_consumer(
    stack: Stack, dataset: Dataset, live: Live, exported: Exported
) -> None:
    compared = 0
    topics = {**dataset.partitions, live.topic: 1}
    for topic, n in topics.items():
        consumed = consume(stack.broker.bootstrap, topic, range(n), isolation="read_committed")
        for p in range(n):
            names = [k for k in exported.records if k.startswith(f"topic={topic}/partition={p}/")]
            got = sorted((r for k in names for r in exported.records[k]), key=lambda r: r.offset)
            offsets = [r.offset for r in got]
            assert len(offsets) == len(set(offsets)), (topic, p)  # exactly once
            active = stack.broker.local_segments(topic, p)[0]  # the active segment is not tiered
            want = [r for r in consumed[p] if r.offset < active]
            assert want and got == want, (topic, p)
            compared += len(want)
    assert compared == exported.summary["records"]


def test_export_layout_against_the_sinks(archive: Archive, exported: Exported) -> None:
    """Where docs/PIPELINE.md says the export's layout follows the Connect sink: the same folders
    (`topic=<t>/partition=<p>/`) and names (`<t>+<p>+<20 digits>`), another extension; the sink's
    name is the offset of the file's first record, the export's the base offset of its segment (which
    can be a record of an aborted transaction or a marker, left out under read_committed)."""
    sink = read_sink_files(archive.client(), archive.plain)
    sink_folders = {k.rsplit("/", 1)[0] for k in sink}
    export_folders = {
        k.rsplit("/", 1)[0] for k in exported.records if k.split("/", 1)[0][len("topic=") :] in archive.topics
    }
    assert sink_folders == export_folders
    for name, records in exported.records.items():
        match = EXPORT_NAME.match(name)
        assert match, name
        topic, partition, name_topic, name_partition, base = match.groups()
        assert (name_topic, name_partition) == (topic, partition)
        assert not records or records[0].offset >= int(base)
    assert all(f.records[0].offset == f.first_offset for f in sink.values())
    # File boundaries are the sink's flushes on one side and the broker's segments on the other: the
    # names do not match one to one (the first file of a partition does).
    firsts = {(f.topic, f.partition): f.first_offset for f in sink.values() if f.first_offset == 0}
    assert all(f"topic={t}/partition={p}/{t}+{p}+{0:020d}.parquet" in exported.records for (t, p) in firsts)
