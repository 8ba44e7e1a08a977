"""rewrap: move every object under a prefix to the key ring's active KEK, without re-uploading data.

Each object's tail is rewritten with its DEK wrapped by the active KEK (ObjectService.rewrap: the data
area is copied server-side). Objects already on the active KEK are skipped, so the job is idempotent
and a rerun resumes where an interrupted one stopped. Once it reports nothing left on other KEKs (and
no multipart upload in progress under one), the old KEK can leave the ring.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from tsproxy import errors
from tsproxy.errors import ConfigError, FormatError, KeyNotFound
from tsproxy.format import KeyRing, ObjectContext
from tsproxy.s3.limits import MIN_PART_SIZE
from tsproxy.service import UploadState

from .driver import Listing, list_bucket, output_dir, write_json
from .engine import JobRun, ObjectJob, Tally, TaskEnv, describe, opened_backend, run_job
from .options import JobOptions
from .plan import OBJECT_WEIGHT, Listed, find_uploads

log = logging.getLogger("tsproxy.jobs.rewrap")

SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("size", pa.int64()),  # original bytes
        ("stored_size", pa.int64()),
        ("status", pa.string()),
        ("old_kek", pa.string()),
        ("new_kek", pa.string()),
        ("detail", pa.string()),
    ]
)
# rewrapped / would-rewrap / current / passthrough / unencrypted / vanished are fine; these are not.
PROBLEMS = frozenset({"missing-key", "unreadable", "error"})


@dataclass
class RewrapSummary:
    """Statuses, plus which KEK every object is on once the run is over."""

    tally: Tally = field(default_factory=lambda: Tally(PROBLEMS))
    keks: dict[str, int] = field(default_factory=dict)

    def add(self, row: Mapping[str, Any]) -> None:
        self.tally.add(row)
        kek = row["new_kek"] or row["old_kek"]
        if kek:
            self.keks[kek] = self.keks.get(kek, 0) + 1

    def merge(self, other: RewrapSummary) -> None:
        self.tally.merge(other.tally)
        for kek, n in other.keks.items():
            self.keks[kek] = self.keks.get(kek, 0) + n


class RewrapJob(ObjectJob):
    name: ClassVar[str] = "rewrap"
    schema: ClassVar[pa.Schema] = SCHEMA

    def __init__(self, dry_run: bool = False) -> None:
        self.dry_run = dry_run

    def weight(self, item: Listed) -> int:
        # Objects below the minimum part size are re-uploaded whole; bigger ones only their tail.
        return OBJECT_WEIGHT + (2 * item.size if item.size < MIN_PART_SIZE else 0)

    def new_summary(self) -> RewrapSummary:
        return RewrapSummary()

    async def process(self, env: TaskEnv, item: Listed) -> dict[str, Any]:
        key = env.client_key(item.key)
        assert key is not None and env.ring is not None
        row: dict[str, Any] = {
            "key": key,
            "size": None,
            "stored_size": item.size,
            "old_kek": None,
            "new_kek": None,
            "detail": None,
        }
        service = env.service()
        try:
            obj = await service.resolve(env.options.bucket, key)
        except errors.NoSuchKey:
            return {**row, "status": "vanished", "detail": "deleted since the listing"}
        except KeyNotFound as e:
            return {**row, "status": "missing-key", "detail": str(e)}
        except FormatError as e:
            return {**row, "status": "unreadable", "detail": str(e)}
        row["size"] = obj.size
        if obj.manifest is None:
            return {**row, "status": "passthrough"}
        if not obj.manifest.encrypted:
            return {**row, "status": "unencrypted"}
        row["old_kek"] = obj.manifest.kek_id
        active = env.ring.active_id
        if obj.manifest.kek_id == active:
            return {**row, "status": "current"}
        if self.dry_run:
            return {**row, "status": "would-rewrap", "detail": f"to {active}"}
        try:
            changed = await service.rewrap(env.options.bucket, key)
        except errors.NoSuchKey:
            return {**row, "status": "vanished", "detail": "deleted during the rewrap"}
        return {**row, "status": "rewrapped" if changed else "current", "new_kek": active}

    def failed(self, env: TaskEnv, item: Listed, error: BaseException) -> dict[str, Any]:
        return {
            "key": env.client_key(item.key) or item.key,
            "size": None,
            "stored_size": item.size,
            "status": "error",
            "old_kek": None,
            "new_kek": None,
            "detail": describe(error),
        }


@dataclass
class PendingUpload:
    """A multipart upload in progress whose DEK is wrapped by a KEK other than the active one."""

    upload_id: str
    key: str
    kek: str


@dataclass
class RewrapReport:
    run: JobRun
    active: str
    pending_uploads: list[PendingUpload]
    dry_run: bool

    @property
    def summary(self) -> RewrapSummary:
        return self.run.summary

    @property
    def remaining(self) -> dict[str, int]:
        """Objects still on KEKs other than the active one (what `keys remove` would make unreadable)."""
        return {k: n for k, n in self.summary.keks.items() if k != self.active}

    @property
    def ok(self) -> bool:
        """Nothing failed and nothing is left on another KEK: the old KEKs may go."""
        return not self.summary.tally.problem_count and not self.remaining and not self.pending_uploads

    def text(self) -> str:
        t = self.summary.tally
        mode = " (dry run: nothing written; --apply to rewrap)" if self.dry_run else ""
        lines = [
            f"rewrap{mode}: {t.total} objects in {self.run.seconds:.1f}s "
            f"over {self.run.partitions} partitions; active KEK {self.active}",
        ]
        lines += [f"  {status:<13} {n}" for status, n in sorted(t.counts.items())]
        lines.append(
            "  objects per KEK after the run: "
            + (", ".join(f"{k}={n}" for k, n in sorted(self.summary.keks.items())) or "none")
        )
        s = self.run.stats
        lines.append(f"  backend: {s.requests} requests, {s.bytes_in} bytes down, {s.bytes_out} bytes up")
        for p in self.pending_uploads:
            lines.append(
                f"  upload in progress under {p.kek}: {p.key!r} ({p.upload_id}); rerun once it completes"
            )
        for ex in t.examples[:20]:
            lines.append(f"  {ex['status']}: {ex['key']}: {ex['detail']}")
        if self.ok and not self.dry_run:
            lines.append(
                "  every object is on the active KEK: older KEKs can be removed (`tsproxy keys remove`)"
            )
        elif not self.dry_run:
            lines.append("  NOT DONE: keep the old KEKs on the ring until a rerun reports nothing left")
        return "\n".join(lines)


async def _pending_uploads(options: JobOptions, ring: KeyRing, listing: Listing) -> list[PendingUpload]:
    """Multipart uploads in progress whose state holds a DEK wrapped by an old KEK."""
    out: list[PendingUpload] = []
    async with opened_backend(options) as backend:
        for upload in find_uploads(listing.internal, listing.root):
            if not upload.has_state:
                continue
            try:
                _, data = await backend.get_bytes(listing.backend_bucket, upload.state_key)
                state = UploadState.from_bytes(data)
                ctx = ObjectContext.from_state(state.ctx_state, ring)
            except errors.NoSuchKey:
                continue  # completed or aborted meanwhile
            except KeyNotFound as e:
                out.append(PendingUpload(upload.upload_id, "?", str(e)))
                continue
            except (FormatError, ValueError, KeyError) as e:  # a damaged state: it cannot complete anyway
                log.warning("upload %s: unreadable state: %s", upload.upload_id, e)
                continue
            if ctx.kek_id is not None and ctx.kek_id != ring.active_id:
                out.append(PendingUpload(upload.upload_id, state.key, ctx.kek_id))
    return out


async def _list(options: JobOptions) -> Listing:
    async with opened_backend(options) as backend:
        return await list_bucket(backend, options, internal=True)


def rewrap(
    spark: Any,
    options: JobOptions,
    *,
    output: str | None = None,
    dry_run: bool = False,
    partitions: int = 0,
    progress_every: float = 10.0,
) -> RewrapReport:
    """Run the rewrap job over `options.bucket`/`options.prefix`; rows go to `<output>/objects/`."""
    ring = options.load_ring()
    if ring is None:
        raise ConfigError("rewrap: needs a key ring (--key-ring) holding the active KEK and the old ones")
    listing = asyncio.run(_list(options))
    out = output_dir(output, "rewrap")
    run = run_job(
        spark,
        RewrapJob(dry_run),
        options,
        listing.objects,
        out,
        partitions=partitions,
        progress_every=progress_every,
    )
    pending = asyncio.run(_pending_uploads(options, ring, listing))
    report = RewrapReport(run, ring.active_id, pending, dry_run)
    write_json(
        f"{out}/summary.json",
        {
            "job": "rewrap",
            "active": report.active,
            "ok": report.ok,
            "counts": report.summary.tally.counts,
            "keks": report.summary.keks,
            "stats": run.stats,
            "pending_uploads": pending,
            "seconds": run.seconds,
        },
    )
    return report
