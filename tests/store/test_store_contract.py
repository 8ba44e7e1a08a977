"""The contract every backend keeps, run against the local directory backend and a real SeaweedFS.

Where SeaweedFS departs from S3 (see the listing tests), the keys used here stay clear of the
difference; the exact S3 listing semantics are checked against a reference model for the local
backend in test_store_local.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from tsproxy import errors
from tsproxy.store.base import MIB, Backend, ListPage, multipart_etag, multipart_of

MD5_ETAG = re.compile(r"[0-9a-f]{32}")
MULTIPART_ETAG = re.compile(r"[0-9a-f]{32}-\d+")


async def pieces(data: bytes, size: int) -> AsyncIterator[bytes]:
    """`data` as a stream of `size`-byte pieces (the last shorter)."""
    for i in range(0, len(data), size):
        yield data[i : i + size]
        await asyncio.sleep(0)


async def failing(data: bytes, size: int, fail_after: int) -> AsyncIterator[bytes]:
    """A stream that raises after yielding `fail_after` bytes (a client that went away)."""
    sent = 0
    async for piece in pieces(data, size):
        if sent >= fail_after:
            raise ConnectionResetError("client went away")
        yield piece
        sent += len(piece)
    raise ConnectionResetError("client went away at the end")


async def read_all(backend: Backend, bucket: str, key: str) -> bytes:
    return (await backend.get_bytes(bucket, key))[1]


async def list_all(backend: Backend, bucket: str, **kwargs: object) -> tuple[list[str], list[str], int]:
    """Every key and common prefix over all pages, and the number of pages."""
    keys: list[str] = []
    prefixes: list[str] = []
    token = None
    pages = 0
    while True:
        page: ListPage = await backend.list(bucket, token=token, **kwargs)  # type: ignore[arg-type]
        pages += 1
        keys += [o.key for o in page.objects]
        prefixes += page.common_prefixes
        if not page.is_truncated:
            return keys, prefixes, pages
        assert page.next_token, "a truncated page must say where to go on"
        token = page.next_token


def utf8_sorted(keys: list[str]) -> list[str]:
    return sorted(keys, key=lambda k: k.encode("utf-8"))


# -- buckets -------------------------------------------------------------------------------------------


async def test_bucket_lifecycle(backend: Backend) -> None:
    name = f"life-{os.urandom(6).hex()}"
    with pytest.raises(errors.NoSuchBucket):
        await backend.head_bucket(name)
    await backend.create_bucket(name)
    await backend.head_bucket(name)
    assert name in [b for b, _ in await backend.list_buckets()]
    created = dict(await backend.list_buckets())[name]
    assert created.tzinfo is not None and abs(created - datetime.now(UTC)) < timedelta(hours=1)
    with pytest.raises(errors.BucketAlreadyOwnedByYou):
        await backend.create_bucket(name)
    await backend.put(name, "k", b"x")
    with pytest.raises(errors.BucketNotEmpty):
        await backend.delete_bucket(name)
    await backend.delete(name, "k")
    await backend.delete_bucket(name)
    with pytest.raises(errors.NoSuchBucket):
        await backend.head_bucket(name)
    assert name not in [b for b, _ in await backend.list_buckets()]


async def test_missing_bucket_is_no_such_bucket(backend: Backend) -> None:
    missing = f"missing-{os.urandom(6).hex()}"
    with pytest.raises(errors.NoSuchBucket):
        await backend.put(missing, "k", b"x")
    with pytest.raises(errors.NoSuchBucket):
        await backend.get_bytes(missing, "k")
    with pytest.raises(errors.NoSuchBucket):
        await backend.list(missing)
    with pytest.raises(errors.NoSuchBucket):
        await backend.delete_bucket(missing)
    # A HEAD answer has no body: S3 stores can only say 404, so either error is right.
    with pytest.raises((errors.NoSuchKey, errors.NoSuchBucket)):
        await backend.head(missing, "k")


async def test_ping(backend: Backend) -> None:
    await backend.ping()


# -- put, head, get ------------------------------------------------------------------------------------


async def test_put_small_with_metadata(backend: Backend, bucket: str) -> None:
    data = b"hello, tiered world"
    info = await backend.put(
        bucket,
        "dir/obj",
        data,
        metadata={"Tsproxy-Format": "1", "x-amz-meta-other": "v"},
        content_type="text/x-test",
    )
    assert info.key == "dir/obj" and info.size == len(data)
    assert info.etag == hashlib.md5(data).hexdigest()
    head = await backend.head(bucket, "dir/obj")
    assert head.size == len(data) and head.etag == info.etag
    assert head.metadata == {"tsproxy-format": "1", "other": "v"}
    assert head.content_type == "text/x-test"
    assert head.last_modified.tzinfo is not None
    assert abs(head.last_modified - datetime.now(UTC)) < timedelta(minutes=5)
    got_info, got = await backend.get_bytes(bucket, "dir/obj")
    assert got == data and got_info.metadata == head.metadata and got_info.etag == info.etag


@pytest.mark.parametrize("as_stream", [False, True], ids=["bytes", "stream"])
async def test_put_empty_object(backend: Backend, bucket: str, as_stream: bool) -> None:
    body = pieces(b"", 1) if as_stream else b""
    info = await backend.put(bucket, "empty", body)
    assert info.size == 0 and info.etag == hashlib.md5(b"").hexdigest()
    assert (await backend.head(bucket, "empty")).size == 0
    reader = await backend.get(bucket, "empty")
    async with reader:
        assert reader.content_range is None
        assert [p async for p in reader] == []
    # No byte of an empty object can be asked for.
    for first, last in ((0, None), (0, 0), (-1, None)):
        with pytest.raises(errors.InvalidRange):
            await backend.get_bytes(bucket, "empty", first, last)


async def test_streamed_30_mib_object(backend: Backend, bucket: str) -> None:
    data = random.Random(30).randbytes(30 * MIB)
    # Odd piece sizes, so parts never line up with pieces.
    info = await backend.put(bucket, "big", pieces(data, MIB + 7), metadata={"k": "v"})
    assert info.size == len(data)
    assert MD5_ETAG.fullmatch(info.etag) or MULTIPART_ETAG.fullmatch(info.etag)
    head = await backend.head(bucket, "big")
    assert head.size == len(data) and head.etag == info.etag and head.metadata == {"k": "v"}
    digest = hashlib.sha256()
    largest = 0
    async with await backend.get(bucket, "big") as reader:
        async for piece in reader:
            largest = max(largest, len(piece))
            digest.update(piece)
    assert digest.digest() == hashlib.sha256(data).digest()
    assert largest <= 4 * MIB, "a body is read in bounded pieces"
    # A range across what would be a part boundary in an S3 multipart upload.
    _, middle = await backend.get_bytes(bucket, "big", 25 * MIB - 100, 25 * MIB + 99)
    assert middle == data[25 * MIB - 100 : 25 * MIB + 100]


@pytest.mark.parametrize("as_stream", [False, True], ids=["bytes", "stream"])
async def test_a_writer_s_content_md5_is_checked_not_trusted(
    backend: Backend, bucket: str, as_stream: bool
) -> None:
    """A body's MD5 from its writer spares the backend hashing it, and the store still checks it: the
    right one stores the body (its ETag is that MD5), a wrong one stores nothing (BadDigest)."""
    data = os.urandom(3 * MIB + 5)
    good, bad = hashlib.md5(data).digest(), hashlib.md5(data + b"x").digest()

    def body() -> bytes | AsyncIterator[bytes]:
        return pieces(data, MIB) if as_stream else data

    with pytest.raises(errors.BadDigest):
        await backend.put(bucket, "k", body(), content_md5=(lambda: bad) if as_stream else bad)
    with pytest.raises(errors.NoSuchKey):
        await backend.head(bucket, "k")
    info = await backend.put(bucket, "k", body(), content_md5=(lambda: good) if as_stream else good)
    assert info.etag == good.hex() and await read_all(backend, bucket, "k") == data

    multipart = multipart_of(backend)
    upload = await multipart.create_multipart(bucket, "mp")
    with pytest.raises(errors.BadDigest):
        await multipart.upload_part(bucket, "mp", upload, 1, data, content_md5=bad)
    etag = await multipart.upload_part(bucket, "mp", upload, 1, data, content_md5=good)
    assert etag == good.hex()
    done = await multipart.complete_multipart(bucket, "mp", upload, [(1, etag)])
    assert done.etag == multipart_etag([etag]) and await read_all(backend, bucket, "mp") == data


async def test_overwrite_replaces_whole_object(backend: Backend, bucket: str) -> None:
    await backend.put(bucket, "k", b"first version", metadata={"v": "1"})
    second = await backend.put(bucket, "k", b"2nd", metadata={"v": "2"})
    info, data = await backend.get_bytes(bucket, "k")
    assert data == b"2nd" and info.metadata == {"v": "2"} and info.etag == second.etag


async def test_missing_key(backend: Backend, bucket: str) -> None:
    with pytest.raises(errors.NoSuchKey):
        await backend.head(bucket, "nope")
    with pytest.raises(errors.NoSuchKey):
        await backend.get(bucket, "nope")
    with pytest.raises(errors.NoSuchKey):
        await backend.get_bytes(bucket, "nope", 0, 10)


# -- ranges --------------------------------------------------------------------------------------------


async def test_ranged_gets(backend: Backend, bucket: str) -> None:
    data = random.Random(7).randbytes(1000)
    await backend.put(bucket, "r", data)
    cases: list[tuple[int | None, int | None, tuple[int, int] | None]] = [
        (None, None, None),
        (0, 0, (0, 0)),
        (10, 19, (10, 19)),
        (0, 999, (0, 999)),
        (990, None, (990, 999)),
        (995, 5000, (995, 999)),  # past the end: clamped
        (999, 999, (999, 999)),
        (-10, None, (990, 999)),  # suffix
        (-1, None, (999, 999)),
        (-5000, None, (0, 999)),  # suffix longer than the object: all of it
    ]
    rng = random.Random(11)
    for _ in range(20):
        a = rng.randrange(1000)
        b = rng.randrange(a, 1200)
        cases.append((a, b, (a, min(b, 999))))
    for first, last, expected in cases:
        reader = await backend.get(bucket, "r", first, last)
        async with reader:
            body = await reader.read()
            assert reader.content_range == expected, (first, last)
            assert reader.info.size == 1000
        lo, hi = expected if expected else (0, 999)
        assert body == data[lo : hi + 1], (first, last)


async def test_unsatisfiable_ranges(backend: Backend, bucket: str) -> None:
    await backend.put(bucket, "r", b"0123456789")
    for first, last in ((10, None), (10, 20), (1000, 2000)):
        with pytest.raises(errors.InvalidRange):
            await backend.get(bucket, "r", first, last)


async def test_if_match(backend: Backend, bucket: str) -> None:
    info = await backend.put(bucket, "m", b"abc")
    assert (await backend.get_bytes(bucket, "m", if_match=info.etag))[1] == b"abc"
    assert (await backend.get_bytes(bucket, "m", 1, 1, if_match=f'"{info.etag}"'))[1] == b"b"
    with pytest.raises(errors.PreconditionFailed):
        await backend.get(bucket, "m", if_match="0" * 32)
    await backend.put(bucket, "m", b"changed")
    with pytest.raises(errors.PreconditionFailed):
        await backend.get_bytes(bucket, "m", 0, 1, if_match=info.etag)


async def test_read_in_pieces_then_rest(backend: Backend, bucket: str) -> None:
    data = os.urandom(3 * MIB + 5)
    await backend.put(bucket, "p", data)
    async with await backend.get(bucket, "p", MIB) as reader:
        iterator = aiter(reader)
        head = await anext(iterator)
        rest = await reader.read()
    assert head + rest == data[MIB:]


async def test_abandoned_reader_releases(backend: Backend, bucket: str) -> None:
    data = os.urandom(2 * MIB)
    await backend.put(bucket, "p", data)
    for _ in range(20):  # would exhaust a connection pool or file handles if readers leaked
        reader = await backend.get(bucket, "p")
        await anext(aiter(reader))
        await reader.close()
    assert (await backend.get_bytes(bucket, "p", -4))[1] == data[-4:]


# -- listing -------------------------------------------------------------------------------------------

# Keys with `..`, `%`, spaces and non-ASCII text, none of them a sibling that sorts between a
# "directory" name and its "/" (SeaweedFS lists a directory's keys right after its name, where S3
# would put `a-b` between `a` and `a/b`; with these keys both orders agree), and none that XML 1.0
# cannot carry (SeaweedFS' continuation token is the last key, so U+FFFF makes it loop).
LISTING_KEYS = [
    "%",
    "%2e%2e",
    "100%",
    "..hidden",
    "dots..in..name",
    "with space",
    "x y/z",
    "dir/a",
    "dir/b/c",
    "dir/b/d",
    "dir/e f",
    "dir/..x",
    "dir0",
    "dirz",
    "é",
    "ÿ",
    "\ufb01",
    "\ufffd",  # last of the BMP that XML can carry: before 😀 in UTF-8 order, after it in UTF-16's
    "😀",
    "中文/键",
    "zz",
]


@pytest.fixture
async def listed_bucket(backend: Backend, bucket: str) -> str:
    await asyncio.gather(*(backend.put(bucket, k, k.encode()) for k in LISTING_KEYS))
    return bucket


async def test_list_everything_in_utf8_order(backend: Backend, listed_bucket: str) -> None:
    page = await backend.list(listed_bucket)
    assert [o.key for o in page.objects] == utf8_sorted(LISTING_KEYS)
    assert not page.is_truncated and page.next_token is None and page.common_prefixes == []
    sizes = {o.key: o.size for o in page.objects}
    assert all(sizes[k] == len(k.encode()) for k in LISTING_KEYS)
    assert all(MD5_ETAG.fullmatch(o.etag) for o in page.objects)
    # Every key reads back as written.
    for key in LISTING_KEYS:
        assert await read_all(backend, listed_bucket, key) == key.encode()


async def test_list_prefix_and_delimiter(backend: Backend, listed_bucket: str) -> None:
    page = await backend.list(listed_bucket, delimiter="/")
    top = [k for k in LISTING_KEYS if "/" not in k]
    assert [o.key for o in page.objects] == utf8_sorted(top)
    assert page.common_prefixes == utf8_sorted(["x y/", "dir/", "中文/"])

    page = await backend.list(listed_bucket, prefix="dir/", delimiter="/")
    assert [o.key for o in page.objects] == utf8_sorted(["dir/a", "dir/e f", "dir/..x"])
    assert page.common_prefixes == ["dir/b/"]

    page = await backend.list(listed_bucket, prefix="dir")
    assert [o.key for o in page.objects] == utf8_sorted([k for k in LISTING_KEYS if k.startswith("dir")])

    page = await backend.list(listed_bucket, prefix="%")
    assert [o.key for o in page.objects] == ["%", "%2e%2e"]

    page = await backend.list(listed_bucket, prefix="中文/")
    assert [o.key for o in page.objects] == ["中文/键"]

    page = await backend.list(listed_bucket, prefix="nothing-here")
    assert page.objects == [] and page.common_prefixes == [] and not page.is_truncated


async def test_list_pagination(backend: Backend, listed_bucket: str) -> None:
    for max_keys in (1, 2, 5):
        keys, prefixes, pages = await list_all(backend, listed_bucket, max_keys=max_keys)
        assert keys == utf8_sorted(LISTING_KEYS) and prefixes == []
        assert pages == -(-len(LISTING_KEYS) // max_keys) or pages == -(-len(LISTING_KEYS) // max_keys) + 1
    keys, prefixes, _ = await list_all(backend, listed_bucket, delimiter="/", max_keys=2)
    assert keys == utf8_sorted([k for k in LISTING_KEYS if "/" not in k])
    assert prefixes == utf8_sorted(["x y/", "dir/", "中文/"])
    keys, _, _ = await list_all(backend, listed_bucket, prefix="dir/", max_keys=2)
    assert keys == utf8_sorted([k for k in LISTING_KEYS if k.startswith("dir/")])


async def test_list_start_after(backend: Backend, listed_bucket: str) -> None:
    page = await backend.list(listed_bucket, start_after="dir0")
    assert [o.key for o in page.objects] == [k for k in utf8_sorted(LISTING_KEYS) if k.encode() > b"dir0"]
    page = await backend.list(listed_bucket, start_after="é", max_keys=2)
    assert [o.key for o in page.objects] == ["ÿ", "中文/键"] and page.is_truncated
    page = await backend.list(listed_bucket, start_after="😀")
    assert page.objects == [] and not page.is_truncated


# -- delete --------------------------------------------------------------------------------------------


async def test_delete_is_idempotent(backend: Backend, bucket: str) -> None:
    await backend.put(bucket, "a/b/c", b"1")
    await backend.put(bucket, "a/b2", b"2")
    await backend.delete(bucket, "a/b/c")
    await backend.delete(bucket, "a/b/c")
    await backend.delete(bucket, "never/was")
    with pytest.raises(errors.NoSuchKey):
        await backend.head(bucket, "a/b/c")
    assert [o.key for o in (await backend.list(bucket)).objects] == ["a/b2"]
    # (S3 also drops the common prefix "a/b/" now; SeaweedFS keeps listing its empty directory.)
    assert [o.key for o in (await backend.list(bucket, delimiter="/", prefix="a/")).objects] == ["a/b2"]


async def test_delete_many(backend: Backend, bucket: str) -> None:
    keys = [f"many/{i:03d}" for i in range(30)]
    await asyncio.gather(*(backend.put(bucket, k, b"x") for k in keys))
    failed = await backend.delete_many(bucket, [*keys[:20], "many/absent"])
    assert failed == []
    assert [o.key for o in (await backend.list(bucket)).objects] == keys[20:]


# -- copy ----------------------------------------------------------------------------------------------


async def test_copy_keeps_or_replaces_metadata(backend: Backend, bucket: str) -> None:
    data = os.urandom(100_000)
    await backend.put(bucket, "src", data, metadata={"a": "1"}, content_type="application/x-src")
    copied = await backend.copy(bucket, "src", bucket, "dst/kept")
    assert copied.size == len(data) and copied.etag == hashlib.md5(data).hexdigest()
    head = await backend.head(bucket, "dst/kept")
    assert head.metadata == {"a": "1"} and head.content_type == "application/x-src"
    assert await read_all(backend, bucket, "dst/kept") == data

    replaced = await backend.copy(
        bucket, "src", bucket, "dst/replaced", metadata={"b": "2"}, content_type="text/x"
    )
    assert replaced.metadata == {"b": "2"}
    head = await backend.head(bucket, "dst/replaced")
    assert head.metadata == {"b": "2"} and head.content_type == "text/x"
    assert await read_all(backend, bucket, "dst/replaced") == data


async def test_copy_between_buckets_and_missing_source(backend: Backend, bucket: str) -> None:
    other = f"t-{os.urandom(8).hex()}"
    await backend.create_bucket(other)
    try:
        await backend.put(bucket, "src", b"payload")
        await backend.copy(bucket, "src", other, "dst")
        assert await read_all(backend, other, "dst") == b"payload"
        with pytest.raises(errors.NoSuchKey):
            await backend.copy(bucket, "absent", other, "dst2")
    finally:
        await backend.delete(other, "dst")
        await backend.delete_bucket(other)


# -- backend multipart ---------------------------------------------------------------------------------


async def test_multipart_out_of_order_with_copy_part(backend: Backend, bucket: str) -> None:
    part = 5 * MIB
    assert backend.min_part_size == part
    p1 = os.urandom(part)
    p2_source = os.urandom(part + 1000)
    p3 = os.urandom(1234)
    await backend.put(bucket, "copy-source", p2_source)
    upload_id = await backend.create_multipart(bucket, "assembled", metadata={"m": "v"}, content_type="app/x")
    uploads = await backend.list_multipart_uploads(bucket)
    assert [(u.key, u.upload_id) for u in uploads] == [("assembled", upload_id)]
    assert uploads[0].initiated.tzinfo is not None
    # Parts arrive in any order; part 2 is copied server-side from a range of another object.
    e3 = await backend.upload_part(bucket, "assembled", upload_id, 3, pieces(p3, 100), size=len(p3))
    e2 = await backend.upload_part_copy(
        bucket, "assembled", upload_id, 2, bucket, "copy-source", 500, 500 + part - 1
    )
    e1 = await backend.upload_part(bucket, "assembled", upload_id, 1, p1)
    assert e1 == hashlib.md5(p1).hexdigest() and e3 == hashlib.md5(p3).hexdigest()
    assert e2  # S3 gives the copied range's MD5; SeaweedFS an ETag of its own making
    info = await backend.complete_multipart(
        bucket, "assembled", upload_id, [(1, e1), (2, f'"{e2}"'), (3, e3)]
    )
    expected = p1 + p2_source[500 : 500 + part] + p3
    assert info.size == len(expected)
    if MD5_ETAG.fullmatch(e2):
        assert info.etag == multipart_etag([e1, e2, e3])
    else:
        assert info.etag.endswith("-3")
    head = await backend.head(bucket, "assembled")
    assert head.metadata == {"m": "v"} and head.content_type == "app/x" and head.etag == info.etag
    assert (
        hashlib.sha256(await read_all(backend, bucket, "assembled")).digest()
        == hashlib.sha256(expected).digest()
    )
    assert await backend.list_multipart_uploads(bucket) == []
    with pytest.raises(errors.NoSuchUpload):
        await backend.upload_part(bucket, "assembled", upload_id, 4, b"late")


async def test_list_parts_and_a_completion_of_known_size(backend: Backend, bucket: str) -> None:
    """ListParts gives what the upload holds (a part number sent twice: the last, or, on a store that
    keeps each upload of it, each); a completion told the size answers it with the store's ETag."""
    upload_id = await backend.create_multipart(bucket, "parts")
    assert await backend.list_parts(bucket, "parts", upload_id) == []
    first, again, last = os.urandom(5 * MIB), os.urandom(5 * MIB), b"end"
    e1 = await backend.upload_part(bucket, "parts", upload_id, 1, first)
    e1b = await backend.upload_part(bucket, "parts", upload_id, 1, again)
    e2 = await backend.upload_part(bucket, "parts", upload_id, 2, last)
    listed = await backend.list_parts(bucket, "parts", upload_id)
    assert (1, e1b) in listed and (2, e2) in listed and set(listed) <= {(1, e1), (1, e1b), (2, e2)}
    info = await backend.complete_multipart(bucket, "parts", upload_id, [(1, e1b), (2, e2)], size=5 * MIB + 3)
    assert info.size == 5 * MIB + 3 and info.etag == (await backend.head(bucket, "parts")).etag
    assert info.last_modified.tzinfo is not None
    assert await read_all(backend, bucket, "parts") == again + last
    with pytest.raises(errors.NoSuchUpload):
        await backend.list_parts(bucket, "parts", upload_id)
    with pytest.raises(errors.NoSuchUpload):
        await backend.list_parts(bucket, "parts", "0" * 32)


async def test_upload_part_copy_whole_object_and_suffix(backend: Backend, bucket: str) -> None:
    src = os.urandom(5 * MIB + 10)
    await backend.put(bucket, "src", src)
    upload_id = await backend.create_multipart(bucket, "dst")
    e1 = await backend.upload_part_copy(bucket, "dst", upload_id, 1, bucket, "src")
    e2 = await backend.upload_part_copy(bucket, "dst", upload_id, 2, bucket, "src", -10)
    await backend.complete_multipart(bucket, "dst", upload_id, [(1, e1), (2, e2)])
    assert await read_all(backend, bucket, "dst") == src + src[-10:]


async def test_upload_part_copy_pinned_to_a_source_version(backend: Backend, bucket: str) -> None:
    first = await backend.put(bucket, "src", b"version one")
    await backend.put(bucket, "src", b"version two")
    upload_id = await backend.create_multipart(bucket, "dst")
    with pytest.raises(errors.PreconditionFailed):
        await backend.upload_part_copy(bucket, "dst", upload_id, 1, bucket, "src", src_etag=first.etag)
    current = await backend.head(bucket, "src")
    etag = await backend.upload_part_copy(bucket, "dst", upload_id, 1, bucket, "src", src_etag=current.etag)
    await backend.complete_multipart(bucket, "dst", upload_id, [(1, etag)])
    assert await read_all(backend, bucket, "dst") == b"version two"


async def test_small_middle_part_is_entity_too_small(backend: Backend, bucket: str) -> None:
    upload_id = await backend.create_multipart(bucket, "small")
    e1 = await backend.upload_part(bucket, "small", upload_id, 1, b"a" * 1024)
    e2 = await backend.upload_part(bucket, "small", upload_id, 2, b"b" * 1024)
    with pytest.raises(errors.EntityTooSmall):
        await backend.complete_multipart(bucket, "small", upload_id, [(1, e1), (2, e2)])
    with pytest.raises(errors.NoSuchKey):
        await backend.head(bucket, "small")
    # A single small part is fine: the last part may be of any size.
    assert [u.upload_id for u in await backend.list_multipart_uploads(bucket)] == [upload_id]
    info = await backend.complete_multipart(bucket, "small", upload_id, [(1, e1)])
    assert info.size == 1024 and await read_all(backend, bucket, "small") == b"a" * 1024


async def test_wrong_part_etag_is_invalid_part(backend: Backend, bucket: str) -> None:
    upload_id = await backend.create_multipart(bucket, "k")
    await backend.upload_part(bucket, "k", upload_id, 1, b"data")
    with pytest.raises(errors.InvalidPart):
        await backend.complete_multipart(bucket, "k", upload_id, [(1, "0" * 32)])
    with pytest.raises(errors.InvalidPart):
        await backend.complete_multipart(bucket, "k", upload_id, [(2, hashlib.md5(b"data").hexdigest())])
    await backend.abort_multipart(bucket, "k", upload_id)


async def test_abort_leaves_nothing(backend: Backend, bucket: str) -> None:
    upload_id = await backend.create_multipart(bucket, "aborted/obj")
    e1 = await backend.upload_part(bucket, "aborted/obj", upload_id, 1, os.urandom(5 * MIB))
    await backend.abort_multipart(bucket, "aborted/obj", upload_id)
    assert await backend.list_multipart_uploads(bucket) == []
    page = await backend.list(bucket)
    assert page.objects == [] and page.common_prefixes == []
    with pytest.raises(errors.NoSuchKey):
        await backend.head(bucket, "aborted/obj")
    with pytest.raises(errors.NoSuchUpload):
        await backend.upload_part(bucket, "aborted/obj", upload_id, 2, b"x")
    with pytest.raises(errors.NoSuchUpload):
        await backend.complete_multipart(bucket, "aborted/obj", upload_id, [(1, e1)])
    # Aborting twice: S3 and the local backend say NoSuchUpload, SeaweedFS says nothing.
    with contextlib.suppress(errors.NoSuchUpload):
        await backend.abort_multipart(bucket, "aborted/obj", upload_id)


async def test_list_multipart_uploads_by_prefix(backend: Backend, bucket: str) -> None:
    ids = {}
    for key in ("logs/a", "logs/b", "other/c"):
        ids[key] = await backend.create_multipart(bucket, key)
    assert [u.key for u in await backend.list_multipart_uploads(bucket)] == ["logs/a", "logs/b", "other/c"]
    listed = await backend.list_multipart_uploads(bucket, prefix="logs/")
    assert [(u.key, u.upload_id) for u in listed] == [("logs/a", ids["logs/a"]), ("logs/b", ids["logs/b"])]
    # Uploads in progress are not objects.
    assert (await backend.list(bucket)).objects == []


# -- nothing half-written ------------------------------------------------------------------------------


@pytest.mark.parametrize("fail_after_mib", [1, 27], ids=["small", "beyond-a-part"])
async def test_interrupted_put_leaves_nothing(backend: Backend, bucket: str, fail_after_mib: int) -> None:
    data = os.urandom(30 * MIB) if fail_after_mib > 25 else os.urandom(2 * MIB)
    with pytest.raises(ConnectionResetError):
        await backend.put(bucket, "interrupted", failing(data, MIB, fail_after_mib * MIB))
    with pytest.raises(errors.NoSuchKey):
        await backend.head(bucket, "interrupted")
    assert (await backend.list(bucket)).objects == []
    assert await backend.list_multipart_uploads(bucket) == []


async def test_interrupted_overwrite_keeps_old_object(backend: Backend, bucket: str) -> None:
    await backend.put(bucket, "k", b"old")
    with pytest.raises(ConnectionResetError):
        await backend.put(bucket, "k", failing(os.urandom(MIB), 1000, 10_000))
    assert await read_all(backend, bucket, "k") == b"old"


async def test_cancelled_put_leaves_nothing(backend: Backend, bucket: str) -> None:
    started = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        while True:
            yield os.urandom(64 * 1024)
            started.set()
            await asyncio.sleep(0.001)

    task = asyncio.create_task(backend.put(bucket, "cancelled", endless()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(errors.NoSuchKey):
        await backend.head(bucket, "cancelled")
    assert (await backend.list(bucket)).objects == []
