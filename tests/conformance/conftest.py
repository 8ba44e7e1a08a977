"""The conformance run: every case in cases.py against tsproxy over SeaweedFS, and against SeaweedFS alone
for comparison. The pass count of each run is printed in pytest's terminal summary."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config as BotoConfig

from tests.conformance.cases import RESULTS, TARGETS, Target
from tests.server.harness import ACCESS_KEY, SECRET_KEY, RunningProxy
from tests.support.seaweed import SeaweedFS
from tsproxy.format import KeyRing


def _client(endpoint: str, access_key: str, secret_key: str, region: str) -> Any:
    # One client configuration for both runs: boto3's defaults (flexible checksums on), path style.
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=region,
        config=BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


@pytest.fixture(scope="module")
def tsproxy_over_seaweed(
    seaweed: SeaweedFS, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    tmp: Path = tmp_path_factory.mktemp("conformance")
    KeyRing.new().save(tmp / "ring.json")
    running = RunningProxy(
        {
            "backend": seaweed.endpoint,
            "backend_access_key": seaweed.access_key,
            "backend_secret_key": seaweed.secret_key,
            "key_ring": str(tmp / "ring.json"),
            "cache_dir": str(tmp / "cache"),
            "chunk_size": "256KiB",
            "cache_size": "64MiB",
            "metadata_ttl": "0s",
        }
    )
    yield running
    running.stop()


@pytest.fixture(params=list(TARGETS))
def target(request: pytest.FixtureRequest, seaweed: SeaweedFS) -> Iterator[Target]:
    if request.param == "tsproxy":
        running: RunningProxy = request.getfixturevalue("tsproxy_over_seaweed")
        endpoint, access, secret, region = running.endpoint, ACCESS_KEY, SECRET_KEY, "us-east-1"
    else:
        endpoint, access, secret, region = (
            seaweed.endpoint,
            seaweed.access_key,
            seaweed.secret_key,
            seaweed.region,
        )
    client = _client(endpoint, access, secret, region)
    bucket = f"conf-{uuid.uuid4().hex[:16]}"
    client.create_bucket(Bucket=bucket)
    yield Target(client, endpoint, access, secret, region, bucket)
    _remove_bucket(client, bucket)


def _remove_bucket(client: Any, bucket: str) -> None:
    try:
        for upload in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
            client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
        client.delete_bucket(Bucket=bucket)
    except Exception:  # a failed cleanup is no conformance result; the bucket names are unique
        pass


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not RESULTS:
        return
    terminalreporter.section("S3 conformance")
    for name, label in TARGETS.items():
        results = RESULTS.get(name)
        if not results:
            continue
        passed = sum(results.values())
        line = f"{label}: {passed}/{len(results)} cases passed"
        failed = sorted(case for case, ok in results.items() if not ok)
        if failed:
            line += " (failed: " + ", ".join(failed) + ")"
        terminalreporter.write_line(line)
