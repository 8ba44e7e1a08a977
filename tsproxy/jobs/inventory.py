"""inventory: what a bucket stores and what it costs, per topic partition, per prefix and per KEK.

Each object is attributed to its topic partition from the key layout (Aiven's or a copied log
directory: segments, their indexes and manifests), sized as clients see it (original bytes) and as
the backend stores it, and its KEK noted. Orphans are objects of topics that no longer exist (given
the live topic ids or names) and multipart uploads nobody finished. Output: per-object rows, tables
per partition / prefix / KEK (Parquet) and a small HTML report.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, cast

import pyarrow as pa

from tsproxy import errors
from tsproxy.errors import ConfigError, FormatError, IntegrityError, KeyNotFound
from tsproxy.format import KeyRing, decode_tail
from tsproxy.format.manifest import META_SIZE
from tsproxy.kafka.layout import parse_segment_key

from .checks import Truncated
from .cleanup import Cleanup, apply_cleanup, orphan_rows, plan_cleanup
from .driver import Listing, list_bucket, now, output_dir, write_json
from .engine import JobRun, ObjectJob, TaskEnv, describe, opened_backend, run_job, write_rows
from .options import JobOptions
from .plan import OBJECT_WEIGHT, Listed, find_uploads, owned_by, prefix_of, unowned
from .probe import probe
from .report import Headline, write_html
from .verify import UPLOADS_SCHEMA, upload_rows

SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("prefix", pa.string()),
        ("topic", pa.string()),
        ("topic_id", pa.string()),
        ("partition", pa.int32()),
        ("base_offset", pa.int64()),
        ("role", pa.string()),  # segment / index / manifest / other
        ("format", pa.string()),  # tsproxy / passthrough
        ("stored_size", pa.int64()),
        ("original_size", pa.int64()),
        ("kek_id", pa.string()),
        ("last_modified", pa.timestamp("s", tz="UTC")),
        ("orphan", pa.bool_()),
        ("status", pa.string()),
        ("detail", pa.string()),
    ]
)
GROUP_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("topic_id", pa.string()),
        ("partition", pa.int32()),
        ("prefix", pa.string()),
        ("kek_id", pa.string()),
        ("objects", pa.int64()),
        ("segments", pa.int64()),
        ("original_bytes", pa.int64()),
        ("stored_bytes", pa.int64()),
        ("compression_ratio", pa.float64()),
        ("kek_ids", pa.list_(pa.string())),
        ("oldest_offset", pa.int64()),
        ("newest_offset", pa.int64()),
        ("oldest_segment", pa.timestamp("s", tz="UTC")),
        ("newest_segment", pa.timestamp("s", tz="UTC")),
        ("orphan", pa.bool_()),
    ]
)
_ROLES = {
    "log": "segment",
    "rsm-manifest": "manifest",
    "indexes": "index",
    "index": "index",
    "timeindex": "index",
    "snapshot": "index",
    "txnindex": "index",
    "leader-epoch-checkpoint": "index",
}
# Less than format.tail.TAIL_GUESS: manifests of Kafka-sized segments still fit in one read, and each
# passthrough object in the bucket costs this much download.
INVENTORY_TAIL_GUESS = 8 << 10


def attribute(key: str, prefix: str = "") -> tuple[str | None, str | None, int | None, int | None, str]:
    """(topic, topic id, partition, base offset, role) of a key in a Kafka tiered layout.

    A segment's companions (indexes, manifest) belong to the segment whose `.log` key shares their stem.
    """
    stem, dot, suffix = key.rpartition(".")
    role = _ROLES.get(suffix) if dot else None
    if role is not None:
        seg = parse_segment_key(stem + ".log", prefix)
        if seg is not None:
            return seg.topic, seg.topic_id, seg.partition, seg.base_offset, role
    return None, None, None, None, "other"


class _KekWitness:
    """Stands in for the key ring while a tail is decoded, remembering which KEK the object names,
    so an inventory can name KEKs that are no longer on the ring."""

    def __init__(self, ring: KeyRing | None) -> None:
        self.ring = ring
        self.kek_id: str | None = None

    def unwrap(self, kek_id: str, wrapped: bytes) -> bytes:
        self.kek_id = kek_id
        if self.ring is None:
            raise KeyNotFound(f"KEK {kek_id!r}: no key ring loaded")
        return self.ring.unwrap(kek_id, wrapped)


@dataclass
class Group:
    """Figures of a set of objects: counts, bytes, KEKs, segment offsets and times."""

    objects: int = 0
    segments: int = 0
    original_bytes: int = 0
    stored_bytes: int = 0
    kek_ids: set[str] = field(default_factory=set)
    oldest_offset: int | None = None
    newest_offset: int | None = None
    oldest_segment: datetime | None = None
    newest_segment: datetime | None = None
    orphan: bool = False

    def add(self, row: Mapping[str, Any]) -> None:
        self.objects += 1
        self.stored_bytes += row["stored_size"] or 0
        self.original_bytes += row["original_size"] or 0
        if row["kek_id"]:
            self.kek_ids.add(row["kek_id"])
        self.orphan = self.orphan or bool(row["orphan"])
        if row["role"] == "segment":
            self.segments += 1
            off, when = row["base_offset"], row["last_modified"]
            self.oldest_offset = off if self.oldest_offset is None else min(self.oldest_offset, off)
            self.newest_offset = off if self.newest_offset is None else max(self.newest_offset, off)
            self.oldest_segment = when if self.oldest_segment is None else min(self.oldest_segment, when)
            self.newest_segment = when if self.newest_segment is None else max(self.newest_segment, when)

    def merge(self, other: Group) -> None:
        self.objects += other.objects
        self.segments += other.segments
        self.original_bytes += other.original_bytes
        self.stored_bytes += other.stored_bytes
        self.kek_ids |= other.kek_ids
        self.orphan = self.orphan or other.orphan
        for name, pick in (
            ("oldest_offset", min),
            ("newest_offset", max),
            ("oldest_segment", min),
            ("newest_segment", max),
        ):
            mine, theirs = getattr(self, name), getattr(other, name)
            setattr(self, name, theirs if mine is None else mine if theirs is None else pick(mine, theirs))

    @property
    def ratio(self) -> float | None:
        """Original bytes per stored byte (above 1: the store saves space)."""
        return self.original_bytes / self.stored_bytes if self.stored_bytes else None

    def row(self, **labels: Any) -> dict[str, Any]:
        return {
            "topic": None,
            "topic_id": None,
            "partition": None,
            "prefix": None,
            "kek_id": None,
            **labels,
            "objects": self.objects,
            "segments": self.segments,
            "original_bytes": self.original_bytes,
            "stored_bytes": self.stored_bytes,
            "compression_ratio": self.ratio,
            "kek_ids": sorted(self.kek_ids),
            "oldest_offset": self.oldest_offset,
            "newest_offset": self.newest_offset,
            "oldest_segment": self.oldest_segment,
            "newest_segment": self.newest_segment,
            "orphan": self.orphan,
        }


PartitionKey = tuple[str, str | None, int]


@dataclass
class InventorySummary:
    """Groups by topic partition, by prefix and by KEK, plus the whole, and the status counts."""

    partitions: dict[PartitionKey, Group] = field(default_factory=dict)
    prefixes: dict[str, Group] = field(default_factory=dict)
    keks: dict[str, Group] = field(default_factory=dict)
    total: Group = field(default_factory=Group)
    orphans: Group = field(default_factory=Group)
    statuses: dict[str, int] = field(default_factory=dict)

    def add(self, row: Mapping[str, Any]) -> None:
        self.total.add(row)
        self.statuses[row["status"]] = self.statuses.get(row["status"], 0) + 1
        if row["topic"] is not None:
            key = (row["topic"], row["topic_id"], row["partition"])
            self.partitions.setdefault(key, Group()).add(row)
        self.prefixes.setdefault(row["prefix"], Group()).add(row)
        self.keks.setdefault(row["kek_id"] or "(none)", Group()).add(row)
        if row["orphan"]:
            self.orphans.add(row)

    def merge(self, other: InventorySummary) -> None:
        for pk, g in other.partitions.items():
            self.partitions.setdefault(pk, Group()).merge(g)
        for name, g in other.prefixes.items():
            self.prefixes.setdefault(name, Group()).merge(g)
        for kek, g in other.keks.items():
            self.keks.setdefault(kek, Group()).merge(g)
        self.total.merge(other.total)
        self.orphans.merge(other.orphans)
        for s, n in other.statuses.items():
            self.statuses[s] = self.statuses.get(s, 0) + n


class InventoryJob(ObjectJob):
    name: ClassVar[str] = "inventory"
    schema: ClassVar[pa.Schema] = SCHEMA

    def __init__(
        self, live_topics: frozenset[str] | None, layout_prefix: str = "", prefix_depth: int = 1
    ) -> None:
        self.live_topics = live_topics
        self.layout_prefix = layout_prefix
        self.prefix_depth = prefix_depth

    def weight(self, item: Listed) -> int:
        return OBJECT_WEIGHT  # one small read per object, whatever its size

    def new_summary(self) -> InventorySummary:
        return InventorySummary()

    def _row(self, key: str, item: Listed) -> dict[str, Any]:
        topic, topic_id, partition, offset, role = attribute(key, self.layout_prefix)
        orphan = (
            self.live_topics is not None and topic is not None and not ({topic, topic_id} & self.live_topics)
        )
        return {
            "key": key,
            "prefix": prefix_of(key, self.prefix_depth),
            "topic": topic,
            "topic_id": topic_id,
            "partition": partition,
            "base_offset": offset,
            "role": role,
            "format": None,
            "stored_size": item.size,
            "original_size": None,
            "kek_id": None,
            "last_modified": datetime.fromtimestamp(item.modified, UTC),
            "orphan": orphan,
            "status": "ok",
            "detail": None,
        }

    async def process(self, env: TaskEnv, item: Listed) -> dict[str, Any]:
        row = self._row(env.client_key(item.key) or item.key, item)
        try:
            p = await probe(env.backend, env.root.bucket, item.key, guess=INVENTORY_TAIL_GUESS)
        except errors.NoSuchKey:
            return {**row, "status": "vanished", "stored_size": 0}
        row["stored_size"] = p.info.size
        if not p.written_by_tsproxy:
            return {**row, "format": "passthrough", "original_size": p.info.size}
        row["format"] = "tsproxy"
        meta_size = p.info.metadata.get(META_SIZE, "")
        row["original_size"] = int(meta_size) if meta_size.isascii() and meta_size.isdigit() else None
        if p.tail is None:
            why = p.tail_error or Truncated("no tsproxy trailer at the end")
            return {**row, "status": "unreadable", "detail": str(why)}
        witness = _KekWitness(env.ring)
        try:
            manifest, _ = await env.cpu(decode_tail, p.tail, cast(KeyRing, witness))
        except KeyNotFound as e:
            return {**row, "status": "missing-key", "kek_id": witness.kek_id, "detail": str(e)}
        except (IntegrityError, FormatError) as e:
            return {**row, "status": "unreadable", "kek_id": witness.kek_id, "detail": str(e)}
        return {**row, "original_size": manifest.size, "kek_id": manifest.kek_id}

    def failed(self, env: TaskEnv, item: Listed, error: BaseException) -> dict[str, Any]:
        return {
            **self._row(env.client_key(item.key) or item.key, item),
            "status": "error",
            "detail": describe(error),
        }


@dataclass
class InventoryReport:
    run: JobRun
    uploads: list[dict[str, Any]]
    live_topics: frozenset[str] | None
    out: str
    cleanup: Cleanup | None = None

    @property
    def summary(self) -> InventorySummary:
        return cast(InventorySummary, self.run.summary)

    @property
    def stale_uploads(self) -> list[dict[str, Any]]:
        return [u for u in self.uploads if u["stale"]]

    def headline(self) -> Headline:
        """The totals the HTML report opens with."""
        s, t = self.summary, self.summary.total
        orphans = s.orphans.objects if self.live_topics is not None else None
        return Headline(
            t.objects,
            t.original_bytes,
            t.stored_bytes,
            t.ratio,
            len(s.partitions),
            orphans,
            len(self.stale_uploads),
        )

    def text(self) -> str:
        from .driver import human_bytes

        s, t = self.summary, self.summary.total
        ratio = f"{t.ratio:.2f}x" if t.ratio else "n/a"
        lines = [
            f"inventory: {t.objects} objects, {human_bytes(t.original_bytes)} original, "
            f"{human_bytes(t.stored_bytes)} stored (ratio {ratio}), {len(s.partitions)} topic partitions, "
            f"{self.run.seconds:.1f}s",
            "  KEKs: " + ", ".join(f"{k}={g.objects}" for k, g in sorted(s.keks.items())),
        ]
        if self.live_topics is None:
            lines.append("  orphans: not checked (no --live-topics given)")
        else:
            lines.append(
                f"  orphans: {s.orphans.objects} objects, {human_bytes(s.orphans.stored_bytes)} stored"
            )
        stale = self.stale_uploads
        lines.append(
            f"  stale multipart uploads: {len(stale)}, {human_bytes(sum(u['bytes'] or 0 for u in stale))}"
        )
        problems = {k: n for k, n in s.statuses.items() if k != "ok"}
        if problems:
            lines.append("  not fully read: " + ", ".join(f"{k}={n}" for k, n in sorted(problems.items())))
        lines.append(f"  report: {self.out}/report.html")
        if self.cleanup is not None:
            lines.append(self.cleanup.text())
        return "\n".join(lines)


def group_tables(summary: InventorySummary) -> dict[str, list[dict[str, Any]]]:
    """The per-partition, per-prefix and per-KEK tables, as rows of GROUP_SCHEMA."""
    return {
        "partitions": [
            g.row(topic=t, topic_id=tid, partition=p)
            for (t, tid, p), g in sorted(
                summary.partitions.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", kv[0][2])
            )
        ],
        "prefixes": [g.row(prefix=p) for p, g in sorted(summary.prefixes.items())],
        "keks": [g.row(kek_id=k) for k, g in sorted(summary.keks.items())],
    }


async def _list(options: JobOptions) -> Listing:
    async with opened_backend(options) as backend:
        return await list_bucket(backend, options, internal=True)


def inventory(
    spark: Any,
    options: JobOptions,
    *,
    output: str | None = None,
    live_topics: frozenset[str] | None = None,
    layout_prefix: str = "",
    prefix_depth: int = 1,
    delete_orphans: bool = False,
    apply: bool = False,
    force: bool = False,
    partitions: int = 0,
    progress_every: float = 10.0,
) -> InventoryReport:
    """Inventory `options.bucket`/`options.prefix`: rows under `<output>/objects/`, tables
    `partitions.parquet`, `prefixes.parquet`, `keks.parquet`, `uploads.parquet`, and `report.html`.

    With `delete_orphans`, plan (and with `apply`, carry out) the deletion of orphans and stale uploads.
    """
    listing = asyncio.run(_list(options))
    at = now()
    out = output_dir(output, "inventory")
    job = InventoryJob(live_topics, layout_prefix, prefix_depth)
    run = run_job(
        spark, job, options, listing.objects, out, partitions=partitions, progress_every=progress_every
    )
    uploads = upload_rows(listing, at, options.stale_after)
    write_rows(Path(out) / "uploads.parquet", uploads, UPLOADS_SCHEMA)
    report = InventoryReport(run, uploads, live_topics, out)
    tables = group_tables(report.summary)
    for name, rows in tables.items():
        write_rows(Path(out) / f"{name}.parquet", rows, GROUP_SCHEMA)
    write_html(Path(out) / "report.html", report.headline(), tables, report.uploads)
    if delete_orphans:
        report.cleanup = _cleanup(options, report, listing, at, apply=apply, force=force)
    t = report.summary.total
    summary = {
        "job": "inventory",
        "objects": t.objects,
        "original_bytes": t.original_bytes,
        "stored_bytes": t.stored_bytes,
        "statuses": report.summary.statuses,
        "orphans": report.summary.orphans.objects,
        "stale_uploads": len(report.stale_uploads),
        "stats": run.stats,
        "seconds": run.seconds,
    }
    write_json(f"{out}/summary.json", summary)
    return report


def _cleanup(
    options: JobOptions, report: InventoryReport, listing: Listing, at: float, *, apply: bool, force: bool
) -> Cleanup:
    s = report.summary
    kafka_objects = sum(g.objects for g in s.partitions.values())
    if s.orphans.objects and s.orphans.objects == kafka_objects and not force:
        raise ConfigError(
            f"inventory: all {kafka_objects} Kafka objects would be deleted as orphans; check --live-topics "
            "(topic ids or names of the live topics) or pass --force"
        )
    orphans = orphan_rows(report.out) if report.live_topics is not None else []
    uploads = find_uploads(listing.internal, listing.root)
    leftovers = [u for u in uploads if u.stale(at, options.stale_after)]
    # A client upload's own backend upload goes with it, and is no leftover of its own while it lives.
    stale_backend = [(b.key, b.upload_id) for b in owned_by(listing.backend_uploads, leftovers).values()]
    stale_backend += [
        (b.key, b.upload_id)
        for b in unowned(listing.backend_uploads, uploads)
        if at - b.initiated.timestamp() >= options.stale_after
    ]
    plan = plan_cleanup(options, orphans, leftovers, stale_backend)
    return asyncio.run(apply_cleanup(options, plan)) if apply else plan
