"""Listings through a fresh instance use the size catalog other instances wrote, and are right regardless.

Two real tsproxy servers share one backend (SeaweedFS, and the local directory): the writer stores
objects of many sizes and stops (its stop flushes the catalog), then a fresh reader with empty caches lists
them. Every size and ETag must be what was written, with far fewer backend requests than one HEAD per
object; an overwrite by another instance, a delete and a passthrough object are listed right too.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from pathlib import Path

import pytest

from tests.server.conftest import backend_requests, start_proxy, write_straight_to_backend
from tests.server.harness import RunningProxy
from tsproxy.service.namespace import INTERNAL

COUNT = 40


def _listing(proxy: RunningProxy, bucket: str) -> dict[str, tuple[int, str]]:
    s3 = proxy.client()
    listed: dict[str, tuple[int, str]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, PaginationConfig={"PageSize": 15}
    ):
        for o in page.get("Contents", []):
            listed[o["Key"]] = (o["Size"], o["ETag"].strip('"'))
    return listed


@pytest.fixture(params=["local", "seaweed"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _instance(kind: str, tmp: Path, request: pytest.FixtureRequest, name: str) -> RunningProxy:
    # One backend and key ring, a cache of its own: another instance, as after a reschedule.
    # No janitor: its sweep would add requests to the count this test makes.
    return start_proxy(kind, tmp, request, cache_dir=str(tmp / f"cache-{name}"), janitor_interval="0")


def test_fresh_instance_lists_what_others_wrote_without_a_head_each(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    writer = _instance(kind, tmp_path, request, "writer")
    expected: dict[str, tuple[int, str]] = {}
    try:
        s3 = writer.client()
        s3.create_bucket(Bucket=bucket)
        for i in range(COUNT):
            body = os.urandom(i * 997 % 5000 + (300_000 if i % 10 == 0 else 0))
            s3.put_object(Bucket=bucket, Key=f"seg/{i:04d}.log", Body=body)
            expected[f"seg/{i:04d}.log"] = (len(body), hashlib.md5(body).hexdigest())
        # A multipart object: its ETag is not an MD5 of the body.
        uid = s3.create_multipart_upload(Bucket=bucket, Key="big/mp.bin")["UploadId"]
        parts = [os.urandom(5 << 20), os.urandom(1234)]
        etags = [
            s3.upload_part(Bucket=bucket, Key="big/mp.bin", UploadId=uid, PartNumber=n + 1, Body=p)["ETag"]
            for n, p in enumerate(parts)
        ]
        done = s3.complete_multipart_upload(
            Bucket=bucket,
            Key="big/mp.bin",
            UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": n + 1, "ETag": e} for n, e in enumerate(etags)]},
        )
        expected["big/mp.bin"] = (sum(map(len, parts)), done["ETag"].strip('"'))
        s3.delete_object(Bucket=bucket, Key="seg/0003.log")
        del expected["seg/0003.log"]
    finally:
        writer.stop()  # flushes the catalog

    reader = _instance(kind, tmp_path, request, "reader")
    try:
        before = backend_requests(reader)
        heads_before = backend_requests(reader, "HeadObject")
        assert _listing(reader, bucket) == expected
        requests = backend_requests(reader) - before
        heads = backend_requests(reader, "HeadObject") - heads_before
        assert heads == 0, f"{heads} HEADs for objects the catalog describes"
        # List pages (3) plus the catalog's own LIST and GETs and a bucket check: a small constant.
        assert requests <= 12, requests
    finally:
        reader.stop()


def test_listing_is_right_whatever_the_catalog_missed(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Overwrites not yet in any catalog, deletes and objects tsproxy never wrote fall back to a HEAD."""
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    first = _instance(kind, tmp_path, request, "first")
    try:
        s3 = first.client()
        s3.create_bucket(Bucket=bucket)
        for i in range(6):
            s3.put_object(Bucket=bucket, Key=f"k{i}", Body=b"x" * (100 + i))
    finally:
        first.stop()
    second = _instance(kind, tmp_path, request, "second")
    reader = _instance(kind, tmp_path, request, "reader")
    try:
        s3 = second.client()
        s3.put_object(Bucket=bucket, Key="k1", Body=b"overwritten by another instance")
        s3.delete_object(Bucket=bucket, Key="k2")
        # Neither is flushed yet (second is still running with a 5 s interval): the reader cannot know.
        write_straight_to_backend(kind, tmp_path, request, bucket, {"raw/outside": b"written past tsproxy"})
        listed = _listing(reader, bucket)
        assert listed["k1"] == (31, hashlib.md5(b"overwritten by another instance").hexdigest())
        assert "k2" not in listed
        assert listed["k0"] == (100, hashlib.md5(b"x" * 100).hexdigest())
        assert listed["raw/outside"] == (20, hashlib.md5(b"written past tsproxy").hexdigest())
        assert not any(k.startswith(INTERNAL) for k in listed)
    finally:
        second.stop()
        reader.stop()


def _head_view(response: dict) -> tuple:
    return (
        response["ContentLength"],
        response["ETag"],
        response["ContentType"],
        response.get("Metadata"),
        response.get("CacheControl"),
        response.get("ContentDisposition"),
        response["LastModified"],
    )


def test_a_head_the_catalog_describes_reads_no_tail(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """After a listing loaded the catalog, HEAD costs one backend HEAD and shows what the tail would."""
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    big = os.urandom(3 << 20)
    writer = _instance(kind, tmp_path, request, "writer")
    try:
        s3 = writer.client()
        s3.create_bucket(Bucket=bucket)
        s3.put_object(
            Bucket=bucket, Key="seg/big.log", Body=big, ContentType="application/x-kafka-segment",
            Metadata={"topic": "orders", "partition": "7"}, CacheControl="no-cache",
            ContentDisposition="attachment",
        )  # fmt: skip
        s3.put_object(Bucket=bucket, Key="seg/plain.log", Body=b"p" * 5000)
        s3.put_object(Bucket=bucket, Key="seg/changed.log", Body=b"before")
    finally:
        writer.stop()
    other = _instance(kind, tmp_path, request, "other")
    reader = _instance(kind, tmp_path, request, "reader")
    try:
        other.client().put_object(
            Bucket=bucket, Key="seg/changed.log", Body=b"after, elsewhere"
        )  # not flushed
        _listing(reader, bucket)  # loads the catalog
        s3 = reader.client()
        gets, heads = backend_requests(reader, "GetObject"), backend_requests(reader, "HeadObject")
        views = {k: s3.head_object(Bucket=bucket, Key=k) for k in ("seg/big.log", "seg/plain.log")}
        assert backend_requests(reader, "GetObject") == gets, "a HEAD the catalog describes read a tail"
        assert backend_requests(reader, "HeadObject") == heads + 2
        big_view = views["seg/big.log"]
        assert big_view["ContentLength"] == len(big)
        assert big_view["ETag"].strip('"') == hashlib.md5(big).hexdigest()
        assert big_view["Metadata"] == {"topic": "orders", "partition": "7"}
        assert big_view["ContentType"] == "application/x-kafka-segment"
        assert views["seg/plain.log"]["ContentLength"] == 5000
        # The same HEADs answered from the objects' own tails (a fresh instance with no catalog loaded).
        fresh = _instance(kind, tmp_path, request, "fresh")
        try:
            for key, view in views.items():
                assert _head_view(fresh.client().head_object(Bucket=bucket, Key=key)) == _head_view(view)
        finally:
            fresh.stop()
        # An overwrite the catalog has not heard of is answered from the new object's tail.
        changed = s3.head_object(Bucket=bucket, Key="seg/changed.log")
        assert changed["ContentLength"] == len(b"after, elsewhere")
        assert changed["ETag"].strip('"') == hashlib.md5(b"after, elsewhere").hexdigest()
        # A HEAD never makes a later GET of the same object wrong.
        assert s3.get_object(Bucket=bucket, Key="seg/big.log")["Body"].read() == big
        other.client().delete_object(Bucket=bucket, Key="seg/plain.log")
        with pytest.raises(s3.exceptions.ClientError) as e:
            s3.head_object(Bucket=bucket, Key="seg/plain.log")
        assert e.value.response["Error"]["Code"] == "404"
    finally:
        other.stop()
        reader.stop()


def test_a_first_head_loads_the_catalog_for_the_next_ones(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """No listing needed: the first HEAD in a bucket reads a tail and starts loading the catalog."""
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    writer = _instance(kind, tmp_path, request, "writer")
    try:
        s3 = writer.client()
        s3.create_bucket(Bucket=bucket)
        for i in range(3):
            s3.put_object(Bucket=bucket, Key=f"seg/{i}.log", Body=os.urandom(100_000))
    finally:
        writer.stop()
    reader = _instance(kind, tmp_path, request, "reader")
    try:
        s3 = reader.client()
        assert s3.head_object(Bucket=bucket, Key="seg/0.log")["ContentLength"] == 100_000
        catalog = reader.proxy.catalog
        assert catalog is not None
        deadline = time.monotonic() + 10
        while (index := catalog.cached(bucket)) is None or "seg/1.log" not in index:
            assert time.monotonic() < deadline, "the catalog was not loaded"
            time.sleep(0.02)
        gets = backend_requests(reader, "GetObject")
        assert s3.head_object(Bucket=bucket, Key="seg/1.log")["ContentLength"] == 100_000
        assert s3.head_object(Bucket=bucket, Key="seg/2.log")["ContentLength"] == 100_000
        assert backend_requests(reader, "GetObject") == gets
    finally:
        reader.stop()
