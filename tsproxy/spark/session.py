"""A SparkSession for tsproxy's jobs: local[*] by default, any master when given.

On a local master, Python workers run the interpreter that runs the driver (the one tsproxy is
installed in) unless PYSPARK_PYTHON says otherwise; Spark's console progress bar is off because the
jobs report their own progress.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any


def spark_session(
    master: str | None = "local[*]", app_name: str = "tsproxy", conf: Mapping[str, str] | None = None
) -> Any:
    """Get or create a SparkSession with the tiered-kafka source registered.

    `master=None`: the master spark-submit gave, else `local[*]`.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    from . import register

    if master is None and not _submitted_master(SparkConf, SparkContext):
        master = "local[*]"  # not under spark-submit: run on this machine

    if master and master.startswith("local"):
        # PySpark takes the Python of its workers (and of data source planning) from this variable;
        # locally that must be this interpreter, the one tsproxy is installed in. Under spark-submit
        # the cluster's own setting stands.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    settings = {
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        **(conf or {}),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    # One line naming where the work runs: a job meant for a cluster that ran locally is obvious.
    print(f"{app_name}: Spark {spark.version} on {spark.sparkContext.master}", file=sys.stderr, flush=True)
    return spark


def _submitted_master(conf_class: Any, context_class: Any) -> bool:
    """True when spark-submit (or spark-defaults.conf) named a master.

    Before the JVM gateway is up a SparkConf is an empty Python dict, blind to what spark-submit
    passed; so the gateway is started first (the session would start it anyway) and the conf read
    from the JVM's system properties.
    """
    context_class._ensure_initialized()
    return bool(conf_class().contains("spark.master"))
