"""Archive export: tiered segments to Parquet (zstd), one file per source segment, exactly once.

Layout, like the Kafka Connect S3 sink's (Hive-style directories, so Spark finds topic and partition):

    <output>/topic=<topic>/partition=<p>/<topic>+<p>+<20-digit base offset>.parquet          (partition)
    <output>/topic=<topic>/year=YYYY/month=MM/day=dd/hour=HH/<topic>+<p>+<base>.parquet     (hourly, UTC)

A file is named by its source segment, so a rerun replaces it instead of adding a duplicate, and each
file appears whole or not at all (see output.py). After a segment's files are in place its marker is
written under `_tsproxy_export/done/`; an incremental run lists those markers (one listing) and skips
the segments they name. A marker's name also carries the next offset after what was exported, so a
segment uploaded later that overlaps an exported one (a new leader re-uploading) is exported only from
where the earlier one stopped.

Each segment is decoded and written by one Python worker; on Spark, small segments share a task (see
pack_tasks), and without Spark (the single-process baseline of the benchmark) it is a plain loop.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tsproxy.kafka.indexes import aborted_overlapping
from tsproxy.kafka.records import DecodeStats

from .arrow import arrow_schema
from .bucket import Bucket
from .catalog import ListedSegment, aborted_transactions, list_segments
from .options import PARTITION_BY, Bound, OptionError, ReadOptions, StoreOptions
from .output import Output, open_output
from .planning import Piece, order_segments
from .reading import read_piece

STATE_DIR = "_tsproxy_export/done/"
ROW_GROUP_ROWS = 1 << 17
ROW_GROUP_BYTES = 64 << 20  # a row group is written at whichever limit comes first
MIN_GROUP_BYTES = 8 << 20  # segments per Spark task: see pack_tasks
MAX_GROUP_BYTES = 256 << 20
HOUR_MS = 3_600_000
_MARKER = re.compile(r"(?P<stem>[^/@]+)@(?P<next>\d{20})\.json")


@dataclass(frozen=True)
class ExportJob:
    """What to export and where; plain values, shipped to every task."""

    source: ReadOptions
    output: str  # a filesystem path or s3://bucket/prefix
    output_store: StoreOptions | None = None  # endpoint and credentials of an S3 output
    partition_by: str = "partition"
    incremental: bool = True
    compression_level: int | None = None  # zstd level; None: pyarrow's default

    def __post_init__(self) -> None:
        if self.partition_by not in PARTITION_BY:
            raise OptionError(f"export: partition-by must be one of {', '.join(PARTITION_BY)}")

    def open_output(self) -> Output:
        return open_output(self.output, self.output_store)


@dataclass(frozen=True)
class SegmentTask:
    """One segment to export, with the offsets it owns (see planning.order_segments)."""

    key: str
    topic: str
    partition: int
    base_offset: int
    size: int
    min_offset: int | None = None
    max_offset: int | None = None
    aborted: tuple[tuple[int, int, int], ...] = ()  # read_committed: see planning.Piece

    @property
    def stem(self) -> str:
        """The segment object's file name without `.log` (base offset and, for Aiven, segment id)."""
        return self.key.rsplit("/", 1)[-1].removesuffix(".log")

    @property
    def file_name(self) -> str:
        return f"{self.topic}+{self.partition}+{self.base_offset:020d}.parquet"


@dataclass(frozen=True)
class SegmentResult:
    """What exporting one segment did."""

    key: str
    files: tuple[str, ...]
    records: int
    bytes_in: int  # segment bytes decoded
    bytes_out: int  # Parquet bytes written
    seconds: float
    next_offset: int
    cpu_seconds: float = 0.0  # CPU time of the process while exporting it (its read-ahead thread included)
    corrupt_batches: int = 0  # corrupt stretches of record batches skipped (skip_corrupt)


@dataclass
class ExportSummary:
    """Totals of one export run."""

    segments: int = 0
    skipped: int = 0
    records: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    files: int = 0
    seconds: float = 0.0
    corrupt_batches: int = 0  # corrupt stretches of record batches skipped (skip_corrupt) ...
    corrupt_segments: int = 0  # ... in this many segments
    # Seconds spent exporting segments, summed over the tasks that did it: the per-byte work, apart from
    # Spark's start, planning and per-task costs (seconds - task_seconds / cores is about the fixed cost).
    task_seconds: float = 0.0
    results: list[SegmentResult] = field(default_factory=list, repr=False)

    def add(self, result: SegmentResult) -> None:
        self.segments += 1
        self.corrupt_batches += result.corrupt_batches
        self.corrupt_segments += 1 if result.corrupt_batches else 0
        self.records += result.records
        self.bytes_in += result.bytes_in
        self.bytes_out += result.bytes_out
        self.task_seconds += result.seconds
        self.files += len(result.files)
        self.results.append(result)

    def as_dict(self) -> dict[str, Any]:
        """Totals as JSON-ready values (without the per-segment results)."""
        doc = asdict(self)
        doc.pop("results")
        return doc

    def table(self) -> str:
        """A few aligned lines for a terminal."""
        secs = max(self.seconds, 1e-9)
        rows = [
            ("segments exported", f"{self.segments:,} ({self.skipped:,} already exported, skipped)"),
            ("records", f"{self.records:,}"),
            ("segment bytes read", _size(self.bytes_in)),
            ("parquet bytes written", f"{_size(self.bytes_out)} in {self.files:,} files"),
            ("seconds", f"{self.seconds:.1f}"),
            ("throughput", f"{_size(self.bytes_in / secs)}/s, {self.records / secs:,.0f} records/s"),
        ]
        if self.corrupt_batches:
            where = f"in {self.corrupt_segments:,} segment{'' if self.corrupt_segments == 1 else 's'}"
            rows.insert(2, ("corrupt batches skipped", f"{self.corrupt_batches:,} stretches {where}"))
        width = max(len(k) for k, _ in rows)
        return "export summary\n" + "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


# -- planning ---------------------------------------------------------------------------------------


def read_markers(output: Output) -> dict[tuple[str, int], dict[str, int]]:
    """Exported segments by (topic, partition): segment stem -> next offset after what was exported."""
    done: dict[tuple[str, int], dict[str, int]] = defaultdict(dict)
    for path in output.list(STATE_DIR):
        parts = path[len(STATE_DIR) :].split("/")
        if len(parts) != 3 or not (parts[1].isascii() and parts[1].isdigit()):
            continue
        m = _MARKER.fullmatch(parts[2])
        if m is not None:
            done[(parts[0], int(parts[1]))][m["stem"]] = int(m["next"])
    return dict(done)


def plan_export(job: ExportJob, bucket: Bucket, output: Output) -> tuple[list[SegmentTask], int]:
    """The segments to export (largest first, for an even spread) and how many were skipped as done."""
    found = list_segments(bucket, job.source)
    done = read_markers(output) if job.incremental else {}
    tasks: list[SegmentTask] = []
    skipped = 0
    for (topic, partition), listed in sorted(found.items()):
        exported = done.get((topic, partition), {})
        covered = sorted((_stem_offset(stem), nxt) for stem, nxt in exported.items())
        for seg, upper in order_segments([s.segment for s in listed]):
            task = SegmentTask(seg.key, topic, partition, seg.base_offset, seg.size, None, upper)
            if task.stem in exported:
                skipped += 1
                continue
            # An earlier export may already hold the start of this segment's offsets.
            reached = max((nxt for base, nxt in covered if base < seg.base_offset), default=seg.base_offset)
            if reached > seg.base_offset:
                task = replace(task, min_offset=reached)
            tasks.append(task)
    if job.source.read_committed:
        tasks = _with_aborted(bucket, found, tasks)
    tasks.sort(key=lambda t: (-t.size, t.key))
    return tasks, skipped


def _with_aborted(
    bucket: Bucket, found: dict[tuple[str, int], list[ListedSegment]], tasks: list[SegmentTask]
) -> list[SegmentTask]:
    """The tasks with the aborted transactions touching their offsets. Transaction indexes are read
    only from each partition's first segment still to export on (see catalog.aborted_transactions)."""
    starts: dict[tuple[str, int], Bound] = {}
    for t in tasks:
        tp = (t.topic, t.partition)
        if tp not in starts or t.base_offset < starts[tp].value:
            starts[tp] = Bound("offset", t.base_offset)
    aborted = aborted_transactions(bucket, {tp: found[tp] for tp in starts}, starts)
    return [
        replace(t, aborted=aborted_overlapping(aborted[(t.topic, t.partition)], t.base_offset, t.max_offset))
        for t in tasks
    ]


def _stem_offset(stem: str) -> int:
    digits = stem[:20]
    return int(digits) if digits.isascii() and digits.isdigit() else 0


# -- one segment ------------------------------------------------------------------------------------


class _ParquetFile:
    """One output file being written under a temporary name, a row group at a time."""

    def __init__(self, output: Output, path: str, schema: pa.Schema, level: int | None) -> None:
        self.output, self.path = output, path
        self.temp = output.temp_file(path)
        self.writer = pq.ParquetWriter(
            str(self.temp),
            schema,
            compression="zstd",
            compression_level=level,
            use_dictionary=["topic", "timestampType"],
        )
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = self.pending_bytes = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self.pending.append(batch)
        self.pending_rows += batch.num_rows
        self.pending_bytes += batch.nbytes
        if self.pending_rows >= ROW_GROUP_ROWS or self.pending_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            self.writer.write_table(pa.Table.from_batches(self.pending))
            self.pending, self.pending_rows, self.pending_bytes = [], 0, 0

    def commit(self) -> int:
        self._flush()
        self.writer.close()
        return self.output.commit(self.temp, self.path)

    def discard(self) -> None:
        try:
            self.writer.close()
        finally:
            self.output.discard(self.temp)


def _routes(job: ExportJob, task: SegmentTask, batch: pa.RecordBatch) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The output file(s) each part of a batch goes to."""
    topic_dir = f"topic={task.topic}"
    if job.partition_by == "partition":
        yield f"{topic_dir}/partition={task.partition}/{task.file_name}", batch
        return
    millis = batch.column("timestamp").cast(pa.int64())
    hours = pc.floor(pc.divide(pc.cast(millis, pa.float64()), float(HOUR_MS)))
    distinct = pc.unique(hours).to_pylist()
    for hour in distinct:
        when = datetime.fromtimestamp(hour * 3600, UTC)
        where = f"year={when:%Y}/month={when:%m}/day={when:%d}/hour={when:%H}"
        part = batch if len(distinct) == 1 else batch.filter(pc.equal(hours, hour))
        yield f"{topic_dir}/{where}/{task.file_name}", part


def export_segment(job: ExportJob, task: SegmentTask) -> SegmentResult:
    """Decode one segment and write its Parquet file(s) and marker; runs on an executor or locally."""
    started, cpu_started = time.monotonic(), time.process_time()
    bucket = Bucket(job.source.store)
    output = job.open_output()
    schema = arrow_schema(include_headers=True, timestamp_unit="ms")
    piece = Piece(
        task.key, task.topic, task.partition, task.base_offset, task.size,
        min_offset=task.min_offset, max_offset=task.max_offset, aborted=task.aborted,
    )  # fmt: skip
    stats = DecodeStats()
    files: dict[str, _ParquetFile] = {}
    last_offset = None
    try:
        for batch in read_piece(
            bucket, piece, include_headers=True, timestamp_unit="ms", stats=stats,
            skip_corrupt=job.source.skip_corrupt,
        ):  # fmt: skip
            last_offset = batch.column("offset")[-1].as_py()
            for path, part in _routes(job, task, batch):
                sink = files.get(path)
                if sink is None:
                    sink = files[path] = _ParquetFile(output, path, schema, job.compression_level)
                sink.add(part)
        committed = sorted(files)
        written = 0
        for path in committed:
            written += files.pop(path).commit()
    finally:
        for sink in files.values():
            sink.discard()
    if last_offset is not None:
        next_offset = last_offset + 1
    elif task.max_offset is not None:
        next_offset = task.max_offset + 1
    else:
        next_offset = task.min_offset if task.min_offset is not None else task.base_offset
    result = SegmentResult(
        key=task.key,
        files=tuple(committed),
        records=stats.records,
        bytes_in=stats.bytes,
        bytes_out=written,
        seconds=time.monotonic() - started,
        next_offset=next_offset,
        cpu_seconds=time.process_time() - cpu_started,
        corrupt_batches=stats.corrupt_batches,
    )
    _write_marker(output, task, result, bucket.uri(task.key))
    return result


def export_segments(job: ExportJob, tasks: list[SegmentTask]) -> list[SegmentResult]:
    """Export a group of segments one after the other (one Spark task)."""
    return [export_segment(job, task) for task in tasks]


def pack_tasks(tasks: list[SegmentTask], parallelism: int) -> list[list[SegmentTask]]:
    """Group small segments into Spark tasks of about total / (4 x parallelism) bytes, at least 8 MiB.

    A Spark task costs tens of milliseconds on its own, which small segments (a quiet topic rolling
    every hour) would pay thousands of times; four groups per core still spread the work evenly.
    Segments keep their order (largest first), so big ones stay alone.
    """
    total = sum(t.size for t in tasks)
    target = max(MIN_GROUP_BYTES, min(MAX_GROUP_BYTES, total // max(4 * parallelism, 1)))
    groups: list[list[SegmentTask]] = []
    current: list[SegmentTask] = []
    size = 0
    for task in tasks:
        current.append(task)
        size += task.size
        if size >= target:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    return groups


def _marker_dir(task: SegmentTask) -> str:
    return f"{STATE_DIR}{task.topic}/{task.partition}/"


def _write_marker(output: Output, task: SegmentTask, result: SegmentResult, source: str) -> None:
    """Record the segment as exported; deterministic content, so a rerun leaves the same bytes."""
    directory = _marker_dir(task)
    name = f"{task.stem}@{result.next_offset:020d}.json"
    doc = {
        "source": source,
        "files": list(result.files),
        "records": result.records,
        "segment_bytes": result.bytes_in,
        "parquet_bytes": result.bytes_out,
        "next_offset": result.next_offset,
    }
    temp = output.temp_file(directory + name)
    temp.write_bytes(json.dumps(doc, sort_keys=True, indent=1).encode() + b"\n")
    output.commit(temp, directory + name)
    # A full rerun may end a segment elsewhere: drop its older markers.
    for path in output.list(directory):
        m = _MARKER.fullmatch(path[len(directory) :])
        if m is not None and m["stem"] == task.stem and path != directory + name:
            output.delete(path)


# -- running ----------------------------------------------------------------------------------------


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_export(
    job: ExportJob,
    spark: Any | None = None,
    *,
    say: Callable[[str], None] = _say,
    progress_seconds: float = 10.0,
) -> ExportSummary:
    """Plan on the driver, export every segment (as Spark tasks, or in this process without Spark)."""
    started = time.monotonic()
    bucket = Bucket(job.source.store)
    output = job.open_output()
    tasks, skipped = plan_export(job, bucket, output)
    total = sum(t.size for t in tasks)
    say(
        f"export: {len(tasks)} segments to export ({_size(total)}), {skipped} already exported, "
        f"to {output.describe('')}"
    )
    summary = ExportSummary(skipped=skipped)
    if tasks and spark is None:
        for n, task in enumerate(tasks, 1):
            summary.add(export_segment(job, task))
            say(f"export: {n}/{len(tasks)} segments done")
    elif tasks and spark is not None:
        sc = spark.sparkContext
        group = f"tsproxy-export-{uuid.uuid4().hex[:8]}"
        sc.setJobGroup(group, f"tsproxy export of {len(tasks)} segments", interruptOnCancel=True)
        groups = pack_tasks(tasks, sc.defaultParallelism)
        try:
            rdd = sc.parallelize(groups, len(groups)).map(partial(export_segments, job))
            with _Progress(sc, group, len(groups), len(tasks), say, progress_seconds):
                results = [r for part in rdd.collect() for r in part]
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
        for result in results:
            summary.add(result)
        say(f"export: {len(results)}/{len(tasks)} segments done")
    summary.seconds = time.monotonic() - started
    return summary


class _Progress:
    """Reports finished/running tasks of the export's Spark job from a driver thread."""

    def __init__(
        self, sc: Any, group: str, tasks: int, segments: int, say: Callable[[str], None], every: float
    ) -> None:
        self.sc, self.group, self.tasks, self.segments = sc, group, tasks, segments
        self.say, self.every = say, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tsproxy-export-progress", daemon=True)

    def __enter__(self) -> _Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        last = None
        while not self._stop.wait(self.every):
            try:
                done, running, failed = self._counts()
            except Exception:  # the tracker is best effort; never let progress break the job
                continue
            state = (done, running, failed)
            if state != last:
                extra = f", {failed} task failures (retrying)" if failed else ""
                where = f"{done}/{self.tasks} tasks done ({self.segments} segments in all)"
                self.say(f"export: {where}, {running} running{extra}")
                last = state

    def _counts(self) -> tuple[int, int, int]:
        tracker = self.sc.statusTracker()
        done = running = failed = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    running += stage.numActiveTasks
                    failed += stage.numFailedTasks
        return done, running, failed
