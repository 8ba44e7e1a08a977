"""Running an object job on Spark: list once on the driver, spread keys over partitions, and in each
partition run async code with `asyncio.run` against a backend the task opens itself.

A job is a small picklable object (see `ObjectJob`): it turns one listed object into one result row
and knows how to summarise rows. Each task writes its rows as one Parquet file under the run's output
directory (a path every executor can write: local in `local[*]`, a shared filesystem on a cluster) and
hands the driver only its summary and request statistics, so the driver's memory does not grow with
the number of objects' results.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, TextIO, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from tsproxy.errors import S3Error
from tsproxy.format import KeyRing
from tsproxy.service import Namespace, ObjectService
from tsproxy.store.base import Backend
from tsproxy.store.observe import OnRequest

from .options import JobOptions
from .plan import Listed, default_weight, partition_count, spread
from .ratelimit import RateLimitedRequests, RateLimiter

T = TypeVar("T")
ROWS_DIR = "objects"


class Summary(Protocol):
    """A mergeable digest of result rows, built on the executors and merged on the driver."""

    def add(self, row: Mapping[str, Any]) -> None: ...

    def merge(self, other: Any) -> None: ...


@dataclass
class Tally:
    """Objects and bytes per status, plus the first rows whose status is a problem."""

    problems: frozenset[str]
    size_field: str = "size"
    max_examples: int = 50
    counts: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    examples: list[dict[str, Any]] = field(default_factory=list)

    def add(self, row: Mapping[str, Any]) -> None:
        status = row["status"]
        self.counts[status] = self.counts.get(status, 0) + 1
        self.bytes[status] = self.bytes.get(status, 0) + int(row.get(self.size_field) or 0)
        if status in self.problems and len(self.examples) < self.max_examples:
            self.examples.append(dict(row))

    def merge(self, other: Tally) -> None:
        for status, n in other.counts.items():
            self.counts[status] = self.counts.get(status, 0) + n
        for status, n in other.bytes.items():
            self.bytes[status] = self.bytes.get(status, 0) + n
        room = self.max_examples - len(self.examples)
        self.examples += other.examples[: max(room, 0)]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def problem_count(self) -> int:
        return sum(n for s, n in self.counts.items() if s in self.problems)


@dataclass
class TaskStats:
    """Backend requests and bytes of one task (or, merged, of a whole run)."""

    tasks: int = 0
    objects: int = 0
    requests: int = 0
    failed_requests: int = 0
    retries: int = 0
    bytes_in: int = 0  # downloaded from the backend
    bytes_out: int = 0  # uploaded to the backend
    throttled_seconds: float = 0.0
    operations: dict[str, int] = field(default_factory=dict)

    def observe(
        self, operation: str, outcome: str, seconds: float, retries: int, bytes_in: int, bytes_out: int
    ) -> None:
        """The backend's `on_request` hook."""
        self.requests += 1
        self.failed_requests += outcome != "ok"
        self.retries += retries
        self.bytes_in += bytes_in
        self.bytes_out += bytes_out
        self.operations[operation] = self.operations.get(operation, 0) + 1

    def merge(self, other: TaskStats) -> None:
        for name in ("tasks", "objects", "requests", "failed_requests", "retries", "bytes_in", "bytes_out"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.throttled_seconds += other.throttled_seconds
        for op, n in other.operations.items():
            self.operations[op] = self.operations.get(op, 0) + n


class TaskEnv:
    """What one task's async code works with: its backend (rate-limited by `limiter`, see
    `process_items`), the key ring, a CPU pool."""

    def __init__(
        self,
        options: JobOptions,
        backend: Backend,
        ring: KeyRing | None,
        stats: TaskStats,
        limiter: RateLimiter,
    ) -> None:
        self.options = options
        self.limiter = limiter
        self.backend = backend
        self.ring = ring
        self.stats = stats
        self.pool = ThreadPoolExecutor(options.threads, thread_name_prefix="job-cpu")
        self.ns = Namespace(options.backend_bucket, options.backend_prefix)
        self.root = self.ns.root(options.bucket)
        self._service: ObjectService | None = None

    async def cpu(self, fn: Callable[..., T], *args: Any) -> T:
        """CPU work (AES, zstd, MD5) off the event loop, in the task's small pool."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def client_key(self, backend_key: str) -> str | None:
        """The client's key of a backend key (None for tsproxy's internal objects)."""
        return self.ns.client_key(self.options.bucket, backend_key)

    def service(self) -> ObjectService:
        """An ObjectService over this task's backend, for rewrap and migrate (no chunk cache)."""
        if self._service is None:
            from tsproxy.cache.reader import ChunkReader

            o = self.options
            self._service = ObjectService(
                self.backend,
                self.ring,
                o.transform(),
                ChunkReader(None, self.pool),
                self.pool,
                namespace=self.ns,
                part_size=o.part_size,
                metadata_ttl=60.0,
            )
        return self._service

    async def close(self) -> None:
        if self._service is not None:
            await self._service.reader.close()
        self.pool.shutdown(wait=False, cancel_futures=True)


class ObjectJob(ABC):
    """One maintenance job: what it does to each listed object, and how its rows look and add up."""

    name: ClassVar[str]
    schema: ClassVar[pa.Schema]

    def weight(self, item: Listed) -> int:
        """Relative work of an item, for spreading items over partitions."""
        return default_weight(item)

    @abstractmethod
    def new_summary(self) -> Summary: ...

    @abstractmethod
    async def process(self, env: TaskEnv, item: Listed) -> dict[str, Any]:
        """The result row of one object (a dict with the schema's fields)."""

    @abstractmethod
    def failed(self, env: TaskEnv, item: Listed, error: BaseException) -> dict[str, Any]:
        """The row of an object whose processing raised something `process` did not expect."""


def describe(error: BaseException) -> str:
    """An error for a result row: its S3 code or class name, and its message."""
    code = error.code if isinstance(error, S3Error) else type(error).__name__
    return f"{code}: {error}"


@dataclass
class PartitionResult:
    index: int
    summary: Any
    stats: TaskStats


async def bounded_map(limit: int, items: Sequence[T], fn: Callable[[T], Awaitable[Any]]) -> list[Any]:
    """fn over items with at most `limit` in flight; results in input order."""
    results: list[Any] = [None] * len(items)
    it = iter(enumerate(items))

    async def worker() -> None:
        for i, item in it:
            results[i] = await fn(item)

    await asyncio.gather(*(worker() for _ in range(min(limit, len(items)))))
    return results


@asynccontextmanager
async def opened_backend(options: JobOptions, on_request: OnRequest | None = None) -> AsyncIterator[Backend]:
    """A started backend from the options, closed on exit."""
    backend = options.open_backend(on_request)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


async def process_items(
    job: ObjectJob, options: JobOptions, items: Sequence[Listed], stats: TaskStats
) -> list[dict[str, Any]]:
    """Run a job over items in one event loop (what a task does; also usable without Spark)."""
    ring = await asyncio.to_thread(options.load_ring)
    limiter = RateLimiter(options.task_rate)
    async with opened_backend(options, RateLimitedRequests(limiter, stats.observe)) as backend:
        env = TaskEnv(options, backend, ring, stats, limiter)

        async def one(item: Listed) -> dict[str, Any]:
            try:
                return await job.process(env, item)
            except Exception as e:  # one object's surprise must not cost the whole partition
                return job.failed(env, item, e)

        try:
            rows = await bounded_map(options.concurrency, items, one)
        finally:
            stats.throttled_seconds += env.limiter.waited
            await env.close()
    stats.objects += len(items)
    return rows


def write_rows(path: Path, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    """Write rows as one Parquet file, atomically (a retried task replaces its own file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp, compression="zstd")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def run_partition(
    job: ObjectJob, options: JobOptions, out_dir: str | None, index: int, items: list[Listed]
) -> PartitionResult:
    """A task's whole work: process its items, write their rows, return summary and statistics."""
    stats = TaskStats(tasks=1)
    rows = asyncio.run(process_items(job, options, items, stats))
    if out_dir is not None:
        write_rows(Path(out_dir) / ROWS_DIR / f"part-{index:05d}.parquet", rows, job.schema)
    summary = job.new_summary()
    for row in rows:
        summary.add(row)
    return PartitionResult(index, summary, stats)


# -- the driver ---------------------------------------------------------------------------------------


@dataclass
class JobRun:
    """What a finished run reports: the merged summary, request statistics, its size and duration."""

    name: str
    summary: Any
    stats: TaskStats
    objects: int
    bytes: int
    partitions: int
    seconds: float
    output: str | None


def task_slots(spark: Any) -> int:
    """Tasks one executor runs at once: its share of the per-executor rate is rate / this."""
    sc = spark.sparkContext
    conf = sc.getConf()
    task_cpus = max(1, int(conf.get("spark.task.cpus", "1")))
    if sc.master.startswith("local"):
        return max(1, sc.defaultParallelism // task_cpus)
    return max(1, int(conf.get("spark.executor.cores", "1")) // task_cpus)


def _counts_param() -> Any:
    from pyspark.accumulators import AccumulatorParam

    class CountsParam(AccumulatorParam):
        def zero(self, value: dict[str, int]) -> dict[str, int]:
            return {}

        def addInPlace(self, a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
            for k, v in b.items():
                a[k] = a.get(k, 0) + v
            return a

    return CountsParam()


class Progress:
    """Prints a progress line for a running job every `every` seconds, from the driver."""

    def __init__(
        self, name: str, objects: int, nbytes: int, out: TextIO | None = None, every: float = 10.0
    ) -> None:
        self.name, self.objects, self.nbytes = name, objects, nbytes
        self.out = out or sys.stderr
        self.every = every
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def line(self, tasks_done: int, tasks: int, objects_done: int, bytes_done: int) -> str:
        """One progress line (pure apart from the clock)."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = objects_done / elapsed
        eta = (
            f", about {(self.objects - objects_done) / rate:.0f}s left"
            if rate and objects_done < self.objects
            else ""
        )
        return (
            f"[{self.name}] {tasks_done}/{tasks} partitions, {objects_done}/{self.objects} objects, "
            f"{bytes_done / (1 << 20):.1f}/{self.nbytes / (1 << 20):.1f} MiB, {rate:.1f} objects/s{eta}"
        )

    def watch(self, poll: Callable[[], tuple[int, int, int, int]]) -> None:
        """Start printing `line(*poll())` in a background thread."""

        def loop() -> None:
            while not self._stop.wait(self.every):
                try:
                    print(self.line(*poll()), file=self.out, flush=True)
                except Exception:  # progress must never break the job
                    pass

        self._thread = threading.Thread(target=loop, name=f"progress-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, final: tuple[int, int, int, int] | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if final is not None:
            print(self.line(*final), file=self.out, flush=True)


def run_job(
    spark: Any,
    job: ObjectJob,
    options: JobOptions,
    items: Sequence[Listed],
    out_dir: str | None,
    *,
    partitions: int = 0,
    progress_every: float = 10.0,
    progress_out: TextIO | None = None,
) -> JobRun:
    """Spread items over partitions, run the job's tasks on Spark, merge what they report."""
    sc = spark.sparkContext
    options = options.replace(task_slots=task_slots(spark))
    n = partition_count(sum(job.weight(i) for i in items), len(items), sc.defaultParallelism, partitions)
    runs = spread(items, n, job.weight)
    total_bytes = sum(i.size for i in items)
    counts = sc.accumulator({}, _counts_param())
    if out_dir is not None:
        (Path(out_dir) / ROWS_DIR).mkdir(parents=True, exist_ok=True)

    def task(index: int, it: Iterable[list[Listed]]) -> list[PartitionResult]:
        chunk = [item for run in it for item in run]
        result = run_partition(job, options, out_dir, index, chunk)
        counts.add({"tasks": 1, "objects": len(chunk), "bytes": sum(i.size for i in chunk)})
        return [result]

    sc.setJobDescription(f"tsproxy jobs {job.name}")  # how the run shows in Spark's UI
    progress = Progress(job.name, len(items), total_bytes, progress_out, progress_every)

    def poll() -> tuple[int, int, int, int]:
        c = counts.value
        return c.get("tasks", 0), len(runs), c.get("objects", 0), c.get("bytes", 0)

    progress.watch(poll)
    started = time.monotonic()
    try:
        results: list[PartitionResult] = (
            sc.parallelize(runs, len(runs)).mapPartitionsWithIndex(task).collect()
        )
    finally:
        progress.stop()
    seconds = time.monotonic() - started
    progress.stop(final=(len(runs), len(runs), len(items), total_bytes))
    summary = job.new_summary()
    stats = TaskStats()
    for r in sorted(results, key=lambda r: r.index):
        summary.merge(r.summary)
        stats.merge(r.stats)
    return JobRun(job.name, summary, stats, len(items), total_bytes, len(runs), seconds, out_dir)
