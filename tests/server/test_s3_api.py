"""S3 semantics through tsproxy with boto3 (current version, default checksum settings), on both backends."""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import random
from datetime import UTC, datetime, timedelta

import pytest
from botocore.exceptions import ClientError

from tests.server.harness import RunningProxy
from tests.support.kafka_batches import producer_batch


def _code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    err = exc.value.response
    return err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"]


def test_put_get_head_roundtrip(proxy: RunningProxy, bucket: str) -> None:
    s3 = proxy.client()
    data = os.urandom(700_000) + b"x" * 300_000
    put = s3.put_object(
        Bucket=bucket,
        Key="a/b.bin",
        Body=data,
        ContentType="application/x-test",
        Metadata={"owner": "kafka", "note": "hello world"},
        CacheControl="max-age=5",
    )
    assert put["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    head = s3.head_object(Bucket=bucket, Key="a/b.bin")
    assert head["ContentLength"] == len(data)
    assert head["ETag"] == put["ETag"]
    assert head["ContentType"] == "application/x-test"
    assert head["Metadata"]["owner"] == "kafka"
    assert head["CacheControl"] == "max-age=5"
    got = s3.get_object(Bucket=bucket, Key="a/b.bin")
    assert got["Body"].read() == data
    assert got["ContentLength"] == len(data)


@pytest.mark.parametrize("size", [0, 1, 262_143, 262_144, 262_145, 1_000_003])
def test_every_range_form(proxy: RunningProxy, bucket: str, size: int) -> None:
    s3 = proxy.client()
    data = random.Random(size).randbytes(size)
    s3.put_object(Bucket=bucket, Key="obj", Body=data)
    assert s3.get_object(Bucket=bucket, Key="obj")["Body"].read() == data
    if size == 0:
        with pytest.raises(ClientError) as exc:
            s3.get_object(Bucket=bucket, Key="obj", Range="bytes=0-0")
        assert _code(exc) == ("InvalidRange", 416)
        return
    rng = random.Random(size + 1)
    cases = [(0, 0), (size - 1, size - 1), (0, size - 1)]
    cases += [tuple(sorted((rng.randrange(size), rng.randrange(size)))) for _ in range(6)]
    for first, last in cases:
        got = s3.get_object(Bucket=bucket, Key="obj", Range=f"bytes={first}-{last}")
        assert got["Body"].read() == data[first : last + 1]
        assert got["ContentRange"] == f"bytes {first}-{last}/{size}"
    assert (
        s3.get_object(Bucket=bucket, Key="obj", Range=f"bytes={size // 2}-")["Body"].read()
        == data[size // 2 :]
    )
    assert s3.get_object(Bucket=bucket, Key="obj", Range="bytes=-7")["Body"].read() == data[-7:]
    assert s3.get_object(Bucket=bucket, Key="obj", Range=f"bytes=0-{size + 50}")["Body"].read() == data
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="obj", Range=f"bytes={size}-")
    assert _code(exc) == ("InvalidRange", 416)


def test_listing_describes_original_bytes(proxy: RunningProxy, bucket: str) -> None:
    s3 = proxy.client()
    payloads = {f"topic/p{i}/seg-{i:03d}.log": b"k" * (1000 * i + 1) for i in range(12)}
    payloads["other/x"] = b"abc"
    for key, body in payloads.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="topic/")
    assert sorted(o["Key"] for o in listed["Contents"]) == sorted(
        k for k in payloads if k.startswith("topic/")
    )
    for o in listed["Contents"]:
        assert o["Size"] == len(payloads[o["Key"]])
        assert o["ETag"] == f'"{hashlib.md5(payloads[o["Key"]]).hexdigest()}"'
    top = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["other/", "topic/"]  # internal prefix hidden
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, PaginationConfig={"PageSize": 5}):
        keys += [o["Key"] for o in page.get("Contents", [])]
    assert keys == sorted(payloads)
    v1 = s3.list_objects(Bucket=bucket, Prefix="other/")
    assert [o["Key"] for o in v1["Contents"]] == ["other/x"] and v1["Contents"][0]["Size"] == 3
    versions = s3.list_object_versions(Bucket=bucket, Prefix="other/")
    assert versions["Versions"][0]["VersionId"] == "null" and versions["Versions"][0]["Size"] == 3


def test_multipart_out_of_order_resent_and_small_compressed_parts(proxy: RunningProxy, bucket: str) -> None:
    s3 = proxy.client()
    # Very compressible parts shrink far below 5 MiB once stored: completion must still work.
    parts = [(b"%08d," % i) * (5 * 1024 * 1024 // 9 + 1) for i in range(3)] + [b"tail" * 1000]
    up = s3.create_multipart_upload(
        Bucket=bucket, Key="mp/obj", ContentType="text/plain", Metadata={"m": "1"}
    )
    uid = up["UploadId"]
    etags = {}
    for no in (3, 1, 4, 2):
        etags[no] = s3.upload_part(
            Bucket=bucket, Key="mp/obj", UploadId=uid, PartNumber=no, Body=parts[no - 1]
        )["ETag"]
    # Resend part 2 with the same bytes: a new attempt replaces the old one.
    etags[2] = s3.upload_part(Bucket=bucket, Key="mp/obj", UploadId=uid, PartNumber=2, Body=parts[1])["ETag"]
    listed = s3.list_parts(Bucket=bucket, Key="mp/obj", UploadId=uid)
    assert [p["PartNumber"] for p in listed["Parts"]] == [1, 2, 3, 4]
    assert [p["Size"] for p in listed["Parts"]] == [len(p) for p in parts]
    uploads = s3.list_multipart_uploads(Bucket=bucket)
    assert [u["UploadId"] for u in uploads["Uploads"]] == [uid]
    done = s3.complete_multipart_upload(
        Bucket=bucket,
        Key="mp/obj",
        UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etags[n]} for n in (1, 2, 3, 4)]},
    )
    whole = b"".join(parts)
    expected_etag = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + "-4"
    assert done["ETag"] == f'"{expected_etag}"'
    head = s3.head_object(Bucket=bucket, Key="mp/obj")
    assert (
        head["ContentLength"] == len(whole)
        and head["ETag"] == done["ETag"]
        and head["Metadata"] == {"m": "1"}
    )
    assert s3.get_object(Bucket=bucket, Key="mp/obj")["Body"].read() == whole
    first = len(parts[0]) - 10
    got = s3.get_object(Bucket=bucket, Key="mp/obj", Range=f"bytes={first}-{first + 30}")["Body"].read()
    assert got == whole[first : first + 31]
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["mp/obj"]


def _kafka_segment(codec: int, size: int) -> bytes:
    """Record batches of hex values (compressible about 2:1), about size bytes in all."""
    rng = random.Random(codec)
    out = bytearray()
    offset = 0
    while len(out) < size:
        values = [rng.randbytes(500).hex().encode() for _ in range(200)]
        out += producer_batch(codec, values, base_offset=offset)
        offset += len(values)
    return bytes(out)


@pytest.mark.parametrize("codec", [0, 4], ids=["uncompressed", "zstd"])
def test_multipart_kafka_segment_auto_compression_per_part(
    proxy: RunningProxy, bucket: str, codec: int
) -> None:
    """Every part of a segment whose batches are compressed skips zstd, not only the first."""
    data = _kafka_segment(codec, 11 << 20)
    cuts = [0, 5 << 20, (10 << 20) + 12345, len(data)]  # parts start inside batches
    s3 = proxy.client()
    uid = s3.create_multipart_upload(Bucket=bucket, Key="seg.log")["UploadId"]
    parts = []
    for no, (a, b) in enumerate(itertools.pairwise(cuts), start=1):
        etag = s3.upload_part(Bucket=bucket, Key="seg.log", UploadId=uid, PartNumber=no, Body=data[a:b])[
            "ETag"
        ]
        parts.append({"PartNumber": no, "ETag": etag})
    s3.complete_multipart_upload(Bucket=bucket, Key="seg.log", UploadId=uid, MultipartUpload={"Parts": parts})
    assert s3.get_object(Bucket=bucket, Key="seg.log")["Body"].read() == data
    manifest = proxy.call(proxy.proxy.objects.resolve(bucket, "seg.log")).manifest
    assert [seg.compressed for seg in manifest.segments] == [codec == 0] * 3


def test_multipart_errors(proxy: RunningProxy, bucket: str) -> None:
    s3 = proxy.client()
    uid = s3.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    e1 = s3.upload_part(Bucket=bucket, Key="k", UploadId=uid, PartNumber=1, Body=b"small")["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key="k", UploadId=uid, PartNumber=2, Body=b"small too")["ETag"]
    with pytest.raises(ClientError) as exc:
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="k",
            UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]},
        )
    assert _code(exc) == ("EntityTooSmall", 400)
    with pytest.raises(ClientError) as exc:
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="k",
            UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": e2}, {"PartNumber": 1, "ETag": e1}]},
        )
    assert _code(exc) == ("InvalidPartOrder", 400)
    with pytest.raises(ClientError) as exc:
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="k",
            UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"0123456789abcdef0123456789abcdef"'}]},
        )
    assert _code(exc) == ("InvalidPart", 400)
    with pytest.raises(ClientError) as exc:
        s3.upload_part(Bucket=bucket, Key="k", UploadId="no-such-upload", PartNumber=1, Body=b"x")
    assert _code(exc) == ("NoSuchUpload", 404)
    s3.abort_multipart_upload(Bucket=bucket, Key="k", UploadId=uid)
    with pytest.raises(ClientError) as exc:
        s3.list_parts(Bucket=bucket, Key="k", UploadId=uid)
    assert _code(exc) == ("NoSuchUpload", 404)
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


def test_copy_object_and_upload_part_copy(proxy: RunningProxy, bucket: str) -> None:
    s3 = proxy.client()
    data = os.urandom(600_000)
    s3.put_object(Bucket=bucket, Key="src", Body=data, Metadata={"a": "1"}, ContentType="x/y")
    s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"})
    head = s3.head_object(Bucket=bucket, Key="dst")
    assert head["Metadata"] == {"a": "1"} and head["ContentType"] == "x/y"
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == data
    s3.copy_object(
        Bucket=bucket,
        Key="src",
        CopySource={"Bucket": bucket, "Key": "src"},
        MetadataDirective="REPLACE",
        Metadata={"b": "2"},
        ContentType="z/w",
    )
    head = s3.head_object(Bucket=bucket, Key="src")
    assert head["Metadata"] == {"b": "2"} and head["ContentType"] == "z/w"
    assert s3.get_object(Bucket=bucket, Key="src")["Body"].read() == data
    uid = s3.create_multipart_upload(Bucket=bucket, Key="joined")["UploadId"]
    big = os.urandom(5 * 1024 * 1024 + 17)
    s3.put_object(Bucket=bucket, Key="big", Body=big)
    p1 = s3.upload_part_copy(
        Bucket=bucket, Key="joined", UploadId=uid, PartNumber=1, CopySource={"Bucket": bucket, "Key": "big"}
    )["CopyPartResult"]["ETag"]
    p2 = s3.upload_part_copy(
        Bucket=bucket,
        Key="joined",
        UploadId=uid,
        PartNumber=2,
        CopySource={"Bucket": bucket, "Key": "src"},
        CopySourceRange="bytes=100-199",
    )["CopyPartResult"]["ETag"]
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="joined",
        UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": p1}, {"PartNumber": 2, "ETag": p2}]},
    )
    assert s3.get_object(Bucket=bucket, Key="joined")["Body"].read() == big + data[100:200]


def test_delete_objects_and_missing(proxy: RunningProxy, bucket: str) -> None:
    s3 = proxy.client()
    for k in ("a", "b", "c"):
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    res = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "a"}, {"Key": "b"}, {"Key": "zz"}]})
    assert sorted(d["Key"] for d in res["Deleted"]) == ["a", "b", "zz"]
    s3.delete_object(Bucket=bucket, Key="c")
    s3.delete_object(Bucket=bucket, Key="c")  # idempotent, like S3
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="a")
    assert _code(exc) == ("NoSuchKey", 404)
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key="a")
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket + "-missing", Key="a")
    assert _code(exc) == ("NoSuchBucket", 404)


def test_buckets(proxy: RunningProxy, bucket: str) -> None:
    s3 = proxy.client()
    assert bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    s3.head_bucket(Bucket=bucket)
    assert s3.get_bucket_location(Bucket=bucket).get("LocationConstraint") in (None, "")
    assert "Status" not in s3.get_bucket_versioning(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="x", Body=b"1")
    with pytest.raises(ClientError) as exc:
        s3.delete_bucket(Bucket=bucket)
    assert _code(exc) == ("BucketNotEmpty", 409)
    s3.delete_object(Bucket=bucket, Key="x")
    s3.delete_bucket(Bucket=bucket)
    with pytest.raises(ClientError) as exc:
        s3.head_bucket(Bucket=bucket)
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_conditional_requests(proxy: RunningProxy, bucket: str) -> None:
    s3 = proxy.client()
    etag = s3.put_object(Bucket=bucket, Key="c", Body=b"conditional")["ETag"]
    assert s3.get_object(Bucket=bucket, Key="c", IfMatch=etag)["Body"].read() == b"conditional"
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="c", IfMatch='"00000000000000000000000000000000"')
    assert _code(exc) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="c", IfNoneMatch=etag)
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
    future = datetime.now(UTC) + timedelta(days=1)
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="c", IfModifiedSince=future)
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="c", IfUnmodifiedSince=datetime(2000, 1, 1, tzinfo=UTC))
    assert _code(exc) == ("PreconditionFailed", 412)


def test_content_md5_and_checksums(proxy: RunningProxy, bucket: str) -> None:
    import base64

    s3 = proxy.client()
    body = b"digest me" * 1000
    good = base64.b64encode(hashlib.md5(body).digest()).decode()
    s3.put_object(Bucket=bucket, Key="m", Body=body, ContentMD5=good)
    bad = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="m2", Body=body, ContentMD5=bad)
    assert _code(exc) == ("BadDigest", 400)
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="m2")  # nothing stored
    for algorithm in ("CRC32", "CRC32C", "SHA1", "SHA256", "CRC64NVME"):
        put = s3.put_object(Bucket=bucket, Key=f"ck-{algorithm}", Body=body, ChecksumAlgorithm=algorithm)
        assert put.get(f"Checksum{algorithm}"), algorithm
        assert s3.get_object(Bucket=bucket, Key=f"ck-{algorithm}")["Body"].read() == body


# SeaweedFS stores keys as file paths and refuses a 1024-byte name; keys it would fold or resolve
# (slashes, dot segments) reach it escaped, so they round-trip like any other.
SEAWEED_REFUSES = {"k" * 1024}


@pytest.mark.parametrize(
    "key",
    [
        "a/../../etc/passwd",
        "..",
        "./x",
        "spaces and %25 percent",
        "unicodé/ключ/鍵",
        "//double//slash",
        "/leading",
        "a//b",
        ".tsproxy/mpu/looks-internal",
        ".tsproxy~escaped-looking",
        "a/./b/../c",
        "k" * 1024,
    ],
)
def test_odd_keys_roundtrip(proxy: RunningProxy, bucket: str, key: str) -> None:
    s3 = proxy.client()
    if not proxy.cfg.local_backend and key in SEAWEED_REFUSES:
        # tsproxy passes SeaweedFS's clean 4xx on.
        with pytest.raises(ClientError) as exc:
            s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
        assert 400 <= exc.value.response["ResponseMetadata"]["HTTPStatusCode"] < 500
        return
    s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == key.encode()
    assert key in [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]


def test_too_long_key(proxy: RunningProxy, bucket: str) -> None:
    with pytest.raises(ClientError) as exc:
        proxy.client().put_object(Bucket=bucket, Key="k" * 1025, Body=b"x")
    assert _code(exc) == ("KeyTooLongError", 400)


def test_upload_fileobj_streams(proxy: RunningProxy, bucket: str) -> None:
    # boto3's managed transfer: multipart with 8 MiB parts uploaded by several threads at once.
    s3 = proxy.client()
    data = os.urandom(20 * 1024 * 1024 + 5)
    s3.upload_fileobj(io.BytesIO(data), bucket, "managed")
    out = io.BytesIO()
    s3.download_fileobj(bucket, "managed", out)
    assert out.getvalue() == data


def test_slow_completion_keeps_the_connection_alive(
    proxy: RunningProxy, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A completion that takes a while answers 200 early, as S3 does; boto3 must read the result."""
    from tsproxy.server import multipart

    monkeypatch.setattr(multipart, "COMPLETE_KEEPALIVE_AFTER", 0.0)
    s3 = proxy.client()
    parts = [os.urandom(5 * 1024 * 1024), b"end"]
    uid = s3.create_multipart_upload(Bucket=bucket, Key="slow")["UploadId"]
    etags = [
        s3.upload_part(Bucket=bucket, Key="slow", UploadId=uid, PartNumber=n, Body=p)["ETag"]
        for n, p in enumerate(parts, 1)
    ]
    done = s3.complete_multipart_upload(
        Bucket=bucket,
        Key="slow",
        UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]},
    )
    assert done["ETag"].endswith('-2"')
    assert s3.get_object(Bucket=bucket, Key="slow")["Body"].read() == b"".join(parts)
    with pytest.raises(ClientError) as exc:  # an error found late arrives inside the 200, as S3 sends it
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="slow",
            UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etags[0]}]},
        )
    assert _code(exc)[0] == "NoSuchUpload"


def test_unsatisfiable_range_names_the_size(proxy: RunningProxy, bucket: str) -> None:
    s3 = proxy.client()
    s3.put_object(Bucket=bucket, Key="r", Body=b"0123456789")
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="r", Range="bytes=20-30")
    assert _code(exc) == ("InvalidRange", 416)
    assert exc.value.response["ResponseMetadata"]["HTTPHeaders"]["content-range"] == "bytes */10"
