"""No key, however it is spelled, reaches tsproxy's own state; keys S3 keeps apart stay apart.

Against real backends (the local directory, SeaweedFS, and SeaweedFS with every client bucket mapped
into one backend bucket): a multipart upload is in progress, so its state (wrapped data key included)
sits in the reserved namespace. Hypothesis then drives every object operation with keys spelled to hit
that state or to fold onto each other. Afterwards the upload must still complete with its own bytes,
the bucket must still be listed, and every key must read back what was last written under exactly it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.conftest import start_proxy
from tests.server.harness import RunningProxy
from tsproxy.service.namespace import backend_name


@pytest.fixture(params=["local", "seaweed", "seaweed-mapped"], scope="module")
def running(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    tmp: Path = tmp_path_factory.mktemp(request.param)
    if request.param == "seaweed-mapped":
        weed = request.getfixturevalue("seaweed")
        shared = f"shared-{uuid.uuid4().hex[:8]}"
        weed.boto3_client().create_bucket(Bucket=shared)
        proxy = start_proxy("seaweed", tmp, request, backend_bucket=shared)
    else:
        proxy = start_proxy(request.param, tmp, request)
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def scene(running: RunningProxy) -> dict[str, str]:
    """A bucket with a multipart upload in progress: its state is what a hostile key would aim at."""
    s3 = running.client()
    bucket = f"ns-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=bucket)
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="segment.log")["UploadId"]
    return {"bucket": bucket, "upload_id": upload_id}


def _targets(upload_id: str, *, files_and_directories_collide: bool) -> list[str]:
    inner = [f".tsproxy/mpu/{upload_id}/state", ".tsproxy/bucket", ".tsproxy/catalog/x", ".tsproxy"]
    spellings = []
    for name in inner:
        spellings += [name, "/" + name, "//" + name, "./" + name, "a/../" + name, "%2F" + name, name + "/"]
        spellings += ["\\" + name, "\\/" + name, "a\\..\\" + name]  # SeaweedFS stores `\\` as `/`
    keys = [*spellings, "/a", "a", "a//b", "a/b", "/", "//", ".tsproxy~%2Fa", "report.csv", "/report.csv"]
    keys += ["\\report.csv", "a\\b", ".tsproxy~%5Ca"]
    if files_and_directories_collide:
        # SeaweedFS keeps keys as file paths: it cannot hold "x" beside "x/y", nor a key ending in "/"
        # beside its file. That is the backend's own limit, not the namespace's: leave those pairs out.
        keys = [k for k in keys if not backend_name(k).endswith("/")]
        names = [backend_name(k) for k in keys]
        keys = [
            k for k, name in zip(keys, names, strict=True) if not any(n.startswith(name + "/") for n in names)
        ]
    return keys


OPS = ["put", "get", "head", "delete", "delete_many", "copy_from", "copy_to", "multipart"]


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_spelling_reaches_internal_state(
    running: RunningProxy, scene: dict[str, str], data: st.DataObject
) -> None:
    s3 = running.client()
    bucket, upload_id = scene["bucket"], scene["upload_id"]
    targets = _targets(upload_id, files_and_directories_collide=not running.cfg.local_backend)
    written: dict[str, bytes] = {o["Key"]: b"" for o in _listing(running, bucket)}
    for k in list(written):
        written[k] = s3.get_object(Bucket=bucket, Key=k)["Body"].read()
    for _ in range(6):
        op = data.draw(st.sampled_from(OPS))
        key = data.draw(st.sampled_from(targets))
        other = data.draw(st.sampled_from(targets))
        body = os.urandom(data.draw(st.integers(0, 300)))
        if op == "put":
            s3.put_object(Bucket=bucket, Key=key, Body=body)
            written[key] = body
        elif op == "get":
            if key in written:
                assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == written[key]
            else:
                _expect_missing(s3.get_object, Bucket=bucket, Key=key)
        elif op == "head":
            if key in written:
                assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(written[key])
            else:
                _expect_missing(s3.head_object, Bucket=bucket, Key=key)
        elif op == "delete":
            s3.delete_object(Bucket=bucket, Key=key)
            written.pop(key, None)
        elif op == "delete_many":
            s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": key}, {"Key": other}]})
            written.pop(key, None)
            written.pop(other, None)
        elif op == "copy_from" and key in written and other != key:
            s3.copy_object(Bucket=bucket, Key=other, CopySource={"Bucket": bucket, "Key": key})
            written[other] = written[key]
        elif op == "copy_to" and other in written and other != key:
            s3.copy_object(Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": other})
            written[key] = written[other]
        elif op == "multipart":
            uid = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
            etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=1, Body=body)["ETag"]
            s3.complete_multipart_upload(
                Bucket=bucket,
                Key=key,
                UploadId=uid,
                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
            )
            written[key] = body
    listed = {o["Key"]: o["Size"] for o in _listing(running, bucket)}
    assert listed == {k: len(v) for k, v in written.items()}
    for k, v in written.items():
        assert s3.get_object(Bucket=bucket, Key=k)["Body"].read() == v
    # The upload in progress is untouched: it is listed, and it completes with its own bytes.
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert upload_id in {u["UploadId"] for u in uploads}
    assert s3.list_parts(Bucket=bucket, Key="segment.log", UploadId=upload_id).get("Parts", []) == []
    assert bucket in {b["Name"] for b in s3.list_buckets()["Buckets"]}


def test_the_upload_completes_after_the_attack(running: RunningProxy, scene: dict[str, str]) -> None:
    s3 = running.client()
    bucket, upload_id = scene["bucket"], scene["upload_id"]
    body = os.urandom(1000)
    etag = s3.upload_part(Bucket=bucket, Key="segment.log", UploadId=upload_id, PartNumber=1, Body=body)[
        "ETag"
    ]
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="segment.log",
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
    )
    assert s3.get_object(Bucket=bucket, Key="segment.log")["Body"].read() == body


def _listing(running: RunningProxy, bucket: str) -> list[dict]:
    out: list[dict] = []
    for page in (
        running.client()
        .get_paginator("list_objects_v2")
        .paginate(Bucket=bucket, PaginationConfig={"PageSize": 7})
    ):
        out += page.get("Contents", [])
    return out


def _expect_missing(call: Callable[..., object], **params: str) -> None:
    with pytest.raises(ClientError) as exc:
        call(**params)
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
