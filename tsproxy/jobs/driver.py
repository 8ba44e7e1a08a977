"""Driver-side helpers shared by the jobs: the one listing, the output directory, summaries."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tsproxy.service import Namespace
from tsproxy.service.namespace import ESCAPED
from tsproxy.store.base import Backend, MultipartCapable, UploadInfo

from .listing import list_keys
from .options import JobOptions
from .plan import INTERNAL, Listed, internal_part


@dataclass
class Listing:
    """A bucket root listed once: the client's objects under the prefix, and tsproxy's internal objects."""

    backend_bucket: str
    root: str  # key prefix of the client bucket inside the backend bucket ("" when not mapped)
    objects: list[Listed]
    internal: list[Listed]
    backend_uploads: list[UploadInfo]


async def list_bucket(backend: Backend, options: JobOptions, *, internal: bool = False) -> Listing:
    """List the job's bucket and prefix; with `internal`, also `.tsproxy/` and backend multipart uploads."""
    ns = Namespace(options.backend_bucket, options.backend_prefix)
    root = ns.root(options.bucket)
    listed = await list_keys(backend, root.bucket, root.key + options.prefix)
    if options.prefix:
        # Escaped keys live under a prefix of their own (see service.namespace), whatever they start with.
        escaped = await list_keys(backend, root.bucket, root.key + ESCAPED)
        listed += [
            i for i in escaped if (ns.client_key(options.bucket, i.key) or "").startswith(options.prefix)
        ]
    objects = [i for i in listed if internal_part(i.key, root.key) is None]
    inner: list[Listed] = []
    uploads: list[UploadInfo] = []
    if internal:
        if options.prefix:
            inner = await list_keys(backend, root.bucket, root.key + INTERNAL)
        else:  # already listed with everything else
            inner = [i for i in listed if internal_part(i.key, root.key) is not None]
        if isinstance(backend, MultipartCapable):  # a backend without multipart has no leftovers
            uploads = await backend.list_multipart_uploads(root.bucket, root.key + options.prefix)
    return Listing(root.bucket, root.key, objects, inner, uploads)


def output_dir(output: str | None, job: str) -> str:
    """The run's output directory: the one given, or ./tsproxy-jobs/<job>-<UTC time>."""
    if output:
        path = Path(output)
    else:
        path = Path("tsproxy-jobs") / f"{job}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    path.mkdir(parents=True, exist_ok=True)
    return str(path.resolve())


def write_json(path: str | os.PathLike[str], doc: Mapping[str, Any]) -> None:
    """Write a JSON document next to the Parquet output (atomically)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=_jsonable) + "\n", encoding="utf-8")
    os.replace(tmp, target)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, frozenset | set):
        return sorted(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


def age(seconds: float) -> str:
    """A short age: '45s', '12m', '5h', '3d'."""
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def now() -> float:
    return time.time()
