"""S3's retry semantics and finer points of conformance, through a real tsproxy on both backends."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
import urllib3
from botocore.auth import HmacV1QueryAuth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.server.harness import ACCESS_KEY, SECRET_KEY, RunningProxy

MiB = 1 << 20
NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
http = urllib3.PoolManager(retries=False)


def _code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    err = exc.value.response
    return err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"]


def _upload(s3: object, bucket: str, key: str, parts: list[bytes]) -> tuple[str, list[dict[str, object]]]:
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]  # type: ignore[attr-defined]
    listed = [
        {
            "PartNumber": no,
            "ETag": s3.upload_part(  # type: ignore[attr-defined]
                Bucket=bucket, Key=key, UploadId=uid, PartNumber=no, Body=body
            )["ETag"],
        }
        for no, body in enumerate(parts, 1)
    ]
    return uid, listed


def test_complete_repeated_after_success_answers_the_same(proxy: RunningProxy, bucket: str) -> None:
    s3 = proxy.client()
    parts = [os.urandom(5 * MiB), b"tail of the object"]
    uid, listed = _upload(s3, bucket, "retried", parts)
    first = s3.complete_multipart_upload(
        Bucket=bucket, Key="retried", UploadId=uid, MultipartUpload={"Parts": listed}
    )
    again = s3.complete_multipart_upload(
        Bucket=bucket, Key="retried", UploadId=uid, MultipartUpload={"Parts": listed}
    )
    for field in ("ETag", "Location", "Bucket", "Key"):
        assert again[field] == first[field]
    assert first["ETag"].endswith('-2"')
    assert s3.get_object(Bucket=bucket, Key="retried")["Body"].read() == b"".join(parts)
    # Anything but a repeat of the same completion still learns the upload is gone.
    for key, part_list in (("retried", listed[:1]), ("other-key", listed)):
        with pytest.raises(ClientError) as exc:
            s3.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": part_list}
            )
        assert _code(exc) == ("NoSuchUpload", 404)
    with pytest.raises(ClientError) as exc:
        s3.list_parts(Bucket=bucket, Key="retried", UploadId=uid)
    assert _code(exc) == ("NoSuchUpload", 404)
    assert [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])] == []
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["retried"]


def test_one_part_number_twice_in_a_complete_list(proxy: RunningProxy, bucket: str) -> None:
    s3 = proxy.client()
    uid, listed = _upload(s3, bucket, "twice", [b"only part"])
    with pytest.raises(ClientError) as exc:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="twice", UploadId=uid, MultipartUpload={"Parts": listed + listed}
        )
    assert _code(exc) == ("InvalidPartOrder", 400)
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="twice")
    s3.complete_multipart_upload(Bucket=bucket, Key="twice", UploadId=uid, MultipartUpload={"Parts": listed})
    assert s3.get_object(Bucket=bucket, Key="twice")["Body"].read() == b"only part"


def test_part_number_reads_give_parts_and_their_count(proxy: RunningProxy, bucket: str) -> None:
    s3 = proxy.client()
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB + 3), b"last"]
    uid, listed = _upload(s3, bucket, "mp", parts)
    s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=uid, MultipartUpload={"Parts": listed})
    size = sum(map(len, parts))
    first = 0
    for no, body in enumerate(parts, 1):
        last = first + len(body) - 1
        head = s3.head_object(Bucket=bucket, Key="mp", PartNumber=no)
        got = s3.get_object(Bucket=bucket, Key="mp", PartNumber=no)
        for answer in (head, got):
            assert answer["ResponseMetadata"]["HTTPStatusCode"] == 206
            assert answer["PartsCount"] == 3
            assert answer["ContentLength"] == len(body)
            assert answer["ContentRange"] == f"bytes {first}-{last}/{size}"
            assert answer["ETag"].endswith('-3"')
        assert got["Body"].read() == body
        first = last + 1
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="mp", PartNumber=4)
    assert _code(exc) == ("InvalidPartNumber", 416)
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="mp", PartNumber=1, Range="bytes=0-1")
    assert _code(exc) == ("InvalidRequest", 400)
    # An object put whole is one part, and has no parts count.
    s3.put_object(Bucket=bucket, Key="whole", Body=b"0123456789")
    got = s3.get_object(Bucket=bucket, Key="whole", PartNumber=1)
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert got["ContentRange"] == "bytes 0-9/10" and "PartsCount" not in got
    assert got["Body"].read() == b"0123456789"
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key="whole", PartNumber=2)
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 416
    signed = proxy.client().generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "whole", "PartNumber": 0}
    )
    root = ET.fromstring(http.request("GET", signed).data)
    assert root.findtext("Code") == "InvalidArgument"


def test_content_encoding_comes_back_as_sent(proxy: RunningProxy, bucket: str) -> None:
    s3 = proxy.client()
    for value in ("deflate, gzip", "gzip,br", "identity"):
        s3.put_object(Bucket=bucket, Key="enc", Body=b"x" * 100, ContentEncoding=value)
        assert s3.head_object(Bucket=bucket, Key="enc")["ContentEncoding"] == value
    # aws-chunked frames the upload, it is no encoding of the object: it is dropped from the list.
    s3.put_object(
        Bucket=bucket, Key="enc", Body=b"y" * 100, ContentEncoding="deflate, gzip", ChecksumAlgorithm="CRC32"
    )
    assert s3.get_object(Bucket=bucket, Key="enc")["ContentEncoding"] == "deflate, gzip"
    uid = s3.create_multipart_upload(Bucket=bucket, Key="mpenc", ContentEncoding="br, gzip")["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key="mpenc", UploadId=uid, PartNumber=1, Body=b"z")["ETag"]
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="mpenc",
        UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
    )
    assert s3.head_object(Bucket=bucket, Key="mpenc")["ContentEncoding"] == "br, gzip"


def test_acls_are_the_canned_private_policy(proxy: RunningProxy, bucket: str) -> None:
    s3 = proxy.client()
    s3.put_object(Bucket=bucket, Key="k", Body=b"x", ACL="private")
    for acl in (s3.get_object_acl(Bucket=bucket, Key="k"), s3.get_bucket_acl(Bucket=bucket)):
        owner = acl["Owner"]["ID"]
        assert acl["Grants"] == [
            {
                "Grantee": {"ID": owner, "DisplayName": owner, "Type": "CanonicalUser"},
                "Permission": "FULL_CONTROL",
            }
        ]
    policy = {
        "Owner": {"ID": owner},
        "Grants": [{"Grantee": {"ID": owner, "Type": "CanonicalUser"}, "Permission": "FULL_CONTROL"}],
    }
    s3.put_object_acl(Bucket=bucket, Key="k", ACL="private")
    s3.put_object_acl(Bucket=bucket, Key="k", AccessControlPolicy=policy)
    s3.put_bucket_acl(Bucket=bucket, ACL="private")
    s3.put_bucket_acl(Bucket=bucket, AccessControlPolicy=policy)
    s3.create_multipart_upload(Bucket=bucket, Key="m", ACL="bucket-owner-full-control")
    s3.copy_object(Bucket=bucket, Key="c", CopySource={"Bucket": bucket, "Key": "k"}, ACL="private")
    public = {
        "Owner": {"ID": owner},
        "Grants": [
            {
                "Grantee": {"Type": "Group", "URI": "http://acs.amazonaws.com/groups/global/AllUsers"},
                "Permission": "READ",
            }
        ],
    }
    refused = [
        lambda: s3.put_object(Bucket=bucket, Key="pub", Body=b"x", ACL="public-read"),
        lambda: s3.put_object(Bucket=bucket, Key="pub", Body=b"x", GrantRead="id=someone"),
        lambda: s3.put_object_acl(Bucket=bucket, Key="k", ACL="public-read"),
        lambda: s3.put_object_acl(Bucket=bucket, Key="k", AccessControlPolicy=public),
        lambda: s3.put_bucket_acl(Bucket=bucket, ACL="public-read-write"),
        lambda: s3.create_bucket(Bucket=bucket + "-pub", ACL="public-read"),
        lambda: s3.create_multipart_upload(Bucket=bucket, Key="pub", ACL="authenticated-read"),
    ]
    for call in refused:
        with pytest.raises(ClientError) as exc:
            call()
        assert _code(exc) == ("NotImplemented", 501)
    assert sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]) == ["c", "k"]
    with pytest.raises(ClientError) as exc:
        s3.get_object_acl(Bucket=bucket, Key="missing")
    assert _code(exc) == ("NoSuchKey", 404)
    with pytest.raises(ClientError) as exc:
        s3.get_bucket_acl(Bucket=bucket + "-missing")
    assert _code(exc) == ("NoSuchBucket", 404)


def _presigned(url: str, auth: object, when: datetime) -> str:
    request = AWSRequest(method="GET", url=url)
    with mock.patch("botocore.auth.get_current_datetime", lambda: when.replace(tzinfo=None)):
        auth.add_auth(request)  # type: ignore[attr-defined]
    return str(request.url)


def _error(url: str) -> tuple[int, str, str]:
    resp = http.request("GET", url)
    root = ET.fromstring(resp.data)
    return resp.status, root.findtext("Code") or "", root.findtext("Message") or ""


def test_expired_and_out_of_range_presigned_urls(local_proxy: RunningProxy) -> None:
    s3 = local_proxy.client()
    s3.create_bucket(Bucket="presign")
    s3.put_object(Bucket="presign", Key="k", Body=b"x")
    url = f"{local_proxy.endpoint}/presign/k"
    creds = Credentials(ACCESS_KEY, SECRET_KEY)
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    v4 = S3SigV4QueryAuth(creds, "s3", "us-east-1", expires=60)
    assert _error(_presigned(url, v4, an_hour_ago)) == (403, "AccessDenied", "Request has expired")
    week = S3SigV4QueryAuth(creds, "s3", "us-east-1", expires=604801)
    assert _error(_presigned(url, week, datetime.now(UTC))) == (
        400,
        "AuthorizationQueryParametersError",
        "X-Amz-Expires must be less than a week (in seconds); that is, the given X-Amz-Expires must be "
        "less than 604800 seconds",
    )
    assert (
        http.request(
            "GET", _presigned(url, S3SigV4QueryAuth(creds, "s3", "us-east-1", 604800), an_hour_ago)
        ).status
        == 200
    )
    request = AWSRequest(method="GET", url=url)
    HmacV1QueryAuth(creds, expires=-60).add_auth(request)
    assert _error(str(request.url)) == (403, "AccessDenied", "Request has expired")
