"""migrate: turn objects tsproxy did not write into tsproxy objects, in place.

Each object is read once (streamed, pinned to the version listed by its ETag) and written back
through the object service under the same key: a single backend PUT or multipart completion replaces
it atomically, so a reader through tsproxy sees the old object (served as it is) or the new one
(decoded), always the same bytes. The new object keeps the ETag clients saw, its content type and its
user metadata. Content that does not match its size or MD5 ETag aborts that object's upload, leaving
the original in place. Without `apply` nothing is written: the run lists what would change.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar, cast
from urllib.parse import unquote

import pyarrow as pa

from tsproxy import errors
from tsproxy.format import is_tsproxy_trailer
from tsproxy.format.manifest import META_FORMAT
from tsproxy.store.base import ObjectInfo

from .driver import Listing, human_bytes, list_bucket, output_dir, write_json
from .engine import JobRun, ObjectJob, Tally, TaskEnv, describe, opened_backend, run_job
from .options import JobOptions
from .plan import Listed

SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("size", pa.int64()),
        ("etag", pa.string()),
        ("status", pa.string()),
        ("stored_size", pa.int64()),  # after migration
        ("detail", pa.string()),
    ]
)
# "suspect": ends like a tsproxy object but lacks its metadata; migrating it would wrap it twice.
PROBLEMS = frozenset({"suspect", "changed", "error"})
_PLAIN_MD5 = re.compile(r"[0-9a-f]{32}\Z")


class SourceChanged(errors.S3Error):
    """The bytes read are not the object that was listed (size or MD5 differ): nothing is written."""

    code = "PreconditionFailed"
    status = 412


class MigrateJob(ObjectJob):
    name: ClassVar[str] = "migrate"
    schema: ClassVar[pa.Schema] = SCHEMA

    def __init__(self, apply: bool = False) -> None:
        self.apply = apply

    def new_summary(self) -> Tally:
        return Tally(PROBLEMS)

    async def process(self, env: TaskEnv, item: Listed) -> dict[str, Any]:
        key = env.client_key(item.key)
        assert key is not None
        row: dict[str, Any] = {
            "key": key,
            "size": item.size,
            "etag": item.etag,
            "stored_size": None,
            "detail": None,
        }
        bucket = env.root.bucket
        try:
            info, end = await _last_bytes(env, bucket, item.key)
            row.update(size=info.size, etag=info.etag)
            if META_FORMAT in info.metadata:
                return {**row, "status": "already", "stored_size": info.size}
            if is_tsproxy_trailer(end):
                detail = "ends in a tsproxy trailer without tsproxy metadata: left alone"
                return {**row, "status": "suspect", "detail": detail}
            if not self.apply:
                return {**row, "status": "would-migrate"}
            stored = await self._migrate(env, key, item.key, info)
        except errors.NoSuchKey:
            return {**row, "status": "vanished", "detail": "deleted since the listing"}
        except (errors.PreconditionFailed, SourceChanged) as e:
            return {**row, "status": "changed", "detail": f"{e}; rerun to migrate it"}
        return {**row, "status": "migrated", "stored_size": stored}

    async def _migrate(self, env: TaskEnv, key: str, backend_key: str, info: ObjectInfo) -> int:
        bucket = env.root.bucket
        check_md5 = _PLAIN_MD5.match(info.etag) is not None

        async def payload() -> AsyncIterator[bytes]:
            md5 = hashlib.md5(usedforsecurity=False)
            seen = 0
            if info.size:
                reader = await env.backend.get(bucket, backend_key, if_match=info.etag)
                try:
                    async for piece in reader:
                        seen += len(piece)
                        if check_md5:
                            await env.cpu(md5.update, piece)
                        yield piece
                finally:
                    await reader.close()
            # Raising here, before the stream ends, makes the object service abort the new object.
            if seen != info.size:
                raise SourceChanged(f"read {seen} bytes of a {info.size}-byte object")
            if check_md5 and md5.hexdigest() != info.etag:
                raise SourceChanged("content MD5 differs from the listed ETag")

        metadata = {k: unquote(v) for k, v in info.metadata.items()}
        obj = await env.service().put(
            env.options.bucket,
            key,
            payload(),
            content_type=info.content_type,
            metadata=metadata,
            headers={},
            size_hint=info.size,
            etag=info.etag,
        )
        head = await env.backend.head(bucket, obj.loc.key)
        return head.size

    def failed(self, env: TaskEnv, item: Listed, error: BaseException) -> dict[str, Any]:
        key = env.client_key(item.key) or item.key
        return {
            "key": key,
            "size": item.size,
            "etag": item.etag,
            "status": "error",
            "stored_size": None,
            "detail": describe(error),
        }


async def _last_bytes(env: TaskEnv, bucket: str, key: str) -> tuple[ObjectInfo, bytes]:
    try:
        return await env.backend.get_bytes(bucket, key, -16, None)
    except errors.InvalidRange:  # an empty object has no last bytes
        return await env.backend.head(bucket, key), b""


@dataclass
class MigrateReport:
    run: JobRun
    apply: bool

    @property
    def tally(self) -> Tally:
        return cast(Tally, self.run.summary)

    @property
    def ok(self) -> bool:
        return not self.tally.problem_count

    def text(self) -> str:
        t = self.tally
        mode = "" if self.apply else " (dry run: nothing written; --apply to migrate)"
        lines = [
            f"migrate{mode}: {t.total} objects in {self.run.seconds:.1f}s, {self.run.partitions} partitions"
        ]
        for status, n in sorted(t.counts.items()):
            lines.append(f"  {status:<14} {n:>8}  {human_bytes(t.bytes[status])}")
        for ex in t.examples[:20]:
            lines.append(f"  {ex['status'].upper()}: {ex['key']}: {ex['detail']}")
        return "\n".join(lines)


async def _list(options: JobOptions) -> Listing:
    async with opened_backend(options) as backend:
        return await list_bucket(backend, options)


def migrate(
    spark: Any,
    options: JobOptions,
    *,
    output: str | None = None,
    apply: bool = False,
    partitions: int = 0,
    progress_every: float = 10.0,
    show: int = 20,
) -> MigrateReport:
    """Migrate (with `apply`) or list (without) foreign objects under `options.bucket`/`options.prefix`."""
    listing = asyncio.run(_list(options))
    out = output_dir(output, "migrate")
    run = run_job(
        spark,
        MigrateJob(apply),
        options,
        listing.objects,
        out,
        partitions=partitions,
        progress_every=progress_every,
    )
    report = MigrateReport(run, apply)
    write_json(
        f"{out}/summary.json",
        {
            "job": "migrate",
            "apply": apply,
            "ok": report.ok,
            "counts": report.tally.counts,
            "bytes": report.tally.bytes,
            "stats": run.stats,
            "seconds": run.seconds,
        },
    )
    if not apply and show:
        _print_plan(out, show)
    return report


def _print_plan(out: str, show: int) -> None:
    """Name the first objects a dry run would migrate (all of them are in objects/*.parquet)."""
    import pyarrow.dataset as ds

    table = ds.dataset(f"{out}/objects", format="parquet").to_table(
        columns=["key", "size"], filter=ds.field("status") == "would-migrate"
    )
    for key, size in list(zip(table["key"].to_pylist(), table["size"].to_pylist(), strict=True))[:show]:
        print(f"  would migrate {key} ({size} bytes)")
    if table.num_rows > show:
        print(f"  ... and {table.num_rows - show} more")
