"""migrate: objects written straight to SeaweedFS become tsproxy objects in place, keeping every byte
and every ETag, content type and metadata clients saw; a dry run changes nothing."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.jobs.jobhelpers import records, weed_options
from tests.server.conftest import start_proxy
from tests.support.seaweed import SeaweedFS
from tsproxy.format.manifest import META_FORMAT
from tsproxy.jobs import migrate, verify

MIB = 1 << 20
pytestmark = pytest.mark.spark


def _seen(client: Any, bucket: str, keys: list[str]) -> dict[str, tuple[bytes, str, str, dict[str, str]]]:
    """What a client of tsproxy sees of each object: bytes, ETag, content type, metadata."""
    out = {}
    for key in keys:
        got = client.get_object(Bucket=bucket, Key=key)
        out[key] = (got["Body"].read(), got["ETag"], got["ContentType"], got["Metadata"])
    return out


def _listing(client: Any, bucket: str) -> dict[str, tuple[int, str]]:
    return {
        o["Key"]: (o["Size"], o["ETag"]) for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])
    }


def test_migrate_keeps_bytes_etags_and_metadata(
    spark: Any,
    tmp_path: Path,
    ring_path: Path,
    seaweed: SeaweedFS,
    seaweed_bucket: str,
    request: pytest.FixtureRequest,
) -> None:
    bucket = seaweed_bucket
    s3 = seaweed.boto3_client()
    s3.put_object(
        Bucket=bucket,
        Key="m/small.json",
        Body=records(5000, 1),
        ContentType="application/json",
        Metadata={"owner": "team-a", "note": "50%41 off"},
    )
    s3.put_object(Bucket=bucket, Key="m/empty", Body=b"")
    s3.put_object(Bucket=bucket, Key="m/big", Body=os.urandom(3 * MIB))
    parts = [os.urandom(5 * MIB), records(5 * MIB, 2), b"tail" * 300]
    upload = s3.create_multipart_upload(Bucket=bucket, Key="m/multi", ContentType="application/octet-stream")
    done = [
        {
            "PartNumber": n,
            "ETag": s3.upload_part(
                Bucket=bucket, Key="m/multi", UploadId=upload["UploadId"], PartNumber=n, Body=p
            )["ETag"],
        }
        for n, p in enumerate(parts, 1)
    ]
    s3.complete_multipart_upload(
        Bucket=bucket, Key="m/multi", UploadId=upload["UploadId"], MultipartUpload={"Parts": done}
    )
    foreign = ["m/small.json", "m/empty", "m/big", "m/multi"]
    assert s3.head_object(Bucket=bucket, Key="m/multi")["ETag"].endswith('-3"')

    proxy = start_proxy("seaweed", tmp_path, request, chunk_size="1MiB")
    try:
        client = proxy.client()
        client.put_object(Bucket=bucket, Key="m/native", Body=records(20_000, 3))
        keys = [*foreign, "m/native"]
        before = _seen(client, bucket, keys)
        listed_before = _listing(client, bucket)
    finally:
        proxy.stop()
    backend_before = {k: s3.head_object(Bucket=bucket, Key=k)["ETag"] for k in keys}

    options = weed_options(seaweed, bucket, ring_path, settings={"chunk_size": 1 << 20}, concurrency=2)
    dry = migrate(spark, options, output=str(tmp_path / "dry"))
    assert dry.tally.counts == {"would-migrate": 4, "already": 1}
    assert {k: s3.head_object(Bucket=bucket, Key=k)["ETag"] for k in keys} == backend_before

    # Readers through tsproxy during the migration see the old object or the new one: the same bytes.
    proxy = start_proxy(
        "seaweed", tmp_path, request, chunk_size="1MiB", cache_dir=str(tmp_path / "cache-during")
    )
    stop = threading.Event()
    reads: list[str] = []

    def reader() -> None:
        client = proxy.client()
        while not stop.is_set():
            for key in ("m/big", "m/multi"):
                try:
                    got = client.get_object(Bucket=bucket, Key=key)
                    same = got["Body"].read() == before[key][0] and got["ETag"] == before[key][1]
                    reads.append("same" if same else "DIFFERENT")
                except ClientError as e:
                    reads.append(e.response["Error"]["Code"])
                except Exception:  # a swap in the middle of a body cuts the connection: never other bytes
                    reads.append("cut")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        applied = migrate(spark, options, output=str(tmp_path / "apply"), apply=True)
    finally:
        stop.set()
        thread.join()
        proxy.stop()
    assert applied.ok and applied.tally.counts == {"migrated": 4, "already": 1}, applied.text()
    assert "same" in reads and "DIFFERENT" not in reads
    # A GET that resolved the old version and finds it replaced before sending anything serves the new
    # one; only a swap in the middle of a body cuts that response short. Never other bytes.
    assert set(reads) <= {"same", "cut"}

    for key in foreign:
        head = s3.head_object(Bucket=bucket, Key=key)
        assert META_FORMAT in head["Metadata"], key
        assert head["ETag"] != backend_before[key]
    proxy = start_proxy(
        "seaweed", tmp_path, request, chunk_size="1MiB", cache_dir=str(tmp_path / "cache-after")
    )
    try:
        client = proxy.client()
        assert _seen(client, bucket, keys) == before
        assert _listing(client, bucket) == listed_before
        tail = client.get_object(Bucket=bucket, Key="m/multi", Range="bytes=-1000")["Body"].read()
        assert tail == before["m/multi"][0][-1000:]
    finally:
        proxy.stop()

    again = migrate(spark, options, output=str(tmp_path / "again"), apply=True)
    assert again.tally.counts == {"already": 5}
    checked = verify(spark, options, output=str(tmp_path / "verify"))
    assert checked.ok and checked.tally.counts == {"ok": 5}
