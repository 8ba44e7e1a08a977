"""Deleting what the inventory found dead: objects of topics that no longer exist, and multipart
uploads nobody finished. A dry run (the default) only says what would go.

Deletion runs on the driver: it moves no data, a thousand keys a request, through the same rate limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tsproxy.s3.limits import MAX_DELETE_KEYS
from tsproxy.service import Namespace
from tsproxy.store.base import multipart_of

from .engine import ROWS_DIR, opened_backend
from .options import JobOptions
from .plan import UploadLeftover
from .ratelimit import RateLimitedRequests, RateLimiter


@dataclass
class Cleanup:
    """What a cleanup removes (backend keys) and aborts (backend multipart uploads)."""

    orphan_keys: list[str] = field(default_factory=list)
    orphan_bytes: int = 0
    upload_keys: list[str] = field(default_factory=list)
    upload_bytes: int = 0
    backend_uploads: list[tuple[str, str]] = field(default_factory=list)  # (key, upload id)
    failures: list[tuple[str, str, str]] = field(default_factory=list)  # (key, code, message)
    applied: bool = False

    @property
    def keys(self) -> list[str]:
        return self.orphan_keys + self.upload_keys

    def text(self, show: int = 20) -> str:
        verb = "deleted" if self.applied else "would delete"
        lines = [
            f"cleanup{'' if self.applied else ' (dry run: nothing deleted; --apply to delete)'}:",
            f"  {verb} {len(self.orphan_keys)} orphan objects ({self.orphan_bytes} bytes)",
            f"  {verb} {len(self.upload_keys)} objects of stale uploads ({self.upload_bytes} bytes)",
            f"  {'aborted' if self.applied else 'would abort'} {len(self.backend_uploads)} backend uploads",
        ]
        lines += [f"  {verb} {k}" for k in self.keys[:show]]
        if len(self.keys) > show:
            lines.append(f"  ... and {len(self.keys) - show} more")
        lines += [f"  FAILED {k}: {code} {msg}" for k, code, msg in self.failures[:show]]
        return "\n".join(lines)


def orphan_rows(out_dir: str) -> list[tuple[str, int]]:
    """(client key, stored size) of the rows an inventory marked as orphans."""
    import pyarrow.dataset as ds

    table = ds.dataset(str(Path(out_dir) / ROWS_DIR), format="parquet").to_table(
        columns=["key", "stored_size"], filter=ds.field("orphan")
    )
    return list(zip(table["key"].to_pylist(), table["stored_size"].to_pylist(), strict=True))


def plan_cleanup(
    options: JobOptions,
    orphans: list[tuple[str, int]],
    leftovers: list[UploadLeftover],
    backend_uploads: list[tuple[str, str]],
) -> Cleanup:
    """The deletions for orphan rows (client keys), stale tsproxy uploads and stale backend uploads."""
    ns = Namespace(options.backend_bucket, options.backend_prefix)
    plan = Cleanup(backend_uploads=list(backend_uploads))
    for key, size in orphans:
        plan.orphan_keys.append(ns.object(options.bucket, key).key)
        plan.orphan_bytes += size or 0
    for upload in leftovers:
        plan.upload_keys += upload.keys
        plan.upload_bytes += upload.bytes
    return plan


async def apply_cleanup(options: JobOptions, plan: Cleanup) -> Cleanup:
    """Delete and abort what the plan says; failures are recorded, not raised."""
    bucket = Namespace(options.backend_bucket, options.backend_prefix).root(options.bucket).bucket
    async with opened_backend(options, RateLimitedRequests(RateLimiter(options.rate))) as backend:
        keys = plan.keys
        for start in range(0, len(keys), MAX_DELETE_KEYS):
            plan.failures += await backend.delete_many(bucket, keys[start : start + MAX_DELETE_KEYS])
        for key, upload_id in plan.backend_uploads:
            try:
                await multipart_of(backend).abort_multipart(bucket, key, upload_id)
            except Exception as e:  # keep going: report it with the rest
                plan.failures.append((key, type(e).__name__, str(e)))
    plan.applied = True
    return plan
