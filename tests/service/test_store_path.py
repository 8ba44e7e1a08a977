"""The store path of the object service over each backend: chunks sealed on several threads come out in
order, the MD5 the transform gives the backend is the MD5 of what the backend got, the payload and the
stored bytes are hashed at once, and a failure at any point (a seal, the client's Content-MD5, the client
itself) stores nothing."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import threading
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.store.conftest import empty_bucket
from tests.support.kafka_batches import producer_batch
from tsproxy import errors
from tsproxy.cache.reader import ChunkReader
from tsproxy.format import KeyRing, SegmentEncoder, TransformSettings, decode_object
from tsproxy.kafka.codecs import CODEC_ZSTD
from tsproxy.service import ObjectService
from tsproxy.store.base import MIB, Backend, multipart_of
from tsproxy.store.s3 import S3Backend

KIB = 1024
CHUNK = 256 * KIB


class Recording:
    """A backend that notes each body it is sent (bytes and streams) with the MD5 its writer gave."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.sent: list[tuple[str, bytes, bytes | None]] = []  # (operation, body, content_md5)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def put(self, bucket: str, key: str, body: Any, **kwargs: Any) -> Any:
        if isinstance(body, bytes | bytearray | memoryview):
            self.sent.append(("put", bytes(body), kwargs.get("content_md5")))
            return await self.inner.put(bucket, key, body, **kwargs)
        seen = bytearray()

        async def noted() -> AsyncIterator[bytes]:
            async for piece in body:
                seen.extend(piece)
                yield piece
            given = kwargs.get("content_md5")
            self.sent.append(("put", bytes(seen), given() if callable(given) else given))

        return await self.inner.put(bucket, key, noted(), **kwargs)

    async def upload_part(self, bucket: str, key: str, upload_id: str, part_no: int, body: Any, *args: Any,
                          **kwargs: Any) -> str:  # fmt: skip
        self.sent.append(("part", bytes(body), kwargs.get("content_md5")))
        return str(await self.inner.upload_part(bucket, key, upload_id, part_no, body, *args, **kwargs))


def service(backend: Backend, ring: KeyRing, pool: ThreadPoolExecutor, **settings: Any) -> ObjectService:
    cfg = TransformSettings(**{"chunk_size": CHUNK, **settings})
    return ObjectService(backend, ring, cfg, ChunkReader(None, pool), pool)


async def pieces(data: bytes, size: int = 100_000) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]
        await asyncio.sleep(0)


def mixed(size: int, seed: int) -> bytes:
    """Compressible text and random runs, so that stored chunks differ in size."""
    rnd = random.Random(seed)
    out = bytearray()
    while len(out) < size:
        out += rnd.randbytes(50_000) if rnd.random() < 0.5 else b'{"offset": 1, "value": "x"}\n' * 2000
    return bytes(out[:size])


async def put(
    svc: ObjectService, bucket: str, key: str, data: bytes | AsyncIterable[bytes], **kwargs: Any
) -> Any:
    body = pieces(data) if isinstance(data, bytes) else data
    return await svc.put(bucket, key, body, content_type=None, metadata={}, headers={}, **kwargs)


async def stored_bytes(backend: Backend, bucket: str, key: str) -> bytes:
    return (await backend.get_bytes(bucket, key))[1]


@pytest.mark.parametrize("size", [MIB + 5, 9 * MIB + 5], ids=["buffered", "streamed"])
async def test_put_gives_the_backend_the_md5_of_what_it_stores(
    backend: Backend, bucket: str, ring: KeyRing, pool: ThreadPoolExecutor, size: int
) -> None:
    recording = Recording(backend)
    svc = service(recording, ring, pool)  # type: ignore[arg-type]
    data = os.urandom(size)  # incompressible: a 9 MiB object is stored beyond SMALL_OBJECT, streamed
    await put(svc, bucket, "k", data)
    [(operation, body, md5)] = recording.sent
    assert operation == "put" and md5 == hashlib.md5(body).digest()
    assert body == await stored_bytes(backend, bucket, "k")
    assert decode_object(body, ring) == data


async def test_upload_part_gives_the_backend_the_md5_of_the_part(
    backend: Backend, bucket: str, ring: KeyRing, pool: ThreadPoolExecutor
) -> None:
    recording = Recording(backend)
    svc = service(recording, ring, pool)  # type: ignore[arg-type]
    data = os.urandom(6 * MIB)  # stored above the backend's minimum part size: a backend part of its own
    upload = await svc.create_upload(bucket, "mp", content_type=None, metadata={}, headers={})
    record = await svc.upload_part(bucket, "mp", upload, 1, pieces(data))
    parts = [(body, md5) for operation, body, md5 in recording.sent if operation == "part"]
    assert len(parts) == 1 and parts[0][1] == hashlib.md5(parts[0][0]).digest()
    assert record.segment.stored_md5 == parts[0][1]
    await svc.complete_upload(bucket, "mp", upload, [(1, record.etag)])
    assert decode_object(await stored_bytes(backend, bucket, "mp"), ring) == data


async def test_chunks_larger_than_a_batch_are_gathered_from_several(
    backend: Backend, bucket: str, ring: KeyRing, pool: ThreadPoolExecutor
) -> None:
    recording = Recording(backend)
    svc = service(recording, ring, pool, chunk_size=6 * MIB)  # batches are 4 MiB
    data = mixed(15 * MIB + 3, 3)
    await put(svc, bucket, "k", data)
    [(_, body, md5)] = recording.sent
    assert md5 == hashlib.md5(body).digest() and decode_object(body, ring) == data


async def test_chunks_come_out_in_order_however_their_sealing_ends(
    backend: Backend, bucket: str, ring: KeyRing, pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sealing takes a random while, so chunks sealed at once often end out of order."""
    real_seal = SegmentEncoder.seal
    rnd = random.Random(1)
    lock = threading.Lock()
    overlapped = threading.Event()
    sealing = [0]

    def slow_seal(self: SegmentEncoder, cut: Any) -> bytes:
        with lock:
            sealing[0] += 1
            if sealing[0] > 1:
                overlapped.set()
            delay = rnd.random() * 0.01
        try:
            time.sleep(delay)
            return real_seal(self, cut)
        finally:
            with lock:
                sealing[0] -= 1

    monkeypatch.setattr(SegmentEncoder, "seal", slow_seal)
    svc = service(backend, ring, pool)
    data = mixed(40 * CHUNK + 17, 2)
    await put(svc, bucket, "k", data)
    assert overlapped.is_set(), "chunks of one upload were sealed at once"
    assert decode_object(await stored_bytes(backend, bucket, "k"), ring) == data


@pytest.mark.parametrize("size", [MIB, 12 * MIB], ids=["buffered", "streamed"])
async def test_a_failed_seal_mid_way_stores_nothing(
    backend: Backend,
    bucket: str,
    ring: KeyRing,
    pool: ThreadPoolExecutor,
    monkeypatch: pytest.MonkeyPatch,
    size: int,
) -> None:
    svc = service(backend, ring, pool, compression="off")
    await put(svc, bucket, "k", b"the version before")
    real_seal = SegmentEncoder.seal

    def failing_seal(self: SegmentEncoder, cut: Any) -> bytes:
        if cut.chunk_no == 2 * size // CHUNK // 3:
            raise RuntimeError("a seal went wrong")
        return real_seal(self, cut)

    monkeypatch.setattr(SegmentEncoder, "seal", failing_seal)
    with pytest.raises(RuntimeError, match="a seal went wrong"):
        await put(svc, bucket, "k", os.urandom(size))
    await assert_only_the_old_version(svc, backend, bucket, ring)


@pytest.mark.parametrize("size", [MIB, 12 * MIB], ids=["buffered", "streamed"])
async def test_a_wrong_content_md5_or_a_client_gone_stores_nothing(
    backend: Backend, bucket: str, ring: KeyRing, pool: ThreadPoolExecutor, size: int
) -> None:
    svc = service(backend, ring, pool, compression="off")
    await put(svc, bucket, "k", b"the version before")
    data = os.urandom(size)
    with pytest.raises(errors.BadDigest):
        await put(svc, bucket, "k", data, content_md5=hashlib.md5(data + b"x").digest())
    await assert_only_the_old_version(svc, backend, bucket, ring)

    async def gone() -> AsyncIterator[bytes]:
        async for piece in pieces(data):
            yield piece
        raise ConnectionResetError("client went away")

    with pytest.raises(ConnectionResetError):
        await put(svc, bucket, "k", gone())
    await assert_only_the_old_version(svc, backend, bucket, ring)
    upload = await svc.create_upload(bucket, "mp", content_type=None, metadata={}, headers={})
    with pytest.raises(errors.BadDigest):
        await svc.upload_part(bucket, "mp", upload, 1, pieces(data), content_md5=hashlib.md5(b"x").digest())
    with pytest.raises(ConnectionResetError):
        await svc.upload_part(bucket, "mp", upload, 1, gone())
    _, parts = await svc.list_parts(bucket, "mp", upload)
    assert parts == []
    await svc.abort_upload(bucket, "mp", upload)


async def assert_only_the_old_version(
    svc: ObjectService, backend: Backend, bucket: str, ring: KeyRing
) -> None:
    listed = [o.key for o in (await backend.list(bucket)).objects]
    assert listed == ["k"]
    assert decode_object(await stored_bytes(backend, bucket, "k"), ring) == b"the version before"
    assert await multipart_of(backend).list_multipart_uploads(bucket) == []


class _MeetsOnFirstUpdate:
    """An MD5 whose first update waits (up to 10 s) for another's first update to be under way too."""

    def __init__(self, barrier: threading.Barrier) -> None:
        self._barrier = barrier
        self._inner = hashlib.md5(usedforsecurity=False)
        self._met = False

    def update(self, data: Any) -> None:
        if not self._met:
            self._met = True
            self._barrier.wait(timeout=10)  # BrokenBarrierError when the other never comes
        self._inner.update(data)

    def digest(self) -> bytes:
        return self._inner.digest()


async def test_the_payload_and_the_stored_bytes_are_hashed_at_once(
    backend: Backend, bucket: str, ring: KeyRing, pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The payload's MD5 (the ETag) and the stored bytes' MD5 (the backend's Content-MD5) go down two
    lanes: the first update of each waits for the other's, which only two lanes on two threads allow."""
    import types

    from tsproxy.format import digests
    from tsproxy.service import writes

    barrier = threading.Barrier(2)
    made: list[_MeetsOnFirstUpdate] = []

    def md5(*_args: Any, **_kwargs: Any) -> _MeetsOnFirstUpdate:
        made.append(_MeetsOnFirstUpdate(barrier))
        return made[-1]

    monkeypatch.setattr(writes, "hashlib", types.SimpleNamespace(md5=md5))  # the payload's
    monkeypatch.setattr(digests, "hashlib", types.SimpleNamespace(md5=md5))  # the stored bytes'
    recording = Recording(backend)
    svc = service(recording, ring, pool)  # type: ignore[arg-type]
    data = os.urandom(9 * MIB + 5)
    stored = await put(svc, bucket, "k", data)
    assert len(made) == 2 and not barrier.broken
    assert stored.manifest.etag == hashlib.md5(data).hexdigest()
    [(_, body, content_md5)] = recording.sent
    assert content_md5 == hashlib.md5(body).digest()
    assert decode_object(await stored_bytes(backend, bucket, "k"), ring) == data


class _CountingMD5:
    """hashlib.md5 that adds the bytes it is fed to a shared count."""

    real = hashlib.md5
    lock = threading.Lock()
    fed = 0

    def __init__(self, data: bytes | bytearray | memoryview = b"", **kwargs: Any) -> None:
        self._md5 = self.real(**kwargs)
        if data:
            self.update(data)

    def update(self, data: bytes | bytearray | memoryview) -> None:
        with self.lock:
            type(self).fed += memoryview(data).nbytes
        self._md5.update(data)

    def digest(self) -> bytes:
        return self._md5.digest()

    def hexdigest(self) -> str:
        return self._md5.hexdigest()


@pytest.mark.parametrize("declared", [False, True], ids=["length-unknown", "length-declared"])
async def test_a_put_sent_in_parts_hashes_its_stored_bytes_once(
    seaweed: Any, ring: KeyRing, pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch, declared: bool
) -> None:
    """A PutObject the S3 backend sends as a multipart upload (stored beyond its part size): each part's
    Content-MD5 is made as the part is gathered, and the whole object's MD5, which only a single
    PutObject would carry, is not made beside them past the first part's worth, nor at all when the
    stored size is known from the declared length (chunks stored uncompressed): every stored byte is
    hashed once, not twice. Counted over every MD5 made in this process while the object is stored."""
    part = 5 * MIB
    backend = S3Backend(**seaweed.backend_options(part_size=part))
    await backend.start()
    bucket = f"t-{uuid.uuid4().hex[:20]}"
    await backend.create_bucket(bucket)
    try:
        svc = service(backend, ring, pool)
        # Incompressible, as many stored bytes as payload; opening with a batch its producer compressed,
        # the chunks are stored as they are (`auto`), so their stored size follows from the length.
        head = producer_batch(CODEC_ZSTD, (b'{"n": %d, "v": "x"}' % i for i in range(200)))
        data = head + os.urandom(14 * MIB - len(head))
        monkeypatch.setattr(_CountingMD5, "fed", 0)
        monkeypatch.setattr(hashlib, "md5", _CountingMD5)
        await put(svc, bucket, "k", data, size_hint=len(data) if declared else None)
        monkeypatch.setattr(hashlib, "md5", _CountingMD5.real)
        stored = await stored_bytes(backend, bucket, "k")
        assert decode_object(stored, ring) == data
        assert len(stored) > 2 * part  # sent in three parts
        # The payload once (its ETag), the stored bytes once (the parts), and at most one part's worth
        # of a whole-object MD5 before it is known to be of no use; two whole passes would be 2 x stored.
        # (Had the backend asked for the whole object's MD5, BoundedMD5 would have failed the put.)
        whole_md5 = 0 if declared else part  # what the whole object's MD5 may take before it stops
        assert len(data) + len(stored) <= _CountingMD5.fed <= len(data) + len(stored) + whole_md5 + MIB
    finally:
        await empty_bucket(backend, bucket)
        await backend.close()
