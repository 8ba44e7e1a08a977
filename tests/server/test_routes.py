"""The route table: one row per operation, and what a draining server does with each."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from tests.server.harness import RunningProxy
from tsproxy.s3.operations import Operation
from tsproxy.server.routes import BY_OPERATION, ROUTES, Draining

# The operations that would start storing something new: refused while draining, so a client retries
# them elsewhere. UploadPartCopy stores a part as UploadPart does.
STARTS_STORING = {
    Operation.PUT_OBJECT,
    Operation.COPY_OBJECT,
    Operation.CREATE_MULTIPART_UPLOAD,
    Operation.UPLOAD_PART,
    Operation.UPLOAD_PART_COPY,
}


def test_every_operation_has_one_row() -> None:
    served = [r.operation for r in ROUTES]
    assert sorted(served) == sorted(set(served))
    assert set(served) == set(Operation) - {Operation.UNKNOWN}


def test_the_draining_column() -> None:
    refused = {r.operation for r in ROUTES if r.draining is Draining.REFUSE}
    assert refused == STARTS_STORING


def test_only_writes_that_may_carry_an_acl_check_it() -> None:
    checked = {r.operation for r in ROUTES if r.acl}
    assert checked == {
        Operation.PUT_OBJECT,
        Operation.COPY_OBJECT,
        Operation.CREATE_MULTIPART_UPLOAD,
        Operation.CREATE_BUCKET,
    }
    assert BY_OPERATION[Operation.PUT_OBJECT_ACL].acl is False  # the ACL is its body, checked there


def _code(call: object) -> str:
    with pytest.raises(ClientError) as exc:
        call()  # type: ignore[operator]
    return str(exc.value.response["Error"]["Code"])


def test_a_draining_server_refuses_new_parts_and_finishes_uploads(local_proxy: RunningProxy) -> None:
    s3 = local_proxy.client()
    s3.create_bucket(Bucket="drain")
    s3.put_object(Bucket="drain", Key="source", Body=b"s" * (6 << 20))
    upload = s3.create_multipart_upload(Bucket="drain", Key="mp")["UploadId"]
    part = s3.upload_part(Bucket="drain", Key="mp", UploadId=upload, PartNumber=1, Body=b"p" * (5 << 20))
    local_proxy.proxy.draining = True
    try:
        assert _code(lambda: s3.put_object(Bucket="drain", Key="new", Body=b"x")) == "ServiceUnavailable"
        assert (
            _code(lambda: s3.upload_part(Bucket="drain", Key="mp", UploadId=upload, PartNumber=2, Body=b"y"))
            == "ServiceUnavailable"
        )
        copy = {"Bucket": "drain", "Key": "source"}
        assert (
            _code(
                lambda: s3.upload_part_copy(
                    Bucket="drain", Key="mp", UploadId=upload, PartNumber=2, CopySource=copy
                )
            )
            == "ServiceUnavailable"
        )
        # What exists is still finished and read.
        s3.complete_multipart_upload(
            Bucket="drain",
            Key="mp",
            UploadId=upload,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
        )
        assert s3.get_object(Bucket="drain", Key="mp")["Body"].read() == b"p" * (5 << 20)
    finally:
        local_proxy.proxy.draining = False
