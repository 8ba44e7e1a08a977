"""The export: Parquet files like the Kafka Connect S3 sink writes, exactly once, incremental.

Most cases run the export in-process (the same per-segment code Spark runs); the Spark cases run it on
the shared local[2] session and through the command line, and check that the output is the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.spark.conftest import BASE_TS, Tiered
from tests.spark.kafkadata import BuiltSegment, PartitionWriter, Row, kafka_uuid, upload_aiven
from tsproxy.errors import ConfigError, NoSuchKey
from tsproxy.spark import cli
from tsproxy.spark.bucket import Bucket
from tsproxy.spark.export import STATE_DIR, ExportJob, export_segment, plan_export, run_export
from tsproxy.spark.options import StoreOptions, parse_read_options
from tsproxy.spark.output import open_output


def job(tiered: Tiered, output: str, topics: str = "orders", **kw: Any) -> ExportJob:
    return ExportJob(source=parse_read_options(tiered.options(topics=topics)), output=output, **kw)


def _headers(headers: list[dict[str, Any]] | None) -> tuple[tuple[str, bytes | None], ...]:
    # A record without headers has null there, like Spark's Kafka source: never an empty array.
    assert headers != [], "empty headers array where Spark's Kafka source has null"
    return tuple((h["key"], h["value"]) for h in headers or ())


def file_rows(table: pa.Table) -> list[Row]:
    t = table.set_column(5, "timestamp", table.column("timestamp").cast(pa.int64()))
    return [
        (r["offset"], r["timestamp"], r["timestampType"], r["key"], r["value"], _headers(r["headers"]))
        for r in t.to_pylist()
    ]


def digests(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def segment_file(seg: BuiltSegment) -> str:
    t, p = seg.topic, seg.partition
    return f"topic={t}/partition={p}/{t}+{p}+{seg.base_offset:020d}.parquet"


def quiet(_: str) -> None:
    pass


def test_one_parquet_file_per_segment_with_every_record(tiered: Tiered, tmp_path: Path) -> None:
    summary = run_export(job(tiered, str(tmp_path)), say=quiet)
    segments = [s for p in (0, 1) for s in tiered.segments("orders", p)]
    assert summary.segments == len(segments) and summary.skipped == 0
    assert summary.records == sum(len(s.rows) for s in segments)
    for seg in segments:
        path = tmp_path / segment_file(seg)
        assert file_rows(pq.read_table(path)) == seg.rows
        meta = pq.ParquetFile(path).metadata
        assert meta.row_group(0).column(0).compression == "ZSTD"
    data_files = [p for p in digests(tmp_path) if not p.startswith("_")]
    assert len(data_files) == len(segments)  # nothing else, no temporary leftovers
    markers = [p for p in digests(tmp_path) if p.startswith(STATE_DIR)]
    assert len(markers) == len(segments)
    doc = json.loads((tmp_path / markers[0]).read_text())
    assert doc["files"] and doc["records"] > 0 and doc["source"].startswith("s3://")


def test_read_committed_export_leaves_out_aborted_transactions(tiered: Tiered, tmp_path: Path) -> None:
    source = parse_read_options(tiered.options(topics="orders", isolationLevel="read_committed"))
    summary = run_export(ExportJob(source=source, output=str(tmp_path)), say=quiet)
    aborted = tiered.writers[("orders", 0)].aborted_offsets
    assert aborted  # the test data holds an aborted transaction
    segments = [s for p in (0, 1) for s in tiered.segments("orders", p)]
    kept = [[r for r in s.rows if not (s.partition == 0 and r[0] in aborted)] for s in segments]
    assert summary.records == sum(len(rows) for rows in kept)
    for seg, rows in zip(segments, kept, strict=True):
        assert file_rows(pq.read_table(tmp_path / segment_file(seg))) == rows


def test_reruns_skip_what_is_done_and_full_reruns_write_the_same_bytes(
    tiered: Tiered, tmp_path: Path
) -> None:
    run_export(job(tiered, str(tmp_path)), say=quiet)
    first = digests(tmp_path)
    again = run_export(job(tiered, str(tmp_path)), say=quiet)
    assert again.segments == 0 and again.skipped == 6
    assert digests(tmp_path) == first
    full = run_export(job(tiered, str(tmp_path), incremental=False), say=quiet)
    assert full.segments == 6
    assert digests(tmp_path) == first


def test_incremental_runs_export_new_segments_and_never_duplicate_overlaps(
    tiered: Tiered, tmp_path: Path
) -> None:
    client = tiered.proxy.client()
    topic_id = kafka_uuid()
    writer = PartitionWriter("grow", 0)
    for n in range(2):
        writer.batch([(BASE_TS + n * 10 + i, b"k", b"v%d" % i, ()) for i in range(10)])
        writer.roll()
    upload_aiven(client, tiered.bucket, tiered.prefix, writer.segments, topic_id)
    assert run_export(job(tiered, str(tmp_path), topics="grow"), say=quiet).segments == 2
    # A new leader re-uploads the last segment's second half with more records after it.
    last = writer.segments[-1]
    overlap = PartitionWriter("grow", 0, start_offset=last.base_offset + 5)
    overlap.batch([(BASE_TS + 100 + i, b"k", b"again%d" % i, ()) for i in range(5)])
    overlap.batch([(BASE_TS + 200 + i, b"k", b"new%d" % i, ()) for i in range(7)])
    overlap.roll()
    upload_aiven(client, tiered.bucket, tiered.prefix, overlap.segments, topic_id)
    summary = run_export(job(tiered, str(tmp_path), topics="grow"), say=quiet)
    assert (summary.segments, summary.skipped, summary.records) == (1, 2, 7)
    offsets = [
        r[0]
        for f in sorted(tmp_path.glob("topic=grow/partition=0/*.parquet"))
        for r in file_rows(pq.read_table(f))
    ]
    assert offsets == list(range(0, last.next_offset + 7))  # every offset once


def test_hourly_layout_puts_each_record_in_its_hour(tiered: Tiered, tmp_path: Path) -> None:
    writer = PartitionWriter("hours", 0)
    hour = 3_600_000
    start = (BASE_TS // hour) * hour
    writer.batch([(start + h * hour + 5, b"k", b"h%d" % h, ()) for h in (0, 0, 1, 3)])
    writer.batch([(start + 2 * hour, b"k", b"late", ())])
    writer.roll()
    upload_aiven(tiered.proxy.client(), tiered.bucket, tiered.prefix, writer.segments, kafka_uuid())
    run_export(job(tiered, str(tmp_path), topics="hours", partition_by="hourly"), say=quiet)
    files = sorted(tmp_path.glob("topic=hours/year=*/month=*/day=*/hour=*/hours+0+*.parquet"))
    assert len(files) == 4
    got = []
    for f in files:
        hour_dir = int(f.parent.name.removeprefix("hour="))
        rows = file_rows(pq.read_table(f))
        assert {(r[1] // hour) % 24 for r in rows} == {hour_dir}
        got += rows
    assert sorted(got) == sorted(writer.segments[0].rows)


def test_s3_output_through_tsproxy(tiered: Tiered) -> None:
    client = tiered.proxy.client()
    client.create_bucket(Bucket="archive")
    o = tiered.options()
    store = StoreOptions(
        "archive", endpoint=o["endpoint"], access_key=o["accessKey"], secret_key=o["secretKey"]
    )
    the_job = job(tiered, "s3://archive/kafka", output_store=store)
    summary = run_export(the_job, say=quiet)
    assert summary.segments == 6
    seg = tiered.segments("orders", 1)[0]
    body = client.get_object(Bucket="archive", Key="kafka/" + segment_file(seg))["Body"].read()
    assert file_rows(pq.read_table(pa.BufferReader(body))) == seg.rows
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="archive")["Contents"]]
    assert sum(k.startswith("kafka/" + STATE_DIR) for k in keys) == 6
    assert run_export(the_job, say=quiet).skipped == 6


def test_a_segment_gone_after_planning_is_a_clear_error(tiered: Tiered, tmp_path: Path) -> None:
    writer = PartitionWriter("vanish", 0)
    writer.batch([(BASE_TS, b"k", b"v", ())])
    writer.roll()
    keys = upload_aiven(tiered.proxy.client(), tiered.bucket, tiered.prefix, writer.segments, kafka_uuid())
    the_job = job(tiered, str(tmp_path), topics="vanish")
    tasks, _ = plan_export(the_job, Bucket(the_job.source.store), open_output(str(tmp_path)))
    tiered.proxy.client().delete_object(Bucket=tiered.bucket, Key=keys[0])
    with pytest.raises(NoSuchKey, match=keys[0]):
        export_segment(the_job, tasks[0])
    assert not list(tmp_path.rglob("*.parquet")) and not list(tmp_path.rglob("*.tmp"))


def test_bad_flags_are_config_errors() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cli.register(sub)
    base = ["export", "--bucket", "b", "--topics", "t", "--output", "/tmp/x"]
    with pytest.raises(ConfigError, match="layout"):
        cli.job_from_args(parser.parse_args([*base, "--layout", "flat"]))
    with pytest.raises(ConfigError, match="output-access-key"):
        cli.job_from_args(parser.parse_args([*base[:-1], "s3://o/p", "--output-access-key", "a"]))
    with pytest.raises(ConfigError, match="filesystem path or s3"):
        cli.job_from_args(parser.parse_args([*base[:-1], "gs://o/p"])).open_output()
    with pytest.raises(SystemExit):
        parser.parse_args(["export", "--bucket", "b", "--output", "/tmp/x"])  # no topics


def _args(tiered: Tiered, output: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    o = tiered.options()
    return parser.parse_args([
        "export", "--endpoint", o["endpoint"], "--bucket", o["bucket"], "--prefix", o["prefix"],
        "--topics", "orders", "--access-key", o["accessKey"], "--secret-key", o["secretKey"],
        "--output", str(output),
        "--progress-seconds", "0.2", *extra,
    ])  # fmt: skip


@pytest.mark.spark
def test_spark_export_matches_the_single_process_export(
    spark: Any, tiered: Tiered, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_export(job(tiered, str(tmp_path / "local")), say=quiet)
    args = _args(tiered, tmp_path / "spark", "--json", str(tmp_path / "summary.json"))
    assert cli.run_command(args, spark) == 0
    assert digests(tmp_path / "spark") == digests(tmp_path / "local")
    out, err = capsys.readouterr()
    assert "export summary" in out and "6/6 segments done" in err
    assert json.loads((tmp_path / "summary.json").read_text())["segments"] == 6
    # Spark reads the archive back with topic and partition from the directory names.
    df = spark.read.parquet(str(tmp_path / "spark"))
    assert df.count() == sum(len(s.rows) for p in (0, 1) for s in tiered.segments("orders", p))
    assert {r["topic"] for r in df.select("topic").distinct().collect()} == {"orders"}


@pytest.mark.spark
def test_spark_export_failure_is_one_line(
    spark: Any, tiered: Tiered, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _args(tiered, tmp_path / "out")
    args.secret_key = "wrong"
    assert cli.run_command(args, spark) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("tsproxy export: failed: AccessDenied: ")
    assert "check --access-key/--secret-key" in err


def test_spark_submit_entry_rejects_bad_flags_before_starting_spark(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.submit_main(["--bucket", "b", "--topics", "t", "--output", "/tmp/x", "--layout", "flat"]) == 2
    assert "'layout' must be one of" in capsys.readouterr().err


def test_small_segments_share_spark_tasks_and_big_ones_stay_alone() -> None:
    from tsproxy.spark.export import SegmentTask, pack_tasks

    mib = 1 << 20
    sizes = [300 * mib, 40 * mib, 20 * mib, *([1 * mib] * 200)]
    tasks = [SegmentTask(f"k{n}", "t", 0, n, size) for n, size in enumerate(sizes)]
    groups = pack_tasks(tasks, parallelism=2)
    assert [t for g in groups for t in g] == tasks  # every segment once, order kept
    assert groups[0] == [tasks[0]]  # larger than a group's share (560 MiB / 8): alone
    sizes_of = [sum(t.size for t in g) for g in groups]
    assert all(70 * mib <= size < 71 * mib for size in sizes_of[1:-1])  # the small ones share tasks
    assert len(groups) == 5 and sizes_of[-1] <= 70 * mib
    assert pack_tasks(tasks[3:5], parallelism=8) == [tasks[3:5]]
