"""What a job's executors need to reach the backend: plain, picklable values, never clients.

The driver builds one `JobOptions` around the validated settings `tsproxy serve` reads (a `Config`:
backend, key ring, transform) and Spark ships it to every task; each task opens its own backend and
key ring from it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tsproxy import defaults
from tsproxy.config import Config
from tsproxy.format import KeyRing, TransformSettings
from tsproxy.store.base import Backend
from tsproxy.store.observe import OnRequest

DEFAULT_STALE_AFTER = defaults.JOB_STALE_AFTER


@dataclass(frozen=True)
class JobOptions:
    """The settings of the server whose objects a job works on, and how hard the job may press.

    `settings` is a validated Config; its backend URL names an absolute directory when it is a local
    one, so that executors in another working directory find it. `bucket` is the client's bucket (with
    `backend_bucket` set, client buckets live under `<backend_prefix><bucket>/` in that one backend
    bucket, as the server maps them). `rate` is backend requests a second per executor (0: unlimited),
    shared by the `task_slots` tasks an executor runs at once. The key ring is a path every executor
    can read.
    """

    settings: Config
    bucket: str
    prefix: str = ""
    rate: float = 0.0
    task_slots: int = 1
    concurrency: int = defaults.JOB_CONCURRENCY
    threads: int = defaults.JOB_THREADS
    stale_after: float = DEFAULT_STALE_AFTER

    def __post_init__(self) -> None:
        if not self.bucket:
            raise ValueError("a job needs a bucket")
        if self.rate < 0:
            raise ValueError("rate cannot be negative")
        if self.concurrency < 1 or self.threads < 1 or self.task_slots < 1:
            raise ValueError("concurrency, threads and task_slots must be at least 1")

    @classmethod
    def from_config(cls, cfg: Config, bucket: str, **job: Any) -> JobOptions:
        """Options for a bucket behind the server that `cfg` configures; `job` sets the job's own fields."""
        if cfg.local_backend:
            cfg = cfg.replace(backend=cfg.backend_settings().url)
        return cls(settings=cfg, bucket=bucket, **job)

    def replace(self, **changes: Any) -> JobOptions:
        """A copy with job fields and settings (Config field names, parsed values) changed."""
        own = {f.name for f in dataclasses.fields(self)}
        settings = {k: v for k, v in changes.items() if k not in own}
        if settings:
            changes = {k: v for k, v in changes.items() if k in own}
            changes["settings"] = changes.get("settings", self.settings).replace(**settings)
        return dataclasses.replace(self, **changes)

    # The settings a job's code and its reports look at, by the names jobs use.
    @property
    def backend(self) -> str:
        return self.settings.backend

    @property
    def key_ring(self) -> str | None:
        return str(self.settings.key_ring) if self.settings.key_ring is not None else None

    @property
    def access_key(self) -> str | None:
        return self.settings.backend_access_key

    @property
    def secret_key(self) -> str | None:
        return self.settings.backend_secret_key

    @property
    def backend_bucket(self) -> str | None:
        return self.settings.backend_bucket

    @property
    def backend_prefix(self) -> str:
        return self.settings.backend_prefix

    @property
    def part_size(self) -> int:
        return self.settings.backend_part_size

    @property
    def chunk_size(self) -> int:
        return self.settings.chunk_size

    @property
    def compression(self) -> str:
        return self.settings.compression

    @property
    def encryption(self) -> bool:
        return self.settings.encryption

    @property
    def local(self) -> bool:
        return self.settings.local_backend

    @property
    def task_rate(self) -> float:
        """This task's share of the executor's request rate (0: unlimited)."""
        return self.rate / self.task_slots if self.rate else 0.0

    def open_backend(self, on_request: OnRequest | None = None) -> Backend:
        """A backend (not yet started) configured like the server's."""
        return self.settings.backend_settings().open(on_request)

    def load_ring(self) -> KeyRing | None:
        """The key ring, or None when the job runs without one (unencrypted data)."""
        path: Path | None = self.settings.key_ring
        return KeyRing.load(path) if path is not None else None

    def transform(self) -> TransformSettings:
        """How `migrate` writes new objects."""
        return self.settings.transform_settings()
