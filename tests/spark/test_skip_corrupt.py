"""skipCorrupt / --skip-corrupt: what was skipped is counted where a user sees it (the export's summary
and JSON, one log line per read that skipped anything), and a failed export is its one-line reason
without Spark's own log lines before it. The command-line cases run the real `tsproxy export`."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tsproxy
from tests.spark.conftest import BASE_TS, Tiered
from tests.spark.kafkadata import PartitionWriter, kafka_uuid, upload_aiven
from tsproxy.kafka.errors import CorruptRecordError
from tsproxy.kafka.records import iter_batches
from tsproxy.spark.export import ExportJob, run_export
from tsproxy.spark.options import parse_read_options

TREE = Path(tsproxy.__file__).resolve().parent.parent
TOPIC = "damaged"


@pytest.fixture(scope="module")
def damaged(tiered: Tiered) -> tuple[Tiered, str, int]:
    """Topic `damaged`: one segment of 6 batches of 4 records, the third batch's CRC-covered bytes
    flipped. Returns the store, the segment's key and how many records survive a skipping read."""
    writer = PartitionWriter(TOPIC, 0)
    for b in range(6):
        writer.batch([(BASE_TS + b * 10 + i, b"k%d" % i, b"v" * 50, ()) for i in range(4)])
    seg = writer.roll()
    third = list(iter_batches(seg.data))[2]
    bad = bytearray(seg.data)
    bad[third.position + 70] ^= 0x55
    seg = dataclasses.replace(seg, data=bytes(bad))
    [key] = upload_aiven(tiered.proxy.client(), tiered.bucket, tiered.prefix, [seg], kafka_uuid())
    return tiered, key, 20


def _job(tiered: Tiered, output: Path, skip: bool) -> ExportJob:
    source = parse_read_options(tiered.options(topics=TOPIC, skipCorrupt=str(skip).lower()))
    return ExportJob(source=source, output=str(output))


def test_export_counts_what_it_skipped(
    damaged: tuple[Tiered, str, int], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tiered, key, survivors = damaged
    with pytest.raises(CorruptRecordError):
        run_export(_job(tiered, tmp_path / "strict", skip=False), say=lambda _: None)
    with caplog.at_level(logging.WARNING, logger="tsproxy.spark.reading"):
        summary = run_export(_job(tiered, tmp_path / "skip", skip=True), say=lambda _: None)
    assert (summary.records, summary.corrupt_batches, summary.corrupt_segments) == (survivors, 1, 1)
    assert summary.as_dict()["corrupt_batches"] == 1 and summary.as_dict()["corrupt_segments"] == 1
    assert "corrupt batches skipped  1 stretches in 1 segment" in summary.table()
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(
        f"tsproxy: skipped 1 corrupt stretch of record batches in s3://{tiered.bucket}/{key}"
    )
    # A clean export says nothing of it.
    clean = run_export(
        ExportJob(source=parse_read_options(tiered.options(topics="orders")), output=str(tmp_path / "c")),
        say=lambda _: None,
    )
    assert clean.corrupt_batches == 0 and "corrupt" not in clean.table()


def tsproxy_export(tiered: Tiered, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    o = tiered.options()
    argv = [
        sys.executable, "-m", "tsproxy.cli", "export", "--master", "local[1]",
        "--endpoint", o["endpoint"], "--bucket", o["bucket"], "--prefix", o["prefix"], "--topics", TOPIC,
        "--access-key", o["accessKey"], "--secret-key", o["secretKey"], "--output", str(tmp_path / "out"),
        "--conf", "spark.ui.enabled=false", *extra,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env["PYTHONPATH"] = str(TREE)
    return subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)


@pytest.mark.spark
@pytest.mark.slow
def test_cli_skip_corrupt_reports_in_summary_json_and_log(
    damaged: tuple[Tiered, str, int], tmp_path: Path
) -> None:
    tiered, key, survivors = damaged
    done = tsproxy_export(tiered, tmp_path, "--skip-corrupt", "--json", str(tmp_path / "summary.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "corrupt batches skipped  1 stretches in 1 segment" in done.stdout
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert (doc["records"], doc["corrupt_batches"], doc["corrupt_segments"]) == (survivors, 1, 1)
    # The executor's line, once for the one read that skipped something.
    skipped = [line for line in done.stderr.splitlines() if "corrupt stretch" in line]
    assert len(skipped) == 1 and f"s3://{tiered.bucket}/{key}" in skipped[0], done.stderr


@pytest.mark.spark
@pytest.mark.slow
def test_cli_failure_is_its_reason_without_spark_logs(
    damaged: tuple[Tiered, str, int], tmp_path: Path
) -> None:
    tiered, key, _ = damaged
    done = tsproxy_export(tiered, tmp_path)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines[-1].startswith("tsproxy export: failed: CorruptRecordError: ") and key in lines[-1]
    # Spark's executor and scheduler logs (task failures, stack traces) are not shown: what remains is
    # our own lines and at most the JVM's note on its incubator module.
    noise = [
        line
        for line in lines[:-1]
        if not line.startswith(("tsproxy export: Spark", "export: ", "WARNING: Using incubator modules"))
    ]
    assert noise == [], done.stderr


def test_the_log_configuration_is_shipped_and_a_users_own_wins() -> None:
    from tsproxy.spark.session import LOG_CONFIG, quiet_java_options

    assert LOG_CONFIG.is_file() and "rootLogger.level = error" in LOG_CONFIG.read_text()
    assert quiet_java_options("") == f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}"
    assert quiet_java_options("-Xss4m").startswith("-Xss4m -Dlog4j2.configurationFile=file:")
    own = "-Dlog4j2.configurationFile=file:/etc/spark/log4j2.properties"
    assert quiet_java_options(own) == own
