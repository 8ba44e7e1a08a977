"""Bulk maintenance on Spark, straight against the backend: rewrap, verify, inventory, migrate.

The driver lists a bucket once and spreads the keys over partitions; each task opens its own backend
(from plain `JobOptions`), holds to its share of the per-executor request rate and runs its objects
with asyncio. docs/JOBS.md explains each job; `tsproxy jobs --help` runs them.
"""

from tsproxy.spark.session import spark_session

from .inventory import InventoryReport, inventory
from .migrate import MigrateReport, migrate
from .options import JobOptions
from .rewrap import RewrapReport, rewrap
from .verify import VerifyReport, verify

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
