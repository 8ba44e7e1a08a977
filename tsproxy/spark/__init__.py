"""The data pipeline on Spark: a `tiered-kafka` data source and the archive export job.

Import-light on purpose: the CLI imports this package, and pyspark is only loaded when a session is.
"""

from __future__ import annotations

from typing import Any

from .options import SOURCE_NAME

__all__ = ["SOURCE_NAME", "register"]


def register(spark: Any) -> None:
    """Register the `tiered-kafka` source on a SparkSession: spark.read.format("tiered-kafka")."""
    from .source import TieredKafkaSource

    spark.dataSource.register(TieredKafkaSource)
