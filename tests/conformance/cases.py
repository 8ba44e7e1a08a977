"""S3 conformance cases, in the spirit of ceph/s3-tests: each case drives one S3 behaviour with boto3 and
asserts what Amazon S3 answers (status, error code, headers, bytes).

A case takes a `Target` (a client, its endpoint and keys, and a fresh empty bucket) and raises
AssertionError (or lets a ClientError escape) when the endpoint answers otherwise than S3.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import urllib3
from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

MiB = 1 << 20
http = urllib3.PoolManager(retries=False)


@dataclass
class Target:
    """One S3 endpoint under test, with a fresh bucket for the case."""

    client: Any
    endpoint: str
    access_key: str
    secret_key: str
    region: str
    bucket: str


Case = Callable[[Target], None]
CASES: dict[str, Case] = {}
# The runs, and what each case did in each (target name -> case name -> passed), for the summary.
TARGETS = {"tsproxy": "tsproxy over SeaweedFS", "seaweedfs": "SeaweedFS alone"}
RESULTS: dict[str, dict[str, bool]] = {}
# Cases tsproxy over SeaweedFS is known to fail, and why; they run as strict xfails, so that the day one
# passes the mark must go.
KNOWN_GAPS: dict[str, str] = {}
# Cases SeaweedFS alone (the comparison run) fails, and how it differs from S3: strict xfails too.
SEAWEEDFS_DIFFERS: dict[str, str] = {
    "default_content_type": "an object PUT without Content-Type has none, not binary/octet-stream",
    "keys_with_slashes_stay_distinct": "it folds a leading '/' and repeated slashes: '/a' is 'a'",
    "multipart_part_number_twice": "it completes an upload whose part list names a part twice",
}


def case(fn: Case) -> Case:
    CASES[fn.__name__] = fn
    return fn


def expect_error(call: Callable[[], Any], code: str, status: int) -> None:
    try:
        call()
    except ClientError as e:
        got = (e.response["Error"].get("Code"), e.response["ResponseMetadata"]["HTTPStatusCode"])
        assert got == (code, status), f"expected {code} {status}, got {got[0]} {got[1]}"
        return
    raise AssertionError(f"expected {code} {status}, the call succeeded")


def _multipart(t: Target, key: str, parts: list[bytes], **create: Any) -> tuple[str, list[dict[str, Any]]]:
    uid = t.client.create_multipart_upload(Bucket=t.bucket, Key=key, **create)["UploadId"]
    listed = [
        {
            "PartNumber": no,
            "ETag": t.client.upload_part(Bucket=t.bucket, Key=key, UploadId=uid, PartNumber=no, Body=body)[
                "ETag"
            ],
        }
        for no, body in enumerate(parts, 1)
    ]
    return uid, listed


def _complete(t: Target, key: str, uid: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = t.client.complete_multipart_upload(
        Bucket=t.bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": parts}
    )
    return result


def _presign(t: Target, key: str, expires: int, when: datetime) -> str:
    request = AWSRequest(method="GET", url=f"{t.endpoint}/{t.bucket}/{key}")
    auth = S3SigV4QueryAuth(Credentials(t.access_key, t.secret_key), "s3", t.region, expires=expires)
    with mock.patch("botocore.auth.get_current_datetime", lambda: when.replace(tzinfo=None)):
        auth.add_auth(request)
    return str(request.url)


def _error_code(resp: urllib3.BaseHTTPResponse) -> tuple[int, str]:
    text = resp.data.decode("utf-8", "replace")
    code = text.split("<Code>", 1)[1].split("</Code>", 1)[0] if "<Code>" in text else ""
    return resp.status, code


# -- objects --------------------------------------------------------------------------------------------


@case
def put_get_roundtrip(t: Target) -> None:
    data = os.urandom(300_000)
    put = t.client.put_object(Bucket=t.bucket, Key="obj", Body=data)
    assert put["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    assert t.client.get_object(Bucket=t.bucket, Key="obj")["Body"].read() == data


@case
def head_describes_the_object(t: Target) -> None:
    t.client.put_object(
        Bucket=t.bucket, Key="obj", Body=b"12345", ContentType="text/plain", Metadata={"a": "b"}
    )
    head = t.client.head_object(Bucket=t.bucket, Key="obj")
    assert (head["ContentLength"], head["ContentType"], head["Metadata"]) == (5, "text/plain", {"a": "b"})


@case
def default_content_type(t: Target) -> None:
    t.client.put_object(Bucket=t.bucket, Key="obj", Body=b"x")
    assert t.client.head_object(Bucket=t.bucket, Key="obj")["ContentType"] == "binary/octet-stream"


@case
def empty_object(t: Target) -> None:
    t.client.put_object(Bucket=t.bucket, Key="empty", Body=b"")
    got = t.client.get_object(Bucket=t.bucket, Key="empty")
    assert got["ContentLength"] == 0 and got["Body"].read() == b""
    assert got["ETag"] == '"d41d8cd98f00b204e9800998ecf8427e"'


@case
def missing_key(t: Target) -> None:
    expect_error(lambda: t.client.get_object(Bucket=t.bucket, Key="nope"), "NoSuchKey", 404)


@case
def missing_bucket(t: Target) -> None:
    expect_error(lambda: t.client.get_object(Bucket=t.bucket + "-x", Key="k"), "NoSuchBucket", 404)


@case
def suffix_range(t: Target) -> None:
    t.client.put_object(Bucket=t.bucket, Key="obj", Body=b"0123456789")
    got = t.client.get_object(Bucket=t.bucket, Key="obj", Range="bytes=-3")
    assert got["ContentRange"] == "bytes 7-9/10" and got["Body"].read() == b"789"


@case
def unsatisfiable_range(t: Target) -> None:
    t.client.put_object(Bucket=t.bucket, Key="obj", Body=b"0123456789")
    expect_error(
        lambda: t.client.get_object(Bucket=t.bucket, Key="obj", Range="bytes=20-30"), "InvalidRange", 416
    )


@case
def if_match_fails(t: Target) -> None:
    t.client.put_object(Bucket=t.bucket, Key="obj", Body=b"x")
    call = lambda: t.client.get_object(Bucket=t.bucket, Key="obj", IfMatch='"0123"')  # noqa: E731
    expect_error(call, "PreconditionFailed", 412)


@case
def if_none_match_not_modified(t: Target) -> None:
    etag = t.client.put_object(Bucket=t.bucket, Key="obj", Body=b"x")["ETag"]
    expect_error(lambda: t.client.get_object(Bucket=t.bucket, Key="obj", IfNoneMatch=etag), "304", 304)


@case
def response_header_overrides(t: Target) -> None:
    t.client.put_object(Bucket=t.bucket, Key="obj", Body=b"x")
    got = t.client.get_object(Bucket=t.bucket, Key="obj", ResponseContentType="text/csv")
    assert got["ContentType"] == "text/csv"


@case
def bad_content_md5(t: Target) -> None:
    wrong = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    call = lambda: t.client.put_object(Bucket=t.bucket, Key="obj", Body=b"x", ContentMD5=wrong)  # noqa: E731
    expect_error(call, "BadDigest", 400)
    expect_error(lambda: t.client.head_object(Bucket=t.bucket, Key="obj"), "404", 404)


@case
def content_encoding_as_sent(t: Target) -> None:
    t.client.put_object(Bucket=t.bucket, Key="obj", Body=b"x", ContentEncoding="deflate, gzip")
    assert t.client.head_object(Bucket=t.bucket, Key="obj")["ContentEncoding"] == "deflate, gzip"


@case
def keys_with_slashes_stay_distinct(t: Target) -> None:
    for key in ("a", "/a", "a//b", "a/b"):
        t.client.put_object(Bucket=t.bucket, Key=key, Body=key.encode())
    for key in ("a", "/a", "a//b", "a/b"):
        assert t.client.get_object(Bucket=t.bucket, Key=key)["Body"].read() == key.encode()


@case
def unicode_key(t: Target) -> None:
    key = "dir/ünïcødé ✓ +%.txt"
    t.client.put_object(Bucket=t.bucket, Key=key, Body=b"u")
    assert [o["Key"] for o in t.client.list_objects_v2(Bucket=t.bucket)["Contents"]] == [key]


@case
def copy_object_replaces_metadata(t: Target) -> None:
    t.client.put_object(Bucket=t.bucket, Key="src", Body=b"copy me", Metadata={"old": "1"})
    t.client.copy_object(
        Bucket=t.bucket,
        Key="dst",
        CopySource={"Bucket": t.bucket, "Key": "src"},
        Metadata={"new": "2"},
        MetadataDirective="REPLACE",
    )
    head = t.client.head_object(Bucket=t.bucket, Key="dst")
    assert head["Metadata"] == {"new": "2"}
    assert t.client.get_object(Bucket=t.bucket, Key="dst")["Body"].read() == b"copy me"


@case
def delete_missing_key(t: Target) -> None:
    status = t.client.delete_object(Bucket=t.bucket, Key="never")["ResponseMetadata"]["HTTPStatusCode"]
    assert status == 204


@case
def delete_objects_quiet(t: Target) -> None:
    for key in ("a", "b"):
        t.client.put_object(Bucket=t.bucket, Key=key, Body=b"x")
    out = t.client.delete_objects(
        Bucket=t.bucket, Delete={"Objects": [{"Key": "a"}, {"Key": "b"}, {"Key": "c"}], "Quiet": True}
    )
    assert not out.get("Deleted") and not out.get("Errors")
    assert t.client.list_objects_v2(Bucket=t.bucket)["KeyCount"] == 0


# -- listing --------------------------------------------------------------------------------------------


@case
def list_delimiter_and_prefix(t: Target) -> None:
    for key in ("a/1", "a/2", "b/1", "c"):
        t.client.put_object(Bucket=t.bucket, Key=key, Body=b"x")
    out = t.client.list_objects_v2(Bucket=t.bucket, Delimiter="/")
    assert [p["Prefix"] for p in out["CommonPrefixes"]] == ["a/", "b/"]
    assert [o["Key"] for o in out["Contents"]] == ["c"]
    out = t.client.list_objects_v2(Bucket=t.bucket, Prefix="a/")
    assert [o["Key"] for o in out["Contents"]] == ["a/1", "a/2"]


@case
def list_pages(t: Target) -> None:
    for i in range(5):
        t.client.put_object(Bucket=t.bucket, Key=f"k{i}", Body=b"x")
    first = t.client.list_objects_v2(Bucket=t.bucket, MaxKeys=2)
    assert first["IsTruncated"] and [o["Key"] for o in first["Contents"]] == ["k0", "k1"]
    rest = t.client.list_objects_v2(Bucket=t.bucket, ContinuationToken=first["NextContinuationToken"])
    assert [o["Key"] for o in rest["Contents"]] == ["k2", "k3", "k4"] and not rest["IsTruncated"]


@case
def list_v1_marker(t: Target) -> None:
    for key in ("a", "b", "c"):
        t.client.put_object(Bucket=t.bucket, Key=key, Body=b"x")
    out = t.client.list_objects(Bucket=t.bucket, Marker="a")
    assert [o["Key"] for o in out["Contents"]] == ["b", "c"]


@case
def list_sizes_and_etags(t: Target) -> None:
    t.client.put_object(Bucket=t.bucket, Key="obj", Body=b"12345")
    (entry,) = t.client.list_objects_v2(Bucket=t.bucket)["Contents"]
    assert entry["Size"] == 5 and entry["ETag"] == f'"{hashlib.md5(b"12345").hexdigest()}"'


# -- buckets ----------------------------------------------------------------------------------------------


@case
def delete_bucket_not_empty(t: Target) -> None:
    t.client.put_object(Bucket=t.bucket, Key="obj", Body=b"x")
    expect_error(lambda: t.client.delete_bucket(Bucket=t.bucket), "BucketNotEmpty", 409)


@case
def create_existing_bucket(t: Target) -> None:
    expect_error(lambda: t.client.create_bucket(Bucket=t.bucket), "BucketAlreadyOwnedByYou", 409)


@case
def invalid_bucket_name(t: Target) -> None:
    expect_error(lambda: t.client.create_bucket(Bucket="Bad_Name"), "InvalidBucketName", 400)


@case
def head_bucket(t: Target) -> None:
    assert t.client.head_bucket(Bucket=t.bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200
    expect_error(lambda: t.client.head_bucket(Bucket=t.bucket + "-x"), "404", 404)


# -- multipart --------------------------------------------------------------------------------------------


@case
def multipart_roundtrip(t: Target) -> None:
    parts = [os.urandom(5 * MiB), b"end"]
    uid, listed = _multipart(t, "mp", parts)
    done = _complete(t, "mp", uid, listed)
    digest = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    assert done["ETag"] == f'"{digest}-2"'
    assert t.client.get_object(Bucket=t.bucket, Key="mp")["Body"].read() == b"".join(parts)


@case
def multipart_complete_retried(t: Target) -> None:
    uid, listed = _multipart(t, "mp", [os.urandom(5 * MiB), b"end"])
    first = _complete(t, "mp", uid, listed)
    again = _complete(t, "mp", uid, listed)
    assert [again[f] for f in ("ETag", "Bucket", "Key")] == [first[f] for f in ("ETag", "Bucket", "Key")]


@case
def multipart_parts_out_of_order(t: Target) -> None:
    uid, listed = _multipart(t, "mp", [os.urandom(5 * MiB), b"end"])
    expect_error(lambda: _complete(t, "mp", uid, listed[::-1]), "InvalidPartOrder", 400)


@case
def multipart_part_number_twice(t: Target) -> None:
    uid, listed = _multipart(t, "mp", [b"only"])
    expect_error(lambda: _complete(t, "mp", uid, listed + listed), "InvalidPartOrder", 400)


@case
def multipart_part_too_small(t: Target) -> None:
    uid, listed = _multipart(t, "mp", [b"small", b"end"])
    expect_error(lambda: _complete(t, "mp", uid, listed), "EntityTooSmall", 400)


@case
def multipart_wrong_etag(t: Target) -> None:
    uid, _ = _multipart(t, "mp", [b"only"])
    wrong = [{"PartNumber": 1, "ETag": '"0123456789abcdef0123456789abcdef"'}]
    expect_error(lambda: _complete(t, "mp", uid, wrong), "InvalidPart", 400)


@case
def multipart_abort(t: Target) -> None:
    uid, _ = _multipart(t, "mp", [b"only"])
    t.client.abort_multipart_upload(Bucket=t.bucket, Key="mp", UploadId=uid)
    expect_error(lambda: t.client.list_parts(Bucket=t.bucket, Key="mp", UploadId=uid), "NoSuchUpload", 404)
    expect_error(lambda: t.client.head_object(Bucket=t.bucket, Key="mp"), "404", 404)


@case
def multipart_list_parts(t: Target) -> None:
    uid, listed = _multipart(t, "mp", [b"one", b"two!"])
    parts = t.client.list_parts(Bucket=t.bucket, Key="mp", UploadId=uid)["Parts"]
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in parts] == [
        (1, listed[0]["ETag"], 3),
        (2, listed[1]["ETag"], 4),
    ]


@case
def multipart_get_by_part_number(t: Target) -> None:
    parts = [os.urandom(5 * MiB), b"second part"]
    uid, listed = _multipart(t, "mp", parts)
    _complete(t, "mp", uid, listed)
    got = t.client.get_object(Bucket=t.bucket, Key="mp", PartNumber=2)
    assert got["PartsCount"] == 2 and got["Body"].read() == parts[1]
    assert t.client.head_object(Bucket=t.bucket, Key="mp", PartNumber=1)["ContentLength"] == 5 * MiB


@case
def part_number_out_of_range(t: Target) -> None:
    t.client.put_object(Bucket=t.bucket, Key="obj", Body=b"x")
    expect_error(
        lambda: t.client.get_object(Bucket=t.bucket, Key="obj", PartNumber=2), "InvalidPartNumber", 416
    )


@case
def upload_part_copy(t: Target) -> None:
    source = os.urandom(6 * MiB)
    t.client.put_object(Bucket=t.bucket, Key="src", Body=source)
    uid = t.client.create_multipart_upload(Bucket=t.bucket, Key="mp")["UploadId"]
    etag = t.client.upload_part_copy(
        Bucket=t.bucket,
        Key="mp",
        UploadId=uid,
        PartNumber=1,
        CopySource={"Bucket": t.bucket, "Key": "src"},
        CopySourceRange="bytes=0-5242879",
    )["CopyPartResult"]["ETag"]
    _complete(t, "mp", uid, [{"PartNumber": 1, "ETag": etag}])
    assert t.client.get_object(Bucket=t.bucket, Key="mp")["Body"].read() == source[: 5 * MiB]


# -- access control and signatures ----------------------------------------------------------------------


@case
def object_acl_is_private(t: Target) -> None:
    t.client.put_object(Bucket=t.bucket, Key="obj", Body=b"x", ACL="private")
    acl = t.client.get_object_acl(Bucket=t.bucket, Key="obj")
    assert [g["Permission"] for g in acl["Grants"]] == ["FULL_CONTROL"]
    assert acl["Grants"][0]["Grantee"]["ID"] == acl["Owner"]["ID"]
    t.client.put_object_acl(Bucket=t.bucket, Key="obj", ACL="private")


@case
def bucket_acl_is_private(t: Target) -> None:
    acl = t.client.get_bucket_acl(Bucket=t.bucket)
    assert [g["Permission"] for g in acl["Grants"]] == ["FULL_CONTROL"]
    t.client.put_bucket_acl(Bucket=t.bucket, ACL="private")


@case
def presigned_get(t: Target) -> None:
    t.client.put_object(Bucket=t.bucket, Key="obj", Body=b"presigned")
    resp = http.request("GET", _presign(t, "obj", 60, datetime.now(UTC)))
    assert (resp.status, resp.data) == (200, b"presigned")


@case
def presigned_expired(t: Target) -> None:
    t.client.put_object(Bucket=t.bucket, Key="obj", Body=b"x")
    resp = http.request("GET", _presign(t, "obj", 60, datetime.now(UTC) - timedelta(hours=1)))
    assert _error_code(resp) == (403, "AccessDenied")


@case
def presigned_longer_than_a_week(t: Target) -> None:
    t.client.put_object(Bucket=t.bucket, Key="obj", Body=b"x")
    resp = http.request("GET", _presign(t, "obj", 604801, datetime.now(UTC)))
    assert _error_code(resp) == (400, "AuthorizationQueryParametersError")


@case
def wrong_secret(t: Target) -> None:
    t.client.put_object(Bucket=t.bucket, Key="obj", Body=b"x")
    bad = Target(t.client, t.endpoint, t.access_key, t.secret_key + "x", t.region, t.bucket)
    assert _error_code(http.request("GET", _presign(bad, "obj", 60, datetime.now(UTC)))) == (
        403,
        "SignatureDoesNotMatch",
    )
