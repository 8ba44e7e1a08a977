"""Reading what the S3 sink wrote and what `tsproxy export` wrote, as records to compare.

The sink writes JSON lines (deploy/kafka/s3-sink.properties): one object per record with `key`,
`value` (base64, null kept apart from empty), `offset`, `timestamp` (ISO-8601, milliseconds, UTC) and
`headers` (a list of {key, value}, values base64 or null). Topic and partition are in the file's name:
`topic=<t>/partition=<p>/<t>+<p>+<20-digit first offset>.jsonl[.gz]`.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.broker.records import Rec
from tests.broker.stack import ACCESS_KEY, REGION, SECRET_KEY

ROOT = Path(__file__).resolve().parents[2]
SINK_NAME = re.compile(r"^topic=([^/]+)/partition=(\d+)/([^/+]+)\+(\d+)\+(\d{20})\.jsonl(\.gz)?$")
EXPORT_NAME = re.compile(r"^topic=([^/]+)/partition=(\d+)/([^/+]+)\+(\d+)\+(\d{20})\.parquet$")


@dataclass(frozen=True)
class SinkFile:
    key: str
    topic: str
    partition: int
    first_offset: int
    gzip: bool
    records: tuple[Rec, ...]


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _millis(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000 + 0.5)


def parse_sink_file(key: str, body: bytes) -> SinkFile:
    match = SINK_NAME.match(key)
    assert match, f"the sink wrote {key!r}, not a name of deploy/kafka/s3-sink.properties' template"
    topic, partition, name_topic, name_partition, first, gz = match.groups()
    assert (name_topic, name_partition) == (topic, partition), key
    assert body.startswith(b"\x1f\x8b") == bool(gz), f"{key}: gzip content and name disagree"
    text = gzip.decompress(body) if gz else body
    records = []
    for line in text.decode().splitlines():
        doc = json.loads(line)
        headers = tuple((h["key"], _bytes(h["value"])) for h in doc["headers"])
        records.append(
            Rec(doc["offset"], _millis(doc["timestamp"]), _bytes(doc["key"]), _bytes(doc["value"]), headers)
        )
    assert records and records[0].offset == int(first), f"{key} starts at offset {records[0].offset}"
    return SinkFile(key, topic, int(partition), int(first), bool(gz), tuple(records))


def read_sink_files(client: Any, bucket: str, prefix: str = "") -> dict[str, SinkFile]:
    """Every file under `prefix` in `bucket`, read whole through `client` (a tsproxy's)."""
    out = {}
    for key in list_keys(client, bucket, prefix):
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        out[key] = parse_sink_file(key, body)
    return out


def list_keys(client: Any, bucket: str, prefix: str = "") -> dict[str, int]:
    out: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            out[obj["Key"]] = obj["Size"]
    return out


def by_partition(files: Iterable[SinkFile]) -> dict[tuple[str, int], list[Rec]]:
    """Every record of the files per topic partition, in offset order, duplicates kept."""
    out: dict[tuple[str, int], list[Rec]] = {}
    for f in sorted(files, key=lambda f: (f.topic, f.partition, f.first_offset)):
        out.setdefault((f.topic, f.partition), []).extend(f.records)
    return {k: sorted(v, key=lambda r: r.offset) for k, v in out.items()}


def run_export(
    endpoint: str, bucket: str, topics: Iterable[str], output: Path, isolation: str, summary: Path
) -> subprocess.CompletedProcess[str]:
    """`tsproxy export` on Spark local[2] from the tiered segments in `bucket`, through `endpoint`."""
    argv = [
        sys.executable, "-m", "tsproxy.cli", "export", "--master", "local[2]",
        "--endpoint", endpoint, "--bucket", bucket, "--topics", ",".join(sorted(topics)),
        "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY, "--region", REGION,
        "--isolation-level", isolation, "--output", str(output), "--json", str(summary),
        "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.host=127.0.0.1",
        "--conf", "spark.driver.bindAddress=127.0.0.1",
    ]  # fmt: skip
    output.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable}
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    return subprocess.run(argv, env=env, cwd=output.parent, capture_output=True, text=True, timeout=900)


def read_export(output: Path) -> dict[str, list[Rec]]:
    """The export's Parquet files (hidden and marker files left out), each as its records."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out: dict[str, list[Rec]] = {}
    for path in sorted(output.rglob("*.parquet")):
        name = path.relative_to(output).as_posix()
        if name.startswith("_") or path.name.startswith("."):
            continue
        table = pq.read_table(path)
        table = table.set_column(
            table.schema.get_field_index("timestamp"), "timestamp", table.column("timestamp").cast(pa.int64())
        )
        rows = []
        for r in table.to_pylist():
            headers = tuple((h["key"], h["value"]) for h in r["headers"] or ())
            rows.append(Rec(r["offset"], r["timestamp"], r["key"], r["value"], headers))
        out[name] = rows
    return out
