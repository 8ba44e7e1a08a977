"""Finding 1 of issue 31: keys a backend folds must not alias other keys nor reach tsproxy's state.

SeaweedFS stores `\\` as `/` (and then folds the `//` or leading `/` that makes), so before keys holding
one were escaped, `GET /bucket/%5C.tsproxy/mpu/<id>/state` read a multipart upload's state, a PUT there
broke the upload after a restart, a DELETE dropped it, `\\report.csv` overwrote `report.csv`, and in
mapped mode deleting `\\.tsproxy/bucket` made the bucket vanish.

Two kinds of test: the exact attacks, through tsproxy on a real SeaweedFS (plain and mapped mode); and
an alias search that first *measures* what SeaweedFS folds or refuses, over a broad set of characters
and sequences in several positions, then checks that the namespace escapes every such key and that
every key of the set, written through tsproxy on each backend, reads back as itself.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.support.seaweed import SeaweedFS
from tsproxy.service.namespace import FOLDED, backend_name, stored_as_is
from tsproxy.store.s3 import S3Backend

pytestmark = pytest.mark.seaweed


def _code(call: Callable[..., Any], **params: Any) -> tuple[int, str]:
    with pytest.raises(ClientError) as exc:
        call(**params)
    err = exc.value.response
    return err["ResponseMetadata"]["HTTPStatusCode"], err["Error"]["Code"]


def _backend_names(weed: SeaweedFS, bucket: str, prefix: str) -> list[str]:
    listed = weed.boto3_client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for o in listed.get("Contents", [])]


@pytest.fixture(params=["plain", "mapped"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_backslash_spellings_of_an_upload_state_reach_nothing(
    seaweed: SeaweedFS, restartable: Any, mode: str
) -> None:
    settings = {"upload_records": "eager"}  # the state object is written at once, not when idle
    if mode == "mapped":
        settings["backend_bucket"] = seaweed.new_bucket("shared")
    proxy = restartable("seaweed", **settings)
    s3 = proxy.client()
    bucket = f"h-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="segment.log")["UploadId"]
    part = os.urandom(70_000)
    etag = s3.upload_part(Bucket=bucket, Key="segment.log", UploadId=upload_id, PartNumber=1, Body=part)[
        "ETag"
    ]

    # The upload's state as the backend holds it, found the way a neighbour with read access would.
    backend_bucket = settings.get("backend_bucket", bucket)
    root = f"{bucket}/" if mode == "mapped" else ""
    states = [
        k for k in _backend_names(seaweed, backend_bucket, root + ".tsproxy/mpu/") if k.endswith("/state")
    ]
    assert len(states) == 1, states
    state_before = seaweed.boto3_client().get_object(Bucket=backend_bucket, Key=states[0])["Body"].read()
    inner = states[0][len(root) :]  # ".tsproxy/mpu/<name>/state"

    for spelling in ("\\" + inner, "\\\\" + inner, "a\\..\\" + inner, "\\/" + inner):
        assert _code(s3.get_object, Bucket=bucket, Key=spelling) == (404, "NoSuchKey")
        assert _code(s3.head_object, Bucket=bucket, Key=spelling)[0] == 404
        # A PUT is a client object of its own, readable as written; a DELETE removes only that.
        s3.put_object(Bucket=bucket, Key=spelling, Body=b"not a state")
        assert s3.get_object(Bucket=bucket, Key=spelling)["Body"].read() == b"not a state"
        s3.delete_object(Bucket=bucket, Key=spelling)
        assert _code(s3.get_object, Bucket=bucket, Key=spelling) == (404, "NoSuchKey")
    s3.put_object(Bucket=bucket, Key="\\" + inner, Body=b"planted over the state")
    assert (
        seaweed.boto3_client().get_object(Bucket=backend_bucket, Key=states[0])["Body"].read() == state_before
    )

    # After a restart (state read back from the backend) the upload is whole and completes.
    proxy.restart()
    s3 = proxy.client()
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [(u["Key"], u["UploadId"]) for u in uploads] == [("segment.log", upload_id)]
    parts = s3.list_parts(Bucket=bucket, Key="segment.log", UploadId=upload_id)["Parts"]
    assert [(p["PartNumber"], p["ETag"]) for p in parts] == [(1, etag)]
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="segment.log",
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
    )
    assert s3.get_object(Bucket=bucket, Key="segment.log")["Body"].read() == part
    assert s3.get_object(Bucket=bucket, Key="\\" + inner)["Body"].read() == b"planted over the state"


def test_a_backslash_does_not_alias_a_key(seaweed: SeaweedFS, restartable: Any, mode: str) -> None:
    settings: dict[str, str] = {}
    if mode == "mapped":
        settings["backend_bucket"] = seaweed.new_bucket("shared")
    s3 = restartable("seaweed", **settings).client()
    bucket = f"h-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    bodies = {
        "report.csv": b"the real report",
        "\\report.csv": b"a lookalike",
        "dir\\report.csv": b"a flat name",
        "dir/report.csv": b"a nested name",
        "trailing\\": b"not a directory",
    }
    for key, body in bodies.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    for key, body in bodies.items():
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body, key
    listed = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])}
    assert listed == set(bodies)
    # Listings by a prefix or delimiter holding `\\` are S3's, not the folded backend's.
    for prefix, delimiter in [("dir\\", ""), ("\\", ""), ("", "\\"), ("dir", "\\"), ("dir\\", "/")]:
        page = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, Delimiter=delimiter)
        got = (
            {o["Key"] for o in page.get("Contents", [])},
            {p["Prefix"] for p in page.get("CommonPrefixes", [])},
        )
        assert got == _s3_listing(set(bodies), prefix, delimiter), (prefix, delimiter)
    s3.delete_object(Bucket=bucket, Key="\\report.csv")
    assert s3.get_object(Bucket=bucket, Key="report.csv")["Body"].read() == b"the real report"


def _s3_listing(keys: set[str], prefix: str, delimiter: str) -> tuple[set[str], set[str]]:
    """What S3 lists: keys under the prefix, those with the delimiter past it rolled into prefixes."""
    objects, prefixes = set(), set()
    for key in keys:
        if not key.startswith(prefix):
            continue
        cut = key.find(delimiter, len(prefix)) if delimiter else -1
        if cut < 0:
            objects.add(key)
        else:
            prefixes.add(key[: cut + len(delimiter)])
    return objects, prefixes


def test_mapped_mode_bucket_marker_cannot_be_deleted_by_a_backslash(
    seaweed: SeaweedFS, restartable: Any
) -> None:
    shared = seaweed.new_bucket("shared")
    proxy = restartable("seaweed", backend_bucket=shared)
    s3 = proxy.client()
    bucket = f"h-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    marker = f"{bucket}/.tsproxy/bucket"
    assert marker in _backend_names(seaweed, shared, bucket + "/")
    for spelling in ("\\.tsproxy/bucket", "\\\\.tsproxy/bucket", "\\/.tsproxy/bucket"):
        s3.delete_object(Bucket=bucket, Key=spelling)
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": spelling}]})
    assert marker in _backend_names(seaweed, shared, bucket + "/")
    s3.head_bucket(Bucket=bucket)
    proxy.restart()
    proxy.client().head_bucket(Bucket=bucket)
    assert bucket in {b["Name"] for b in proxy.client().list_buckets()["Buckets"]}


# -- the alias search --------------------------------------------------------------------------------

# Every ASCII character that is not a letter or digit, the C1 controls' ends, and Unicode characters
# that look like or normalise to slashes, dots, spaces or letters (NFC/NFKC, case folding, invisibles).
CANDIDATES = [chr(c) for c in range(0x80) if not chr(c).isalnum()] + [
    "\u0080", "\u0085", "\u009f", "\u00a0", "\u00ad", "\u0130", "\u0301", "\u180e", "\u2000", "\u200b",
    "\u2024", "\u2028", "\u2029", "\u202e", "\u2044", "\u212a", "\u2215", "\u29f5", "\u29f9", "\u3000",
    "\ufdd0", "\ufe68", "\ufeff", "\uff0e", "\uff0f", "\uff3c", "\ufffd", "\ufffe", "\uffff", "\U0001f600",
    "A",
]  # fmt: skip
SEQUENCES = ["./", "/.", "..", "../", "/..", "\\\\", "\\.", "\\..\\", "%2F", "%5C", "%00", "\r\n", " /", "/ "]


def _shapes(s: str) -> list[str]:
    """A candidate in the middle of a name, at its start and end, as a whole segment and a last segment."""
    return ["a" + s + "b", s + "b", "a" + s, "a/" + s + "/b", "a/" + s]


async def _survey(weed: SeaweedFS, keys: list[str]) -> tuple[dict[str, list[str]], set[str]]:
    """Each key written straight into SeaweedFS under a prefix of its own, then listed: the names it was
    stored under when that is not the key itself (folded), and the keys it refused."""
    backend = S3Backend(**weed.backend_options(backoff_base=0.005, backoff_cap=0.05))
    await backend.start()
    bucket = weed.new_bucket("survey")
    folded: dict[str, list[str]] = {}
    refused: set[str] = set()
    try:

        async def one(n: int, key: str) -> None:
            prefix = f"k{n:04d}/"
            try:
                await backend.put(bucket, prefix + key, b"x")
            except Exception:
                refused.add(key)
                return
            page = await backend.list(bucket, prefix=f"k{n:04d}")
            names = [o.key for o in page.objects]
            if names != [prefix + key]:
                folded[key] = [n[len(prefix) :] if n.startswith(prefix) else n for n in names]
            for name in names:
                await backend.delete(bucket, name)

        lanes = asyncio.Semaphore(8)

        async def bounded(n: int, key: str) -> None:
            async with lanes:
                await one(n, key)

        await asyncio.gather(*(bounded(n, k) for n, k in enumerate(keys)))
    finally:
        await backend.close()
        weed.remove_bucket(bucket)
    return folded, refused


def _survey_keys() -> list[str]:
    return sorted({k for s in CANDIDATES + SEQUENCES for k in _shapes(s)})


def test_every_key_seaweedfs_folds_or_refuses_is_escaped(seaweed: SeaweedFS) -> None:
    keys = _survey_keys()
    folded, refused = asyncio.run(_survey(seaweed, keys))
    # The survey must see the folds this suite exists for, or it is not measuring anything.
    assert folded.get("a\\b") == ["a/b"], folded
    assert "a/./b" in refused or "a/./b" in folded
    assert all(stored_as_is(k) is False for k in [*folded, *refused]), {
        k: v for k, v in folded.items() if stored_as_is(k)
    } | {k: "refused" for k in refused if stored_as_is(k)}
    # Every character the namespace escapes is one a backend folds or refuses (none escaped idly).
    assert all(f"a{ch}b" in folded or f"a{ch}b" in refused for ch in FOLDED)
    # And every backend name the mapping gives is stored by SeaweedFS as exactly itself.
    names = sorted({backend_name(k) for k in keys})
    folded_names, refused_names = asyncio.run(_survey(seaweed, names))
    assert folded_names == {} and refused_names == set()


@pytest.mark.parametrize("kind", ["local", "seaweed"])
def test_the_survey_keys_stay_apart_through_tsproxy(restartable: Any, kind: str) -> None:
    """Every survey key, plus the reserved names spelled with each candidate in front, written through
    tsproxy with a body of its own: each reads back its own body and the listing is exactly the set."""
    s3 = restartable(kind).client()
    bucket = f"h-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="held.log")["UploadId"]
    keys = _survey_keys() + [s + ".tsproxy/bucket" for s in CANDIDATES + SEQUENCES] + ["b", "a", "a/b", "a/"]
    keys = list(dict.fromkeys(keys))
    if kind == "seaweed":
        # SeaweedFS keeps keys as file paths: a key cannot be both an object and a directory of others,
        # whatever tsproxy does. Leave out the keys whose backend name is a directory of another's.
        names = {backend_name(k) for k in keys}
        keys = [k for k in keys if not backend_name(k).endswith("/")]
        keys = [k for k in keys if not any(n.startswith(backend_name(k) + "/") for n in names)]
    bodies = {k: f"{n}:{k!r}".encode() for n, k in enumerate(keys)}

    def put_all() -> None:
        for k, body in bodies.items():
            s3.put_object(Bucket=bucket, Key=k, Body=body)

    put_all()
    wrong = {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}
    assert {k: v for k, v in wrong.items() if v != bodies[k]} == {}
    listed: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        listed += [o["Key"] for o in page.get("Contents", [])]
    assert sorted(listed) == sorted(keys)
    # The upload in progress is untouched.
    assert [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])] == [upload_id]
