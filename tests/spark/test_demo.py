"""`tsproxy demo` as docs/PIPELINE.md has a new user run it: a tsproxy with its development defaults,
the demo's segments written through it, then the two commands the demo prints, run as printed through
the installed entry point with a user's environment (no AWS_*, no PYSPARK_* variables)."""

from __future__ import annotations

import json
import random
import shlex
from pathlib import Path

import boto3
import pytest

from tests.support.as_user import run_tsproxy, serving_as_user
from tsproxy.config import DEV_ACCESS_KEY, DEV_SECRET_KEY
from tsproxy.kafka.builder import build_indexes_object
from tsproxy.kafka.layout import group_segments
from tsproxy.kafka.manifest import parse_rsm_manifest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PARTITIONS, SEGMENTS, RECORDS = 2, 3, 1500


def _printed_commands(stdout: str) -> list[list[str]]:
    lines = stdout.splitlines()
    start = lines.index("read them back:")
    return [shlex.split(line) for line in lines[start + 1 :] if line.startswith("  tsproxy ")]


def test_demo_then_export_and_verify_as_printed(tmp_path: Path) -> None:
    with serving_as_user(tmp_path) as (_, port, _metrics):
        endpoint = f"http://127.0.0.1:{port}"
        sizes = ["--partitions", str(PARTITIONS), "--segments", str(SEGMENTS), "--records", str(RECORDS)]
        demo = run_tsproxy(["demo", "--endpoint", endpoint, *sizes], tmp_path, timeout=300)
        assert demo.returncode == 0, demo.stderr
        assert f"wrote {PARTITIONS * SEGMENTS} segments of topic orders" in demo.stdout
        export, verify = _printed_commands(demo.stdout)
        assert export[:2] == ["tsproxy", "export"] and verify[:3] == ["tsproxy", "jobs", "verify"]

        # What a broker's plugin would have left: three objects per segment, manifests that parse.
        s3 = boto3.client(
            "s3", endpoint_url=endpoint, region_name="us-east-1",
            aws_access_key_id=DEV_ACCESS_KEY, aws_secret_access_key=DEV_SECRET_KEY,
        )  # fmt: skip
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="demo-tiered")["Contents"]]
        segments = group_segments(keys)
        assert len(segments) == PARTITIONS * SEGMENTS
        assert all(s.manifest_key and s.indexes_key for s in segments)

        exported = run_tsproxy(export[1:], tmp_path)
        assert exported.returncode == 0, exported.stderr[-3000:]
        assert f"records                {PARTITIONS * SEGMENTS * RECORDS:,}" in exported.stdout
        files = sorted((tmp_path / "demo-export").rglob("*.parquet"))
        assert len(files) == PARTITIONS * SEGMENTS
        assert files[0].name == "orders+0+00000000000000000000.parquet"

        verified = run_tsproxy([*verify[1:]], tmp_path)
        assert verified.returncode == 0, verified.stderr[-3000:]
        summary = json.loads((tmp_path / "demo-verify" / "summary.json").read_text())
        assert summary["ok"] is True and summary["counts"] == {"ok": 3 * PARTITIONS * SEGMENTS}

        # A wrong key: one line, naming the flags the command takes.
        wrong = [*export[1:-1], "wrong-secret", "--output", "other"]
        failed = run_tsproxy(wrong, tmp_path)
        assert failed.returncode == 1
        last = failed.stderr.strip().splitlines()[-1]
        assert last.startswith("tsproxy export: failed: AccessDenied: ")
        assert "--access-key/--secret-key" in last


def test_the_demo_objects_are_what_the_reader_expects() -> None:
    """The manifest names the index ranges of the .indexes object it sits beside (no Spark, no server)."""
    from tsproxy.demo import build_segments, kafka_uuid

    (segment,) = build_segments("orders", kafka_uuid(random.Random(1)), 1, 1, 120, 7, 1_767_225_600_000)
    manifest = parse_rsm_manifest(segment.objects["rsm-manifest"])
    assert manifest.segment_size == len(segment.objects["log"])
    assert (manifest.start_offset, manifest.end_offset) == (0, 119)
    _, ranges = build_indexes_object(b"", b"")
    assert set(manifest.segment_indexes or {}) == set(ranges)
