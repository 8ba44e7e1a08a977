"""What a job's executors need to reach the backend: plain, picklable values, never clients.

The driver builds one `JobOptions` (usually from the same configuration `tsproxy serve` reads) and Spark
ships it to every task; each task opens its own backend and key ring from it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tsproxy.config import Config
from tsproxy.format import KeyRing, TransformSettings
from tsproxy.store import open_backend
from tsproxy.store.base import Backend
from tsproxy.store.observe import OnRequest

DEFAULT_STALE_AFTER = 24 * 3600.0


@dataclass(frozen=True)
class JobOptions:
    """Where the objects are and how hard a job may press on the backend.

    `bucket` is the client's bucket (with `backend_bucket` set, client buckets live under
    `<backend_prefix><bucket>/` in that one backend bucket, as the server maps them). `rate` is backend
    requests a second per executor (0: unlimited), shared by the `task_slots` tasks an executor runs at
    once. `key_ring` is a path every executor can read.
    """

    backend: str
    bucket: str
    prefix: str = ""
    key_ring: str | None = None
    region: str | None = None
    path_style: bool = True
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    max_attempts: int = 5
    part_size: int = 25 << 20
    backend_bucket: str | None = None
    backend_prefix: str = ""
    rate: float = 0.0
    task_slots: int = 1
    concurrency: int = 8
    threads: int = 2
    chunk_size: int = 4 << 20
    compression: str = "auto"
    compression_level: int = 3
    encryption: bool = True
    stale_after: float = DEFAULT_STALE_AFTER

    def __post_init__(self) -> None:
        if not self.bucket:
            raise ValueError("a job needs a bucket")
        if self.rate < 0:
            raise ValueError("rate cannot be negative")
        if self.concurrency < 1 or self.threads < 1 or self.task_slots < 1:
            raise ValueError("concurrency, threads and task_slots must be at least 1")

    @classmethod
    def from_config(cls, cfg: Config, bucket: str, **overrides: Any) -> JobOptions:
        """Options for a bucket behind the server that `cfg` configures (backend, key ring, transform)."""
        backend = cfg.backend
        if cfg.local_backend:
            backend = "file://" + str(cfg.backend_path().resolve())
        values: dict[str, Any] = dict(
            backend=backend,
            bucket=bucket,
            key_ring=str(cfg.key_ring) if cfg.key_ring else None,
            region=cfg.backend_region,
            path_style=cfg.backend_path_style,
            access_key=cfg.backend_access_key,
            secret_key=cfg.backend_secret_key,
            max_attempts=cfg.backend_max_attempts,
            part_size=cfg.backend_part_size,
            backend_bucket=cfg.backend_bucket,
            backend_prefix=cfg.backend_prefix,
            chunk_size=cfg.chunk_size,
            compression=cfg.compression,
            compression_level=cfg.compression_level,
            encryption=cfg.encryption,
        )
        values.update(overrides)
        return cls(**values)

    def replace(self, **changes: Any) -> JobOptions:
        return dataclasses.replace(self, **changes)

    @property
    def local(self) -> bool:
        return self.backend.startswith("file:")

    @property
    def task_rate(self) -> float:
        """This task's share of the executor's request rate (0: unlimited)."""
        return self.rate / self.task_slots if self.rate else 0.0

    def open_backend(self, on_request: OnRequest | None = None) -> Backend:
        """A backend (not yet started) configured like the server's."""
        if self.local:
            return open_backend(self.backend, on_request=on_request)
        return open_backend(
            self.backend,
            region=self.region,
            path_style=self.path_style,
            access_key=self.access_key,
            secret_key=self.secret_key,
            max_attempts=self.max_attempts,
            part_size=self.part_size,
            on_request=on_request,
        )

    def load_ring(self) -> KeyRing | None:
        """The key ring, or None when the job runs without one (unencrypted data)."""
        return KeyRing.load(self.key_ring) if self.key_ring else None

    def transform(self) -> TransformSettings:
        """How `migrate` writes new objects."""
        return TransformSettings(
            chunk_size=self.chunk_size,
            compression=self.compression,  # type: ignore[arg-type]
            level=self.compression_level,
            encryption=self.encryption,
        )
