"""The local directory backend: containment, atomicity, and S3's listing semantics to the letter."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.store.store_helpers import listing_cases, s3_listing
from tsproxy import errors
from tsproxy.store import open_backend
from tsproxy.store.base import MIB
from tsproxy.store.local import MAGIC, LocalBackend
from tsproxy.store.s3 import S3Backend

BUCKET = "bkt"

EVIL_KEYS = [
    "../../outside/pwned",
    "..",
    ".",
    "./x",
    "a/../../../x",
    "/abs/olute",
    "/",
    "//",
    "a//b",
    "x/",
    "\x00nul",
    "a\x00/b",
    "~/x",
    "%2e%2e/%2e%2e/x",
    "..\\..\\x",
    " ",
    "\n",
    "con",
    ".tmp-looks-internal",
    ".uploads/x",
    ".bucket",
    "a" * 1024,
    "é" * 512,
    "seg/" * 255 + "x",
    "/" * 1023 + "x",
    "x" * 300 + "/y",
    "ä" * 300,
    "\ufffd/\U0001f600",
]


async def stream(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def files_under(path: Path) -> set[Path]:
    """Everything below `path` (iteratively: some keys nest a thousand directories deep)."""
    found: set[Path] = set()
    stack = [path]
    while stack:
        for entry in os.scandir(stack.pop()):
            found.add(Path(entry.path))
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
    return found


# -- containment --------------------------------------------------------------------------------------


async def test_no_key_escapes_the_bucket(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("untouched")
    backend = LocalBackend(root, fsync=False)
    await backend.start()
    await backend.create_bucket(BUCKET)
    before_outside = files_under(tmp_path) - files_under(root)
    for key in EVIL_KEYS:
        await backend.put(BUCKET, key, key.encode())
    # Nothing was created outside the bucket directory: no path below the root climbs ("..") or
    # jumps (a symlink), so everything below it stays below it; and no name is longer than a file
    # name may be.
    assert files_under(tmp_path) - files_under(root) == before_outside
    for path in files_under(root):
        parts = path.relative_to(root).parts
        assert parts[0] == BUCKET and not {".", ".."} & set(parts)
        assert not path.is_symlink()
        assert len(path.name.encode()) <= 255
    assert (outside / "keep").read_text() == "untouched"
    # Every key is there, whole, under its own name, in S3 order.
    page = await backend.list(BUCKET)
    assert [o.key for o in page.objects] == sorted(EVIL_KEYS, key=lambda k: k.encode())
    for key in EVIL_KEYS:
        assert (await backend.get_bytes(BUCKET, key))[1] == key.encode()
    # And every key can go again, leaving an empty bucket behind.
    await backend.delete_many(BUCKET, EVIL_KEYS)
    assert (await backend.list(BUCKET)).objects == []
    await backend.delete_bucket(BUCKET)


async def test_key_limits(local_backend: LocalBackend) -> None:
    await local_backend.create_bucket(BUCKET)
    with pytest.raises(errors.KeyTooLongError):
        await local_backend.put(BUCKET, "a" * 1025, b"x")
    with pytest.raises(errors.KeyTooLongError):
        await local_backend.put(BUCKET, "é" * 513, b"x")
    with pytest.raises(errors.InvalidArgument):
        await local_backend.put(BUCKET, "", b"x")
    with pytest.raises(errors.InvalidArgument):
        await local_backend.put(BUCKET, "lone \ud800 surrogate", b"x")


@pytest.mark.parametrize(
    "name", ["..", ".", "../x", "a/b", "UPPER", "ab", "-leading", "x" * 64, "a..b", "::"]
)
async def test_bucket_names_cannot_be_paths(local_backend: LocalBackend, tmp_path: Path, name: str) -> None:
    with pytest.raises(errors.InvalidBucketName):
        await local_backend.create_bucket(name)
    with pytest.raises(errors.NoSuchBucket):
        await local_backend.put(name, "k", b"x")
    with pytest.raises(errors.NoSuchBucket):
        await local_backend.list(name)
    assert not any(p.is_file() for p in files_under(tmp_path))


async def test_stray_files_are_not_objects(local_backend: LocalBackend) -> None:
    await local_backend.create_bucket(BUCKET)
    await local_backend.put(BUCKET, "dir/real", b"x")
    bucket_dir = local_backend.root / BUCKET
    (bucket_dir / ".tmp-abandoned").write_bytes(b"half")
    (bucket_dir / "README").write_bytes(b"not ours")
    (bucket_dir / "ddir" / ".tmp-another").write_bytes(b"half")
    page = await local_backend.list(BUCKET)
    assert [o.key for o in page.objects] == ["dir/real"]


async def test_damaged_object_file_is_an_error_not_bytes(local_backend: LocalBackend) -> None:
    await local_backend.create_bucket(BUCKET)
    await local_backend.put(BUCKET, "k", b"payload" * 100)
    path = local_backend.root / BUCKET / "ok"
    data = path.read_bytes()
    assert data.endswith(MAGIC)
    path.write_bytes(data[:-3])
    with pytest.raises(errors.InternalError):
        await local_backend.get_bytes(BUCKET, "k")
    path.write_bytes(b"")
    with pytest.raises(errors.InternalError):
        await local_backend.head(BUCKET, "k")


# -- atomicity ----------------------------------------------------------------------------------------


def leftovers(root: Path) -> list[Path]:
    return [p for p in files_under(root) if p.name.startswith((".tmp-", ".completing-", ".aborting-"))]


async def test_interrupted_put_leaves_no_file(local_backend: LocalBackend) -> None:
    await local_backend.create_bucket(BUCKET)

    async def broken() -> AsyncIterator[bytes]:
        yield b"x" * MIB
        yield b"y" * MIB
        raise ConnectionResetError("client went away")

    with pytest.raises(ConnectionResetError):
        await local_backend.put(BUCKET, "deep/er/key", broken())
    assert leftovers(local_backend.root) == []
    assert (await local_backend.list(BUCKET)).objects == []
    with pytest.raises(errors.NoSuchKey):
        await local_backend.head(BUCKET, "deep/er/key")


async def test_cancelled_put_leaves_no_file(local_backend: LocalBackend) -> None:
    await local_backend.create_bucket(BUCKET)
    first_piece = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        while True:
            yield os.urandom(256 * 1024)
            first_piece.set()
            await asyncio.sleep(0.001)

    task = asyncio.create_task(local_backend.put(BUCKET, "k", slow()))
    await first_piece.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert leftovers(local_backend.root) == []
    assert (await local_backend.list(BUCKET)).objects == []


async def test_readers_keep_the_version_they_opened(local_backend: LocalBackend) -> None:
    await local_backend.create_bucket(BUCKET)
    old = os.urandom(3 * MIB)
    await local_backend.put(BUCKET, "k", old)
    reader = await local_backend.get(BUCKET, "k")
    first = await anext(aiter(reader))
    await local_backend.put(BUCKET, "k", b"new")
    rest = await reader.read()
    await reader.close()
    assert first + rest == old
    reader = await local_backend.get(BUCKET, "k")
    await local_backend.delete(BUCKET, "k")
    assert await reader.read() == b"new"
    await reader.close()


async def test_concurrent_puts_of_one_key_leave_one_whole_version(local_backend: LocalBackend) -> None:
    await local_backend.create_bucket(BUCKET)
    versions = [bytes([i]) * (MIB + i) for i in range(8)]
    await asyncio.gather(*(local_backend.put(BUCKET, "k", stream(v, 64 * 1024)) for v in versions))
    info, data = await local_backend.get_bytes(BUCKET, "k")
    assert data in versions and info.etag == hashlib.md5(data).hexdigest()
    assert leftovers(local_backend.root) == []


async def test_concurrent_puts_and_deletes_under_one_directory(local_backend: LocalBackend) -> None:
    """Deleting the last key of a directory removes it; a put into it at the same time must not fail."""
    await local_backend.create_bucket(BUCKET)

    async def churn(i: int) -> None:
        for round_ in range(15):
            key = f"shared/dir/k{i}-{round_}"
            await local_backend.put(BUCKET, key, b"x")
            await local_backend.delete(BUCKET, key)

    await asyncio.gather(*(churn(i) for i in range(6)))
    await local_backend.put(BUCKET, "shared/dir/last", b"ok")
    assert [o.key for o in (await local_backend.list(BUCKET)).objects] == ["shared/dir/last"]


async def test_empty_directories_are_removed(local_backend: LocalBackend) -> None:
    await local_backend.create_bucket(BUCKET)
    long_segment = "s" * 300
    keys = ["a/b/c", "a/b2", f"{long_segment}/x"]
    for key in keys:
        await local_backend.put(BUCKET, key, b"1")
    await local_backend.delete(BUCKET, "a/b/c")
    assert (await local_backend.list(BUCKET, prefix="a/", delimiter="/")).common_prefixes == []
    await local_backend.delete(BUCKET, "a/b2")
    await local_backend.delete(BUCKET, f"{long_segment}/x")
    bucket_dir = local_backend.root / BUCKET
    assert sorted(p.name for p in bucket_dir.iterdir()) == [".bucket"]
    await local_backend.delete_bucket(BUCKET)
    assert not bucket_dir.exists()


async def test_multipart_work_files_are_gone_after_complete_and_abort(local_backend: LocalBackend) -> None:
    await local_backend.create_bucket(BUCKET)
    upload_id = await local_backend.create_multipart(BUCKET, "k")
    etag = await local_backend.upload_part(BUCKET, "k", upload_id, 1, b"abc")
    uploads = local_backend.root / BUCKET / ".uploads"
    assert [p.name for p in uploads.iterdir()] == [upload_id]
    await local_backend.complete_multipart(BUCKET, "k", upload_id, [(1, etag)])
    assert list(uploads.iterdir()) == []
    other = await local_backend.create_multipart(BUCKET, "k2")
    await local_backend.upload_part(BUCKET, "k2", other, 1, b"abc")
    await local_backend.abort_multipart(BUCKET, "k2", other)
    assert list(uploads.iterdir()) == []
    assert leftovers(local_backend.root) == []
    with pytest.raises(errors.NoSuchUpload):
        await local_backend.upload_part(BUCKET, "k", "../../etc", 1, b"x")
    with pytest.raises(errors.NoSuchUpload):
        await local_backend.upload_part(BUCKET, "other-key", upload_id, 1, b"x")


async def test_failed_completion_keeps_the_upload(local_backend: LocalBackend) -> None:
    await local_backend.create_bucket(BUCKET)
    upload_id = await local_backend.create_multipart(BUCKET, "k")
    e1 = await local_backend.upload_part(BUCKET, "k", upload_id, 1, b"small")
    e2 = await local_backend.upload_part(BUCKET, "k", upload_id, 2, b"parts")
    with pytest.raises(errors.EntityTooSmall):
        await local_backend.complete_multipart(BUCKET, "k", upload_id, [(1, e1), (2, e2)])
    with pytest.raises(errors.InvalidPartOrder):
        await local_backend.complete_multipart(BUCKET, "k", upload_id, [(2, e2), (1, e1)])
    with pytest.raises(errors.MalformedXML):
        await local_backend.complete_multipart(BUCKET, "k", upload_id, [])
    # Still there: the client may fix its part list.
    e1 = await local_backend.upload_part(BUCKET, "k", upload_id, 1, b"x" * (5 * MIB))
    info = await local_backend.complete_multipart(BUCKET, "k", upload_id, [(1, e1), (2, e2)])
    assert info.size == 5 * MIB + 5


# -- plumbing -----------------------------------------------------------------------------------------


async def test_blocking_io_runs_in_the_given_executor(tmp_path: Path) -> None:
    calls = 0

    class Counting(ThreadPoolExecutor):
        def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            return super().submit(fn, *args, **kwargs)

    with Counting(2) as pool:
        backend = LocalBackend(tmp_path, executor=pool)
        await backend.start()
        await backend.create_bucket(BUCKET)
        before = calls
        await backend.put(BUCKET, "k", b"x" * 100)
        assert calls > before
        before = calls
        assert (await backend.get_bytes(BUCKET, "k"))[1] == b"x" * 100
        assert calls > before


async def test_on_request_reports_each_operation(tmp_path: Path) -> None:
    seen: list[tuple[str, str, int, int]] = []
    backend = LocalBackend(
        tmp_path,
        on_request=lambda op, outcome, secs, retries, b_in, b_out: seen.append((op, outcome, b_in, b_out)),
    )
    await backend.start()
    await backend.create_bucket(BUCKET)
    await backend.put(BUCKET, "k", b"12345")
    await backend.get_bytes(BUCKET, "k", 1, 2)
    with pytest.raises(errors.NoSuchKey):
        await backend.head(BUCKET, "missing")
    assert seen == [
        ("CreateBucket", "ok", 0, 0),
        ("PutObject", "ok", 0, 5),
        ("GetObject", "ok", 2, 0),
        ("HeadObject", "NoSuchKey", 0, 0),
    ]


async def test_ping_needs_a_writable_root(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "missing")
    with pytest.raises(errors.ServiceUnavailable):
        await backend.ping()
    await backend.start()
    await backend.ping()


def test_open_backend_by_url(tmp_path: Path) -> None:
    local = open_backend(f"file://{tmp_path}/data")
    assert isinstance(local, LocalBackend) and local.root == tmp_path / "data"
    assert isinstance(open_backend("file://./rel"), LocalBackend)
    remote = open_backend("http://127.0.0.1:9000", region="eu-west-1", part_size=8 * MIB)
    assert isinstance(remote, S3Backend) and remote.endpoint == "http://127.0.0.1:9000"
    assert remote.region == "eu-west-1" and remote.part_size == 8 * MIB
    for bad in ("s3://bucket", "http://host:1/path", "file://", "ftp://x"):
        with pytest.raises(ValueError):
            open_backend(bad)
    with pytest.raises(TypeError):
        open_backend("http://127.0.0.1:9000", no_such_option=1)
    with pytest.raises(ValueError):
        open_backend("http://127.0.0.1:9000", part_size=MIB)


# -- listing: exactly S3 ------------------------------------------------------------------------------


async def all_pages(
    backend: LocalBackend, prefix: str, delimiter: str | None, start_after: str | None, max_keys: int
) -> list[tuple[str, str]]:
    entries: list[tuple[str, str]] = []
    token = None
    while True:
        page = await backend.list(
            BUCKET,
            prefix=prefix,
            delimiter=delimiter,
            start_after=start_after,
            token=token,
            max_keys=max_keys,
        )
        assert len(page.objects) + len(page.common_prefixes) <= max_keys
        # Within a page, keys and prefixes interleave in S3 order; merge them back by that order.
        merged = [("k", o.key) for o in page.objects] + [("p", p) for p in page.common_prefixes]
        entries += sorted(merged, key=lambda e: e[1].encode())
        if not page.is_truncated:
            assert page.next_token is None
            return entries
        assert page.next_token
        token = page.next_token


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=listing_cases(),
    delimiter=st.sampled_from([None, "/", "/", "a", "//", "é"]),
    max_keys=st.integers(1, 5),
)
def test_local_listing_matches_s3(
    case: tuple[set[str], str, str | None], delimiter: str | None, max_keys: int
) -> None:
    keys, prefix, start_after = case

    async def scenario(root: str) -> None:
        backend = LocalBackend(root, fsync=False)
        await backend.start()
        await backend.create_bucket(BUCKET)
        await asyncio.gather(*(backend.put(BUCKET, k, b"") for k in keys))
        expected = s3_listing(keys, prefix, delimiter, start_after)
        assert await all_pages(backend, prefix, delimiter, start_after, max_keys) == expected
        assert await all_pages(backend, prefix, delimiter, start_after, 1000) == expected

    with tempfile.TemporaryDirectory() as root:
        asyncio.run(scenario(root))
