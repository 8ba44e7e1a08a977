"""Bulk maintenance on Spark, directly against the backend: rewrap, verify, inventory, migrate.

The driver lists a bucket once and spreads the keys over partitions; each task opens its own backend
(from plain `JobOptions`), holds to its share of the per-executor request rate and runs its objects
with asyncio. docs/JOBS.md explains each job; `tsproxy jobs --help` runs them.

The jobs need the 'spark' extra (pyarrow, pyspark). Without it this package still imports, so that
`tsproxy jobs --help` works and a job run can say which extra to install; its names then raise an
ImportError saying the same.
"""

from __future__ import annotations

from typing import Any

from tsproxy.spark import missing_extra

__all__ = [
    "InventoryReport",
    "JobOptions",
    "MigrateReport",
    "RewrapReport",
    "VerifyReport",
    "inventory",
    "migrate",
    "rewrap",
    "spark_session",
    "verify",
]

_MISSING = missing_extra("jobs")

if _MISSING is None:
    from tsproxy.spark.session import spark_session

    from .inventory import InventoryReport, inventory
    from .migrate import MigrateReport, migrate
    from .options import JobOptions
    from .rewrap import RewrapReport, rewrap
    from .verify import VerifyReport, verify


def __getattr__(name: str) -> Any:
    if name in __all__ and _MISSING is not None:
        raise ImportError(_MISSING)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
