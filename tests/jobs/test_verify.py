"""verify finds each kind of planted damage, by name, and nothing in clean data."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from tests.jobs.jobhelpers import records, weed_options
from tests.server.conftest import start_proxy
from tests.support.seaweed import SeaweedFS
from tsproxy.format import KeyRing, TransformSettings, encode_object
from tsproxy.format.manifest import META_FORMAT, META_SIZE
from tsproxy.jobs import cli as jobs_cli
from tsproxy.jobs import verify
from tsproxy.service.uploads.ids import upload_name

MIB = 1 << 20
pytestmark = pytest.mark.spark


def _rows(out: Path) -> dict[str, dict[str, Any]]:
    return {r["key"]: r for r in ds.dataset(out / "objects", format="parquet").to_table().to_pylist()}


def _rewrite(s3: Any, bucket: str, key: str, change: Any) -> None:
    """Replace a stored object's bytes in the backend, keeping its metadata (damage tsproxy did not do)."""
    got = s3.get_object(Bucket=bucket, Key=key)
    body = change(bytearray(got["Body"].read()))
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(body), Metadata=got["Metadata"])


def _flip(data: bytearray) -> bytearray:
    data[1000] ^= 0x10
    return data


def _cut_middle(data: bytearray) -> bytearray:
    del data[2000:2100]
    return data


def test_verify_finds_planted_damage_and_passes_clean_data(
    spark: Any,
    tmp_path: Path,
    ring_path: Path,
    seaweed: SeaweedFS,
    seaweed_bucket: str,
    request: pytest.FixtureRequest,
) -> None:
    bucket = seaweed_bucket
    options = weed_options(seaweed, bucket, ring_path)
    s3 = seaweed.boto3_client()
    proxy = start_proxy("seaweed", tmp_path, request, chunk_size="256KiB")
    try:
        client = proxy.client()
        for key, data in {
            "clean/records": records(900_000, 1),
            "clean/random": os.urandom(MIB),
            "clean/empty": b"",
            "victim/flip": records(600_000, 2),
            "victim/cut-end": records(600_000, 3),
            "victim/cut-middle": records(600_000, 4),
            "victim/metadata": records(10_000, 5),
        }.items():
            client.put_object(Bucket=bucket, Key=key, Body=data)
        parts = [os.urandom(5 * MIB), records(300_000, 6)]
        upload = client.create_multipart_upload(Bucket=bucket, Key="clean/multi")["UploadId"]
        etags = [
            {
                "PartNumber": n,
                "ETag": client.upload_part(
                    Bucket=bucket, Key="clean/multi", UploadId=upload, PartNumber=n, Body=p
                )["ETag"],
            }
            for n, p in enumerate(parts, 1)
        ]
        client.complete_multipart_upload(
            Bucket=bucket, Key="clean/multi", UploadId=upload, MultipartUpload={"Parts": etags}
        )
    finally:
        proxy.stop()
    s3.put_object(Bucket=bucket, Key="clean/passthrough", Body=b"written without tsproxy")

    clean = verify(spark, options, output=str(tmp_path / "clean"))
    assert clean.ok, clean.text()
    assert clean.tally.counts == {"ok": 8, "passthrough": 1}
    assert clean.uploads == []

    # Plant one kind of damage per victim.
    _rewrite(s3, bucket, "victim/flip", _flip)
    _rewrite(s3, bucket, "victim/cut-end", lambda d: d[:-7])
    _rewrite(s3, bucket, "victim/cut-middle", _cut_middle)
    head = s3.head_object(Bucket=bucket, Key="victim/metadata")
    s3.copy_object(
        Bucket=bucket,
        Key="victim/metadata",
        CopySource={"Bucket": bucket, "Key": "victim/metadata"},
        Metadata={**head["Metadata"], META_SIZE: "12345"},
        MetadataDirective="REPLACE",
    )
    stranger = KeyRing.new(key_id="kek-elsewhere")
    s3.put_object(
        Bucket=bucket,
        Key="victim/other-key",
        Metadata={META_FORMAT: "1"},
        Body=encode_object(records(50_000, 7), TransformSettings(chunk_size=1 << 16), stranger),
    )
    proxy = start_proxy("seaweed", tmp_path, request, chunk_size="256KiB")
    try:
        left = proxy.client().create_multipart_upload(Bucket=bucket, Key="victim/unfinished")["UploadId"]
        proxy.client().upload_part(
            Bucket=bucket, Key="victim/unfinished", UploadId=left, PartNumber=1, Body=b"x" * 1000
        )
    finally:
        proxy.stop()
    raw = s3.create_multipart_upload(Bucket=bucket, Key="victim/raw-unfinished")["UploadId"]

    config = tmp_path / "jobs.toml"
    config.write_text(
        f'backend = "{seaweed.endpoint}"\nbackend_region = "{seaweed.region}"\n'
        f'backend_access_key = "{seaweed.access_key}"\nbackend_secret_key = "{seaweed.secret_key}"\n'
        f'key_ring = "{ring_path}"\n'
    )
    out = tmp_path / "damaged"
    argv = [
        "verify",
        "--config",
        str(config),
        "--bucket",
        bucket,
        "--output",
        str(out),
        "--stale-after",
        "0s",
    ]
    assert jobs_cli.main(argv) == 1

    rows = _rows(out)
    assert {k: r["status"] for k, r in rows.items() if k.startswith("victim/")} == {
        "victim/flip": "corrupt",
        "victim/cut-end": "truncated",
        "victim/cut-middle": "truncated",
        "victim/metadata": "corrupt",
        "victim/other-key": "missing-key",
    }
    assert "authentication failed" in rows["victim/flip"]["detail"]
    assert "kek-elsewhere" in rows["victim/other-key"]["detail"]
    assert {k: r["status"] for k, r in rows.items() if k.startswith("clean/")} == {
        "clean/records": "ok",
        "clean/random": "ok",
        "clean/empty": "ok",
        "clean/multi": "ok",
        "clean/passthrough": "passthrough",
    }
    assert rows["clean/passthrough"]["detail"] == "MD5 matches the ETag"
    assert rows["clean/multi"]["chunks"] == 20 + 2

    uploads = ds.dataset(out / "uploads.parquet").to_table().to_pylist()
    assert sorted((u["kind"], u["upload_id"], u["stale"]) for u in uploads) == [
        ("backend", raw, True),
        ("tsproxy", upload_name(left), True),  # its objects' directory: the id without its ticket
    ]

    # With the default age limit the upload just written is in progress, not stale.
    fresh = verify(spark, options, output=str(tmp_path / "again"))
    assert [u["stale"] for u in fresh.uploads] == [False, False]
    assert fresh.tally.problem_count == 5
