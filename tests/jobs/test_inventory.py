"""inventory: figures equal sums computed here from what was written and what the backend lists;
orphans and stale uploads found; orphan deletion is a dry run unless applied."""

from __future__ import annotations

import base64
import os
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.jobs.jobhelpers import records, weed_options
from tests.server.conftest import start_proxy
from tests.support.seaweed import SeaweedFS
from tsproxy import cli
from tsproxy.jobs import inventory
from tsproxy.kafka.layout import aiven_segment_key

pytestmark = pytest.mark.spark


def _kafka_uuid() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _backend_sizes(s3: Any, bucket: str) -> dict[str, int]:
    sizes = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        sizes.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
    return sizes


def test_inventory_figures_orphans_and_cleanup(
    spark: Any,
    tmp_path: Path,
    ring_path: Path,
    seaweed: SeaweedFS,
    seaweed_bucket: str,
    request: pytest.FixtureRequest,
) -> None:
    bucket = seaweed_bucket
    s3 = seaweed.boto3_client()
    ids = {"orders": _kafka_uuid(), "clicks": _kafka_uuid(), "gone": _kafka_uuid()}
    # (topic, partition, base offset, written while this KEK was active, or None: straight to the backend)
    plan: list[tuple[str, int, int, str | None]] = [("orders", 0, o, "kek-a") for o in (0, 500, 1000)]
    plan += [("orders", 1, o, "kek-b") for o in (0, 700)]
    plan += [("clicks", 0, 0, "kek-a"), ("clicks", 0, 300, "kek-b"), ("clicks", 3, 40, None)]
    plan += [("gone", 0, o, "kek-a") for o in (0, 90)]
    written: dict[str, tuple[bytes, str | None, tuple[str, int, int]]] = {}
    for n, (topic, partition, offset, kek) in enumerate(plan):
        segment_id = _kafka_uuid()
        for suffix, data in (
            ("log", records(40_000 + 3000 * n, n)),
            ("indexes", os.urandom(800)),
            ("rsm-manifest", b'{"version":"1.0"}'),
        ):
            key = aiven_segment_key("", topic, ids[topic], partition, offset, segment_id, suffix)
            written[key] = (data, kek, (topic, partition, offset))
    written["notes/readme.txt"] = (b"not kafka", "kek-b", ("", -1, -1))

    def put_all(kek: str) -> None:
        proxy = start_proxy("seaweed", tmp_path, request, chunk_size="64KiB")
        try:
            client = proxy.client()
            for key, (data, k, _) in written.items():
                if k == kek:
                    client.put_object(Bucket=bucket, Key=key, Body=data)
            if kek == "kek-b":
                client.create_multipart_upload(Bucket=bucket, Key="orders-unfinished")
        finally:
            proxy.stop()

    put_all("kek-a")
    assert cli.main(["keys", "add", "--key-ring", str(ring_path), "--id", "kek-b", "--activate"]) == 0
    put_all("kek-b")
    for key, (data, kek, _) in written.items():
        if kek is None:
            s3.put_object(Bucket=bucket, Key=key, Body=data)

    options = weed_options(seaweed, bucket, ring_path, stale_after=0.0)
    live = frozenset({ids["orders"], "clicks"})
    report = inventory(spark, options, output=str(tmp_path / "inv"), live_topics=live, delete_orphans=True)
    out = tmp_path / "inv"

    # Independent figures: original bytes from what was written, stored bytes from the backend's listing.
    stored = _backend_sizes(s3, bucket)
    expect: dict[tuple[str, int], dict[str, Any]] = defaultdict(
        lambda: {"objects": 0, "segments": 0, "original": 0, "stored": 0, "keks": set(), "offsets": []}
    )
    for key, (data, kek, (topic, partition, offset)) in written.items():
        if not topic:
            continue
        e = expect[(topic, partition)]
        e["objects"] += 1
        e["original"] += len(data)
        e["stored"] += stored[key]
        if kek:
            e["keks"].add(kek)
        if key.endswith(".log"):
            e["segments"] += 1
            e["offsets"].append(offset)
    table = pq.read_table(out / "partitions.parquet").to_pylist()
    got = {
        (r["topic"], r["partition"]): {
            "objects": r["objects"],
            "segments": r["segments"],
            "original": r["original_bytes"],
            "stored": r["stored_bytes"],
            "keks": set(r["kek_ids"]),
            "offsets": [r["oldest_offset"], r["newest_offset"]],
        }
        for r in table
    }
    want = {k: {**e, "offsets": [min(e["offsets"]), max(e["offsets"])]} for k, e in expect.items()}
    assert got == want
    assert all(r["topic_id"] == ids[r["topic"]] for r in table)
    assert {(r["topic"], r["orphan"]) for r in table} == {
        ("orders", False),
        ("clicks", False),
        ("gone", True),
    }

    client_objects = {k for k in stored if not k.startswith(".tsproxy/")}
    total = report.summary.total
    assert total.objects == len(written) == len(client_objects)
    assert total.original_bytes == sum(len(d) for d, _, _ in written.values())
    assert total.stored_bytes == sum(stored[k] for k in client_objects)
    keks = {r["kek_id"]: r["objects"] for r in pq.read_table(out / "keks.parquet").to_pylist()}
    per_kek: dict[str, int] = defaultdict(int)
    for _, kek, _ in written.values():
        per_kek[kek or "(none)"] += 1
    assert keks == per_kek
    prefixes = {r["prefix"]: r["objects"] for r in pq.read_table(out / "prefixes.parquet").to_pylist()}
    assert prefixes == {f"{t}-{ids[t]}/": sum(1 for k in written if k.startswith(f"{t}-")) for t in ids} | {
        "notes/": 1
    }
    assert report.summary.statuses == {"ok": len(written)}

    orphan_keys = {k for k, (_, _, (topic, _, _)) in written.items() if topic == "gone"}
    upload_keys = {k for k in stored if k.startswith(".tsproxy/mpu/")}
    assert report.summary.orphans.objects == len(orphan_keys) == 6
    assert len(report.stale_uploads) == 1 and upload_keys
    html = (out / "report.html").read_text()
    assert "<svg" in html and "orders" in html and "kek-b" in html

    # The cleanup was a dry run: it names exactly the orphans and the upload's objects, deletes nothing.
    assert report.cleanup is not None and not report.cleanup.applied
    assert set(report.cleanup.keys) == orphan_keys | upload_keys
    assert _backend_sizes(s3, bucket) == stored

    applied = inventory(
        spark, options, output=str(tmp_path / "inv2"), live_topics=live, delete_orphans=True, apply=True
    )
    assert applied.cleanup is not None and applied.cleanup.applied and not applied.cleanup.failures
    assert set(_backend_sizes(s3, bucket)) == set(stored) - orphan_keys - upload_keys

    # A live-topic list that matches nothing would delete every Kafka object: refused.
    with pytest.raises(Exception, match=r"all \d+ Kafka objects would be deleted"):
        inventory(
            spark,
            options,
            output=str(tmp_path / "inv3"),
            live_topics=frozenset({"typo"}),
            delete_orphans=True,
        )
