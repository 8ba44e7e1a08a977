"""The data pipeline on Spark: a `tiered-kafka` data source and the archive export job.

Import-light on purpose: the CLI imports this package, and pyspark is only loaded when a session is.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from .options import SOURCE_NAME

__all__ = ["EXTRA_MODULES", "SOURCE_NAME", "missing_extra", "register"]

# What the 'spark' extra brings that the pipeline cannot start without (the codecs are checked when a
# batch needs them).
EXTRA_MODULES = ("pyspark", "pyarrow")


def missing_extra(command: str) -> str | None:
    """One line telling what to install when the 'spark' extra is missing, or None when it is there.

    Looks the modules up without importing them, so `--help` and this check stay fast.
    """
    for name in EXTRA_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return (
                f"tsproxy {command} needs the 'spark' extra (no module named {name!r}): "
                "pip install 'tsproxy[spark]'"
            )
    return None


def register(spark: Any) -> None:
    """Register the `tiered-kafka` source on a SparkSession: spark.read.format("tiered-kafka")."""
    from .source import TieredKafkaSource

    spark.dataSource.register(TieredKafkaSource)
