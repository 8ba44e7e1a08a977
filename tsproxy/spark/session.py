"""A SparkSession for tsproxy's jobs: local[*] by default, any master when given.

Python workers run the interpreter that runs the driver (the one tsproxy is installed in), on every
master, unless PYSPARK_PYTHON or `spark.pyspark.python` names another; Spark's console progress bar
is off because the jobs report their own progress.

When tsproxy starts the JVM itself (not under spark-submit), Spark logs with log4j2.properties next to
this module: errors only, and no task failure stack traces (the commands end with one line saying why
they failed). Under spark-submit the cluster's log configuration stands, at WARN on the driver.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

LOG_CONFIG = Path(__file__).with_name("log4j2.properties")
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


def spark_session(
    master: str | None = "local[*]",
    app_name: str = "tsproxy",
    conf: Mapping[str, str] | None = None,
    *,
    with_source: bool = True,
) -> Any:
    """Get or create a SparkSession, with the tiered-kafka source registered unless `with_source` is
    False (registering builds Spark SQL's session state, seconds of JVM start-up that the RDD-only
    export does not need).

    `master=None`: the master spark-submit gave, else `local[*]`.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    from . import register

    settings = {
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        **(conf or {}),
    }
    worker_python(settings)  # before the JVM starts: it reads the variable once, at its start
    quiet = _starts_jvm(SparkContext)
    if quiet:
        settings[DRIVER_JAVA_OPTIONS] = quiet_java_options(settings.get(DRIVER_JAVA_OPTIONS, ""))
    if master is None and not _submitted_master(SparkConf, SparkContext, settings):
        master = "local[*]"  # not under spark-submit: run on this machine

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if not quiet:
        spark.sparkContext.setLogLevel("WARN")
    if with_source:
        register(spark)
    # One line naming where the work runs: a job meant for a cluster that ran locally is obvious.
    print(f"{app_name}: Spark {spark.version} on {spark.sparkContext.master}", file=sys.stderr, flush=True)
    return spark


def worker_python(settings: Mapping[str, str]) -> str:
    """Make Spark's Python workers (and its data source planning) run the Python the user configured,
    else this interpreter, the one tsproxy is installed in; returns the one chosen.

    PySpark takes the workers' Python from PYSPARK_PYTHON alone (`python3` on the PATH without it, which
    seldom has tsproxy): `spark.pyspark.python` in the command's `--conf` is honoured by setting it there,
    and spark-submit turns its own `spark.pyspark.python` into the variable before this process starts.
    On a cluster the path must exist on every node (docs/PIPELINE.md).
    """
    configured = settings.get("spark.pyspark.python")
    if configured:
        os.environ["PYSPARK_PYTHON"] = configured
    return os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def quiet_java_options(options: str) -> str:
    """Driver JVM options with Spark's logging configured by LOG_CONFIG (unless they configure it)."""
    if "log4j2.configurationFile" in options or "log4j.configurationFile" in options:
        return options
    return f"{options} -Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}".strip()


def _starts_jvm(context_class: Any) -> bool:
    """True when this process will launch Spark's JVM (not spark-submit, and no session yet)."""
    return context_class._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ


def _submitted_master(conf_class: Any, context_class: Any, settings: Mapping[str, str]) -> bool:
    """True when spark-submit (or spark-defaults.conf) named a master.

    Before the JVM gateway is up a SparkConf is an empty Python dict, blind to what spark-submit
    passed; so the gateway is started first (the session would start it anyway; with `settings`, as
    the JVM's options are fixed at its start) and the conf read from the JVM's system properties.
    """
    context_class._ensure_initialized(conf=conf_class(loadDefaults=False).setAll(list(settings.items())))
    return bool(conf_class().contains("spark.master"))
