"""The SparkSession jobs run in: `local[*]` unless told otherwise, or the one spark-submit made."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any


def spark_session(
    master: str | None = "local[*]", app_name: str = "tsproxy-jobs", conf: Mapping[str, str] | None = None
) -> Any:
    """Get (or create) the SparkSession. `master=None`: spark-submit's master, else `local[*]`.

    In local mode the Python workers run this very interpreter, so they import the same tsproxy.
    Spark's own console progress bar is off: the jobs print their own progress lines.
    """
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    if master is None and not SparkConf().contains("spark.master"):
        master = "local[*]"  # not under spark-submit: run on this machine
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    settings = {"spark.ui.showConsoleProgress": "false", **(conf or {})}
    if master and master.startswith("local"):
        # PySpark starts its workers with $PYSPARK_PYTHON (else `python3` from PATH), which may not be
        # the interpreter that has tsproxy and pyarrow installed.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
