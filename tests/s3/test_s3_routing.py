"""Routing: which S3 operation a request is, path-style and virtual-hosted, and the errors S3 gives."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

import pytest
from multidict import CIMultiDict

from tests.s3.s3_helpers import boto3_client, boto3_wire
from tsproxy import errors
from tsproxy.s3.operations import Operation
from tsproxy.s3.routing import InvalidURI, S3Request, check_bucket_name, parse_copy_source, route
from tsproxy.server.routes import ROUTES

COPY = {"x-amz-copy-source": "/src/key"}


def r(method: str, path: str, query: dict[str, str] | None = None, headers: dict[str, str] | None = None,
      host: str = "localhost:9000", suffixes: tuple[str, ...] = ()) -> S3Request:  # fmt: skip
    return route(method, host, path, query or {}, CIMultiDict(headers or {}), suffixes, table=ROUTES)


@pytest.mark.parametrize(
    ("method", "path", "query", "headers", "operation"),
    [
        ("GET", "/", {}, {}, "ListBuckets"),
        ("HEAD", "/", {}, {}, "ListBuckets"),
        ("PUT", "/bucket", {}, {}, "CreateBucket"),
        ("PUT", "/bucket/", {}, {}, "CreateBucket"),
        ("HEAD", "/bucket", {}, {}, "HeadBucket"),
        ("DELETE", "/bucket", {}, {}, "DeleteBucket"),
        ("GET", "/bucket", {"location": ""}, {}, "GetBucketLocation"),
        ("GET", "/bucket", {"versioning": ""}, {}, "GetBucketVersioning"),
        ("GET", "/bucket", {"versions": "", "prefix": "a"}, {}, "ListObjectVersions"),
        ("GET", "/bucket", {"list-type": "2", "prefix": "p"}, {}, "ListObjectsV2"),
        ("GET", "/bucket", {"prefix": "p", "marker": "m"}, {}, "ListObjects"),
        ("GET", "/bucket/", {}, {}, "ListObjects"),
        ("GET", "/bucket", {"uploads": ""}, {}, "ListMultipartUploads"),
        ("POST", "/bucket", {"delete": ""}, {}, "DeleteObjects"),
        ("HEAD", "/bucket/key", {}, {}, "HeadObject"),
        ("GET", "/bucket/key", {}, {}, "GetObject"),
        ("GET", "/bucket/key", {"versionId": "null", "partNumber": "1"}, {}, "GetObject"),
        ("GET", "/bucket/key", {"response-content-type": "a/b", "x-id": "GetObject"}, {}, "GetObject"),
        ("PUT", "/bucket/key", {}, {}, "PutObject"),
        ("PUT", "/bucket/key", {}, COPY, "CopyObject"),
        ("PUT", "/bucket/key", {"partNumber": "1", "uploadId": "u"}, {}, "UploadPart"),
        ("PUT", "/bucket/key", {"partNumber": "1", "uploadId": "u"}, COPY, "UploadPartCopy"),
        ("DELETE", "/bucket/key", {}, {}, "DeleteObject"),
        ("DELETE", "/bucket/key", {"uploadId": "u"}, {}, "AbortMultipartUpload"),
        ("POST", "/bucket/key", {"uploads": ""}, {}, "CreateMultipartUpload"),
        ("POST", "/bucket/key", {"uploadId": "u"}, {}, "CompleteMultipartUpload"),
        ("GET", "/bucket/key", {"uploadId": "u"}, {}, "ListParts"),
        ("get", "/bucket/key", {}, {}, "GetObject"),
    ],
)
def test_operations(
    method: str, path: str, query: dict[str, str], headers: dict[str, str], operation: str
) -> None:
    assert r(method, path, query, headers).operation == operation


@pytest.mark.parametrize(
    ("method", "path", "query"),
    [
        ("DELETE", "/bucket", {"acl": ""}),
        ("GET", "/bucket", {"policy": ""}),
        ("PUT", "/bucket", {"lifecycle": ""}),
        ("GET", "/bucket", {"cors": ""}),
        ("DELETE", "/bucket", {"tagging": ""}),
        ("PUT", "/bucket", {"versioning": ""}),
        ("GET", "/bucket", {"encryption": ""}),
        ("GET", "/bucket", {"website": ""}),
        ("GET", "/bucket", {"location": "", "acl": ""}),
        ("POST", "/bucket", {}),
        ("DELETE", "/bucket/key", {"acl": ""}),
        ("GET", "/bucket/key", {"acl": "", "tagging": ""}),
        ("PUT", "/bucket/key", {"tagging": ""}),
        ("GET", "/bucket/key", {"tagging": ""}),
        ("GET", "/bucket/key", {"attributes": ""}),
        ("POST", "/bucket/key", {"select": "", "select-type": "2"}),
        ("POST", "/bucket/key", {"restore": ""}),
        ("PUT", "/bucket/key", {"retention": ""}),
        ("PUT", "/bucket/key", {"legal-hold": ""}),
        ("GET", "/bucket/key", {"torrent": ""}),
    ],
)
def test_unsupported_subresources_are_not_implemented(method: str, path: str, query: dict[str, str]) -> None:
    with pytest.raises(errors.NotImplemented_) as exc:
        r(method, path, query)
    assert (exc.value.code, exc.value.status) == ("NotImplemented", 501)


@pytest.mark.parametrize(
    ("method", "path", "query"),
    [
        ("PUT", "/", {}),
        ("DELETE", "/", {}),
        ("POST", "/", {}),
        ("PATCH", "/bucket", {}),
        ("OPTIONS", "/bucket/key", {}),
        ("POST", "/bucket/key", {}),
        ("PATCH", "/bucket/key", {}),
    ],
)
def test_wrong_methods(method: str, path: str, query: dict[str, str]) -> None:
    with pytest.raises(errors.MethodNotAllowed) as exc:
        r(method, path, query)
    assert exc.value.status == 405


def test_keys_are_decoded_unicode() -> None:
    assert r("GET", "/bucket/a%20b/c%2Bd+e/%C3%BC%F0%9F%8E%89") == S3Request(
        "GetObject", "bucket", "a b/c+d+e/ü🎉"
    )
    assert r("GET", "/bucket/a%2Fb").key == "a/b"
    assert r("GET", "/bucket//double//").key == "/double//"
    assert r("GET", "/bucket/?x").key is None


def test_invalid_utf8_is_invalid_uri() -> None:
    with pytest.raises(InvalidURI) as exc:
        r("GET", "/bucket/%FF%FE")
    assert (exc.value.code, exc.value.status) == ("InvalidURI", 400)


def test_key_length_limit_is_in_utf8_bytes() -> None:
    assert r("PUT", "/b-1/" + "k" * 1024).key == "k" * 1024
    with pytest.raises(errors.KeyTooLongError):
        r("PUT", "/b-1/" + "k" * 1025)
    three_byte = "€" * 341  # 1023 bytes
    assert r("PUT", "/b-1/" + three_byte + "x").key is not None
    with pytest.raises(errors.KeyTooLongError):
        r("PUT", "/b-1/" + three_byte + "xx")


@pytest.mark.parametrize(
    "name", ["abc", "my-bucket", "my.bucket.name", "a" * 63, "0bucket", "bucket0", "192.168.5.4x"]
)
def test_valid_new_bucket_names(name: str) -> None:
    check_bucket_name(name, strict=True)
    assert r("PUT", "/" + name).operation == "CreateBucket"


@pytest.mark.parametrize(
    "name",
    ["ab", "a" * 64, "My-Bucket", "my_bucket", "-bucket", "bucket-", "my..bucket", "my.-bucket",
     "192.168.5.4", "xn--bucket", "bucket-s3alias", "bucket--ol-s3", "bücket", "bu cket"],
)  # fmt: skip
def test_invalid_new_bucket_names(name: str) -> None:
    with pytest.raises(errors.InvalidBucketName) as exc:
        check_bucket_name(name, strict=True)
    assert exc.value.fields["BucketName"] == name


def test_legacy_bucket_names_stay_reachable_but_cannot_be_created() -> None:
    assert r("GET", "/Old_Bucket/key").bucket == "Old_Bucket"
    with pytest.raises(errors.InvalidBucketName):
        r("PUT", "/Old_Bucket")
    with pytest.raises(errors.InvalidBucketName):
        r("GET", "/ab/key")


def test_virtual_hosted_style() -> None:
    suffixes = ("s3.local", "localhost")
    assert r("GET", "/a/b", host="my-bucket.s3.local:9000", suffixes=suffixes) == S3Request(
        "GetObject", "my-bucket", "a/b", host_bucket=True
    )
    assert r("GET", "/", host="my-bucket.s3.local", suffixes=suffixes) == S3Request(
        "ListObjects", "my-bucket", None, host_bucket=True
    )
    assert r("GET", "/", {"list-type": "2"}, host="b.c.localhost", suffixes=suffixes).bucket == "b.c"
    assert r("GET", "/bucket/key", host="MINE.S3.LOCAL.", suffixes=suffixes).bucket == "mine"
    # The suffix alone, an address or an unknown host: path-style.
    assert r("GET", "/bucket/key", host="s3.local", suffixes=suffixes) == S3Request(
        "GetObject", "bucket", "key"
    )
    assert r("GET", "/bucket/key", host="127.0.0.1:9000", suffixes=suffixes).bucket == "bucket"
    assert r("GET", "/bucket/key", host="[::1]:9000", suffixes=suffixes).bucket == "bucket"
    assert r("GET", "/bucket/key", host="other.example", suffixes=suffixes).bucket == "bucket"
    with pytest.raises(errors.InvalidBucketName):
        r("GET", "/key", host="Bad_Name!.s3.local", suffixes=suffixes)


@pytest.mark.parametrize(
    ("call", "operation"),
    [
        (lambda c: c.list_buckets(), "ListBuckets"),
        (lambda c: c.create_bucket(Bucket="bkt"), "CreateBucket"),
        (lambda c: c.head_bucket(Bucket="bkt"), "HeadBucket"),
        (lambda c: c.delete_bucket(Bucket="bkt"), "DeleteBucket"),
        (lambda c: c.get_bucket_location(Bucket="bkt"), "GetBucketLocation"),
        (lambda c: c.get_bucket_versioning(Bucket="bkt"), "GetBucketVersioning"),
        (lambda c: c.list_object_versions(Bucket="bkt"), "ListObjectVersions"),
        (lambda c: c.list_objects_v2(Bucket="bkt"), "ListObjectsV2"),
        (lambda c: c.list_objects(Bucket="bkt"), "ListObjects"),
        (lambda c: c.head_object(Bucket="bkt", Key="k"), "HeadObject"),
        (lambda c: c.get_object(Bucket="bkt", Key="k"), "GetObject"),
        (lambda c: c.put_object(Bucket="bkt", Key="k", Body=b"x"), "PutObject"),
        (lambda c: c.copy_object(Bucket="bkt", Key="k", CopySource="bkt/src"), "CopyObject"),
        (lambda c: c.delete_object(Bucket="bkt", Key="k"), "DeleteObject"),
        (lambda c: c.delete_objects(Bucket="bkt", Delete={"Objects": [{"Key": "k"}]}), "DeleteObjects"),
        (lambda c: c.create_multipart_upload(Bucket="bkt", Key="k"), "CreateMultipartUpload"),
        (lambda c: c.upload_part(Bucket="bkt", Key="k", UploadId="u", PartNumber=1, Body=b"x"), "UploadPart"),
        (lambda c: c.upload_part_copy(Bucket="bkt", Key="k", UploadId="u", PartNumber=1, CopySource="bkt/s"),
         "UploadPartCopy"),
        (lambda c: c.complete_multipart_upload(Bucket="bkt", Key="k", UploadId="u",
                                               MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": "e"}]}),
         "CompleteMultipartUpload"),
        (lambda c: c.abort_multipart_upload(Bucket="bkt", Key="k", UploadId="u"), "AbortMultipartUpload"),
        (lambda c: c.list_parts(Bucket="bkt", Key="k", UploadId="u"), "ListParts"),
        (lambda c: c.list_multipart_uploads(Bucket="bkt"), "ListMultipartUploads"),
    ],
)  # fmt: skip
def test_every_boto3_operation_routes(call: Any, operation: str) -> None:
    for style in ("path", "virtual"):
        client = boto3_client("https://s3.test", s3={"addressing_style": style})
        wire = boto3_wire(client, call)
        query = dict(parse_qsl(wire.query, keep_blank_values=True))
        request = route(
            wire.method, wire.headers["host"], wire.path, query, wire.headers, ["s3.test"], table=ROUTES
        )
        assert request.operation == operation, style


# -- x-amz-copy-source --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("bucket/key", ("bucket", "key", None)),
        ("/bucket/key", ("bucket", "key", None)),
        ("bucket/dir/sub%20file%2Bx", ("bucket", "dir/sub file+x", None)),
        ("bucket/%C3%BC%3Fq", ("bucket", "ü?q", None)),
        ("bucket/key?versionId=null", ("bucket", "key", "null")),
        ("bucket/key?versionId=abc%2Fdef", ("bucket", "key", "abc/def")),
    ],
)
def test_copy_source(value: str, expected: tuple[str, str, str | None]) -> None:
    assert parse_copy_source(value) == expected


@pytest.mark.parametrize("value", ["", "bucket", "bucket/", "/bucket/", "/key-only", "bucket/key?other=1"])
def test_bad_copy_source(value: str) -> None:
    with pytest.raises(errors.InvalidArgument) as exc:
        parse_copy_source(value)
    assert exc.value.fields["ArgumentName"] == "x-amz-copy-source"


def test_copy_source_as_boto3_sends_it() -> None:
    wire = boto3_wire(
        boto3_client(),
        lambda c: c.copy_object(Bucket="b", Key="k", CopySource={"Bucket": "src", "Key": "ü a+b?c"}),
    )
    assert parse_copy_source(wire.headers["x-amz-copy-source"]) == ("src", "ü a+b?c", None)


@pytest.mark.parametrize(
    ("method", "path", "query", "operation"),
    [
        ("GET", "/bucket", {"acl": ""}, Operation.GET_BUCKET_ACL),
        ("PUT", "/bucket", {"acl": ""}, Operation.PUT_BUCKET_ACL),
        ("GET", "/bucket/key", {"acl": ""}, Operation.GET_OBJECT_ACL),
        ("PUT", "/bucket/key", {"acl": ""}, Operation.PUT_OBJECT_ACL),
        ("GET", "/bucket/key", {"acl": "", "versionId": "null"}, Operation.GET_OBJECT_ACL),
    ],
)
def test_acl_subresource_routes(method: str, path: str, query: dict[str, str], operation: Operation) -> None:
    assert r(method, path, query).operation is operation
