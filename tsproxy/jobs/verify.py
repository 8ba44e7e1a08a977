"""verify: read every object and prove it intact, or say what is wrong with it.

For a tsproxy object: the tail authenticates with the key ring, the data area has the size the
manifest says, every chunk authenticates (AES-GCM tag, or CRC32C without encryption) and decodes,
every segment's MD5 and the whole object's MD5 (when recorded) match, and the backend metadata that
listings show agrees with the manifest. A passthrough object is read and checked against its ETag when
that is a plain MD5. Multipart uploads nobody finished (tsproxy's `.tsproxy/mpu/` state, or backend
uploads) are leftovers once older than `stale_after`.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa

from tsproxy import errors
from tsproxy.errors import FormatError, IntegrityError, KeyNotFound
from tsproxy.format import decode_tail
from tsproxy.format.manifest import META_ETAG, META_SIZE

from .checks import ChunkVerifier, Truncated
from .driver import Listing, age, human_bytes, list_bucket, now, output_dir, write_json
from .engine import JobRun, ObjectJob, Tally, TaskEnv, describe, opened_backend, run_job, write_rows
from .options import JobOptions
from .plan import Listed, find_uploads, unowned
from .probe import probe

SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("size", pa.int64()),  # stored bytes
        ("original_size", pa.int64()),
        ("etag", pa.string()),  # as clients see it
        ("status", pa.string()),
        ("detail", pa.string()),
        ("kek_id", pa.string()),
        ("chunks", pa.int64()),
    ]
)
UPLOADS_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),  # "tsproxy" (.tsproxy/mpu/<id>/) or "backend" (a backend multipart upload)
        ("upload_id", pa.string()),
        ("key", pa.string()),
        ("objects", pa.int64()),
        ("bytes", pa.int64()),
        ("last_write", pa.timestamp("s", tz="UTC")),
        ("stale", pa.bool_()),
    ]
)
PROBLEMS = frozenset({"corrupt", "truncated", "missing-key", "unreadable", "error"})
BATCH = 1 << 20  # stored bytes handed to the verifier per thread hop
_PLAIN_MD5 = re.compile(r"[0-9a-f]{32}\Z")


class VerifyJob(ObjectJob):
    name: ClassVar[str] = "verify"
    schema: ClassVar[pa.Schema] = SCHEMA

    def __init__(self, check_passthrough: bool = True) -> None:
        self.check_passthrough = check_passthrough

    def new_summary(self) -> Tally:
        return Tally(PROBLEMS)

    async def process(self, env: TaskEnv, item: Listed) -> dict[str, Any]:
        row: dict[str, Any] = {
            "key": env.client_key(item.key) or item.key,
            "size": item.size,
            "original_size": None,
            "etag": None,
            "detail": None,
            "kek_id": None,
            "chunks": None,
        }
        try:
            return {**row, **await self._check(env, item, row)}
        except errors.NoSuchKey:
            return {**row, "status": "vanished", "detail": "deleted since the listing"}
        except errors.PreconditionFailed:
            return {
                **row,
                "status": "changed",
                "detail": "overwritten while being verified; rerun to check it",
            }
        except KeyNotFound as e:
            return {**row, "status": "missing-key", "detail": str(e)}
        except Truncated as e:
            return {**row, "status": "truncated", "detail": str(e)}
        except IntegrityError as e:
            return {**row, "status": "corrupt", "detail": str(e)}
        except FormatError as e:
            return {**row, "status": "unreadable", "detail": str(e)}
        except errors.S3Error as e:
            return {**row, "status": "unreadable", "detail": describe(e)}

    async def _check(self, env: TaskEnv, item: Listed, row: dict[str, Any]) -> dict[str, Any]:
        bucket = env.root.bucket
        p = await probe(env.backend, bucket, item.key)
        info = p.info
        row["size"] = info.size
        if not p.written_by_tsproxy:
            row["etag"], row["original_size"] = info.etag, info.size
            if p.has_trailer:
                raise IntegrityError(
                    "ends in a tsproxy trailer but lacks tsproxy's metadata, so it is served as is"
                )
            return await self._passthrough(env, item, info.etag, info.size)
        if p.tail_error is not None:
            raise p.tail_error
        if p.tail is None:
            raise Truncated("no tsproxy trailer at the end of a tsproxy object")
        manifest, ctx = await env.cpu(decode_tail, p.tail, env.ring)
        row.update(original_size=manifest.size, etag=manifest.etag, kek_id=manifest.kek_id)
        if p.data_size < manifest.data_size:
            raise Truncated(f"data area is {p.data_size} bytes, the manifest says {manifest.data_size}")
        if p.data_size > manifest.data_size:
            raise IntegrityError(f"data area is {p.data_size} bytes, the manifest says {manifest.data_size}")
        _check_metadata(info.metadata, manifest.size, manifest.etag)
        verifier = ChunkVerifier(manifest, ctx)
        if manifest.data_size:
            reader = await env.backend.get(bucket, item.key, 0, manifest.data_size - 1, if_match=info.etag)
            batch = bytearray()
            try:
                async for piece in reader:
                    batch += piece
                    if len(batch) >= BATCH:
                        await env.cpu(verifier.feed, bytes(batch))
                        batch.clear()
            finally:
                await reader.close()
            await env.cpu(verifier.feed, bytes(batch))
        verifier.finish()
        return {"status": "ok", "chunks": verifier.chunks}

    async def _passthrough(self, env: TaskEnv, item: Listed, etag: str, size: int) -> dict[str, Any]:
        if not self.check_passthrough:
            return {"status": "passthrough", "detail": "not checked"}
        if not _PLAIN_MD5.match(etag):
            return {"status": "passthrough", "detail": "multipart ETag: not an MD5 to check against"}
        md5 = hashlib.md5(usedforsecurity=False)
        seen = 0
        if size:
            reader = await env.backend.get(env.root.bucket, item.key, if_match=etag)
            try:
                async for piece in reader:
                    seen += len(piece)
                    await env.cpu(md5.update, piece)
            finally:
                await reader.close()
        if seen != size:
            raise Truncated(f"read {seen} bytes of a {size}-byte object")
        if md5.hexdigest() != etag:
            raise IntegrityError("content MD5 differs from the object's ETag")
        return {"status": "passthrough", "detail": "MD5 matches the ETag"}

    def failed(self, env: TaskEnv, item: Listed, error: BaseException) -> dict[str, Any]:
        return {
            "key": env.client_key(item.key) or item.key,
            "size": item.size,
            "original_size": None,
            "etag": None,
            "status": "error",
            "detail": describe(error),
            "kek_id": None,
            "chunks": None,
        }


def _check_metadata(meta: Mapping[str, str], size: int, etag: str) -> None:
    # Listings answer from these without reading the tail: they must not disagree with it.
    if META_SIZE in meta and meta[META_SIZE] != str(size):
        raise IntegrityError(f"backend metadata says {meta[META_SIZE]} bytes, the manifest {size}")
    if META_ETAG in meta and meta[META_ETAG] != etag:
        raise IntegrityError(f"backend metadata says ETag {meta[META_ETAG]}, the manifest {etag}")


def upload_rows(listing: Listing, at: float, stale_after: float) -> list[dict[str, Any]]:
    """One row per multipart upload left in the backend (tsproxy's own and the backend's)."""
    rows = []
    uploads = find_uploads(listing.internal, listing.root)
    for u in uploads:
        rows.append(
            {
                "kind": "tsproxy",
                "upload_id": u.upload_id,
                "key": u.prefix,
                "objects": u.objects,
                "bytes": u.bytes,
                "last_write": datetime.fromtimestamp(u.newest, UTC),
                "stale": u.stale(at, stale_after),
            }
        )
    # A backend upload that belongs to a listed client upload is part of that upload's row.
    for b in unowned(listing.backend_uploads, uploads):
        rows.append(
            {
                "kind": "backend",
                "upload_id": b.upload_id,
                "key": b.key,
                "objects": None,
                "bytes": None,
                "last_write": b.initiated,
                "stale": at - b.initiated.timestamp() >= stale_after,
            }
        )
    return rows


@dataclass
class VerifyReport:
    run: JobRun
    uploads: list[dict[str, Any]]
    at: float

    @property
    def tally(self) -> Tally:
        return self.run.summary

    @property
    def stale_uploads(self) -> list[dict[str, Any]]:
        return [u for u in self.uploads if u["stale"]]

    @property
    def ok(self) -> bool:
        """Every object checked out and no stale multipart upload is left."""
        return not self.tally.problem_count and not self.stale_uploads

    def text(self) -> str:
        t, s = self.tally, self.run.stats
        lines = [
            f"verify: {t.total} objects, {human_bytes(self.run.bytes)} stored, in {self.run.seconds:.1f}s "
            f"over {self.run.partitions} partitions ({human_bytes(s.bytes_in)} read from the backend)",
        ]
        lines += [
            f"  {status:<12} {n:>8}  {human_bytes(t.bytes[status])}" for status, n in sorted(t.counts.items())
        ]
        for u in self.uploads:
            when = age(self.at - u["last_write"].timestamp())
            state = "STALE" if u["stale"] else "in progress"
            lines.append(
                f"  {state} {u['kind']} multipart upload {u['upload_id']} ({u['key']}), last write {when} ago"
            )
        for ex in t.examples[:20]:
            lines.append(f"  {ex['status'].upper()}: {ex['key']}: {ex['detail']}")
        if len(t.examples) > 20 or t.problem_count > len(t.examples):
            lines.append(f"  ... {t.problem_count} problems in all: see objects/*.parquet")
        lines.append("  result: OK" if self.ok else "  result: PROBLEMS FOUND")
        return "\n".join(lines)


async def _list(options: JobOptions) -> Listing:
    async with opened_backend(options) as backend:
        return await list_bucket(backend, options, internal=True)


def verify(
    spark: Any,
    options: JobOptions,
    *,
    output: str | None = None,
    check_passthrough: bool = True,
    partitions: int = 0,
    progress_every: float = 10.0,
) -> VerifyReport:
    """Verify every object under `options.bucket`/`options.prefix`; per-object rows go to
    `<output>/objects/`, multipart leftovers to `<output>/uploads.parquet`."""
    listing = asyncio.run(_list(options))
    at = now()
    out = output_dir(output, "verify")
    run = run_job(
        spark,
        VerifyJob(check_passthrough),
        options,
        listing.objects,
        out,
        partitions=partitions,
        progress_every=progress_every,
    )
    uploads = upload_rows(listing, at, options.stale_after)
    write_rows(Path(out) / "uploads.parquet", uploads, UPLOADS_SCHEMA)
    report = VerifyReport(run, uploads, at)
    write_json(
        f"{out}/summary.json",
        {
            "job": "verify",
            "ok": report.ok,
            "counts": report.tally.counts,
            "bytes": report.tally.bytes,
            "stale_uploads": len(report.stale_uploads),
            "stats": run.stats,
            "seconds": run.seconds,
        },
    )
    return report
