"""Names a backend keeps for itself inside a bucket: SeaweedFS holds every multipart upload of a bucket
as the folder `.uploads/<upload id>/` at the bucket's root, and a plain PUT of `.uploads/<id>/0001.part`
writes a part into that upload; objects under `.uploads/` are missing from its listings, and a key
`.uploads` is refused once an upload exists. Through tsproxy such keys are objects like any other: they
read back, are listed, and touch no upload in progress."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest

from tests.support.seaweed import SeaweedFS
from tsproxy.service.namespace import backend_name, stored_as_is
from tsproxy.service.uploads.ids import backend_upload_of

pytestmark = pytest.mark.seaweed

MIB = 1024 * 1024


def test_backend_folders_are_escaped() -> None:
    for key in (".uploads", ".uploads/", ".uploads/x", ".uploads/a/0001.part"):
        assert not stored_as_is(key) and backend_name(key) != key
    for key in ("a/.uploads/x", ".uploadsx", "uploads/x"):
        assert stored_as_is(key)


def test_keys_under_seaweedfs_upload_folder_touch_no_upload(seaweed: SeaweedFS, restartable: Any) -> None:
    s3 = restartable("seaweed").client()
    bucket = f"h-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="segment.log")["UploadId"]
    part = os.urandom(6 * MIB)  # incompressible and above the minimum part size: sent straight
    sent = s3.upload_part(Bucket=bucket, Key="segment.log", UploadId=upload_id, PartNumber=1, Body=part)
    etag = sent["ETag"]
    backend_upload = backend_upload_of(upload_id)
    assert backend_upload is not None
    # The backend upload is there, holding the part.
    store = seaweed.boto3_client()
    held = store.list_parts(Bucket=bucket, Key="segment.log", UploadId=backend_upload)["Parts"]
    assert [p["PartNumber"] for p in held] == [1]

    planted = {
        f".uploads/{backend_upload}/0001.part": b"not the part",
        f".uploads/{backend_upload}/0002.part": b"an extra part",
        ".uploads/report.csv": b"a,b\n",
        ".uploads": b"a key of its own",
    }
    for key, body in planted.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    for key, body in planted.items():
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body
    listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert sorted(listed) == sorted(planted)

    # The backend upload still holds only the part tsproxy sent, and completes to the client's bytes.
    held = store.list_parts(Bucket=bucket, Key="segment.log", UploadId=backend_upload)["Parts"]
    assert [p["PartNumber"] for p in held] == [1]
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="segment.log",
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
    )
    assert s3.get_object(Bucket=bucket, Key="segment.log")["Body"].read() == part
    for key in planted:
        s3.delete_object(Bucket=bucket, Key=key)
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])] == ["segment.log"]
