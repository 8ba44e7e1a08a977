"""Two tsproxy replicas over one backend: a reader whose manifest went stale gets the new version,
never a mix of versions and never an error it did not deserve."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.server.conftest import start_proxy


def test_overwrite_by_another_replica_is_read_whole(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    settings = {"metadata_ttl": "60s", "prefetch": "0", "chunk_size": "64KiB"}
    (tmp_path / "a").mkdir()
    a = start_proxy("seaweed", tmp_path / "a", request, **settings)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "ring.json").write_bytes((tmp_path / "a" / "ring.json").read_bytes())
    (tmp_path / "b" / "ring.json").chmod(0o600)  # a key ring others may read is refused
    b = start_proxy("seaweed", tmp_path / "b", request, **settings)
    try:
        s3a, s3b = a.client(), b.client()
        s3a.create_bucket(Bucket="replicas")
        old, new = os.urandom(1 << 20), os.urandom(1 << 20)
        s3a.put_object(Bucket="replicas", Key="seg", Body=old)
        assert s3a.get_object(Bucket="replicas", Key="seg", Range="bytes=0-99")["Body"].read() == old[:100]
        s3b.put_object(Bucket="replicas", Key="seg", Body=new)  # replica A still trusts its manifest
        tail = s3a.get_object(Bucket="replicas", Key="seg", Range="bytes=-100")["Body"].read()
        assert tail == new[-100:]
        assert s3a.get_object(Bucket="replicas", Key="seg")["Body"].read() == new
    finally:
        a.stop()
        b.stop()
