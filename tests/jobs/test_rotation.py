"""Key rotation end to end: objects written through a real tsproxy under KEK A, B added and made
active, the rewrap job run, A removed from the ring, everything read back through tsproxy again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.jobs.jobhelpers import records, weed_options
from tests.server.conftest import start_proxy
from tsproxy import cli
from tsproxy.config import Config
from tsproxy.format import KeyRing
from tsproxy.jobs import JobOptions, rewrap, verify

MIB = 1 << 20
pytestmark = pytest.mark.spark


def _write(client: Any, bucket: str) -> dict[str, bytes]:
    """Objects of every shape: empty, small, compressible, above the part minimum, multipart."""
    objects = {
        "empty": b"",
        "small/records": records(3000, 1),
        "small/random": os.urandom(70_000),
        "big/random": os.urandom(6 * MIB),
        "big/records": records(3 * MIB, 2),
    }
    for key, data in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=data)
    parts = [os.urandom(5 * MIB), os.urandom(5 * MIB), records(MIB, 3)]
    upload = client.create_multipart_upload(Bucket=bucket, Key="multi")["UploadId"]
    done = []
    for no, part in enumerate(parts, 1):
        etag = client.upload_part(Bucket=bucket, Key="multi", UploadId=upload, PartNumber=no, Body=part)[
            "ETag"
        ]
        done.append({"PartNumber": no, "ETag": etag})
    client.complete_multipart_upload(
        Bucket=bucket, Key="multi", UploadId=upload, MultipartUpload={"Parts": done}
    )
    objects["multi"] = b"".join(parts)
    return objects


@pytest.mark.parametrize("kind", ["local", "seaweed"])
def test_rotate_rewrap_remove_and_read_everything(
    kind: str, spark: Any, tmp_path: Path, ring_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "seaweed":
        weed = request.getfixturevalue("seaweed")
        bucket = request.getfixturevalue("seaweed_bucket")
        options = weed_options(weed, bucket, ring_path)
    else:
        bucket = "rotation"
        settings = Config(backend=f"file://{tmp_path / 'data'}", key_ring=ring_path)
        options = JobOptions.from_config(settings, bucket)
    proxy = start_proxy(kind, tmp_path, request, chunk_size="1MiB")
    try:
        client = proxy.client()
        if kind == "local":
            client.create_bucket(Bucket=bucket)
        objects = _write(client, bucket)
        etags = {key: client.head_object(Bucket=bucket, Key=key)["ETag"] for key in objects}
    finally:
        proxy.stop()

    assert cli.main(["keys", "add", "--key-ring", str(ring_path), "--id", "kek-b", "--activate"]) == 0

    # Control: a ring without A cannot read the objects yet, so the final reads below prove the rewrap.
    without_a = tmp_path / "ring-without-a.json"
    shutil.copy(ring_path, without_a)
    ring = KeyRing.load(without_a)
    ring.remove("kek-a")
    ring.save(without_a)
    before = verify(spark, options.replace(key_ring=without_a), output=str(tmp_path / "verify-before"))
    assert before.tally.counts == {"missing-key": len(objects)}

    first = rewrap(spark, options, output=str(tmp_path / "rewrap-1"))
    assert first.summary.tally.counts == {"rewrapped": len(objects)}, first.text()
    assert first.ok and first.remaining == {} and first.summary.keks == {"kek-b": len(objects)}
    # Only objects below the 5 MiB part minimum travel whole; the big ones are copied server-side
    # and only their tails are uploaded.
    small = sum(len(d) for d in objects.values() if len(d) < 5 * MIB)
    assert first.run.stats.operations.get("UploadPartCopy", 0) == 2  # big/random and multi
    assert first.run.stats.bytes_out <= small + len(objects) * (64 << 10)

    second = rewrap(spark, options, output=str(tmp_path / "rewrap-2"))
    assert second.summary.tally.counts == {"current": len(objects)}
    assert second.run.stats.bytes_out == 0

    assert cli.main(["keys", "remove", "--key-ring", str(ring_path), "kek-a", "--yes"]) == 0
    assert KeyRing.load(ring_path).ids() == ["kek-b"]

    after = verify(spark, options, output=str(tmp_path / "verify-after"))
    assert after.ok and after.tally.counts == {"ok": len(objects)}, after.text()

    proxy = start_proxy(kind, tmp_path, request, chunk_size="1MiB", cache_dir=str(tmp_path / "fresh-cache"))
    try:
        client = proxy.client()
        for key, data in objects.items():
            got = client.get_object(Bucket=bucket, Key=key)
            assert got["Body"].read() == data, key
            assert got["ETag"] == etags[key], key
        ranged = client.get_object(Bucket=bucket, Key="multi", Range="bytes=5242000-5243000")["Body"].read()
        assert ranged == objects["multi"][5242000:5243001]
    finally:
        proxy.stop()
