"""ListMultipartUploads while the upload's state is being written: the upload is listed either from the
store or from what this instance holds, never from neither."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.store.conftest import empty_bucket
from tsproxy.cache.reader import ChunkReader
from tsproxy.format import KeyRing, TransformSettings
from tsproxy.service import ObjectService
from tsproxy.service.uploads.ids import ticket_of
from tsproxy.store.s3 import S3Backend


@pytest.fixture
async def bucket(seaweed_backend: S3Backend) -> AsyncIterator[str]:
    name = f"t-{uuid.uuid4().hex[:20]}"  # created through the service
    yield name
    await empty_bucket(seaweed_backend, name)


async def test_an_upload_whose_state_is_written_during_the_listing_is_listed(
    seaweed_backend: S3Backend, bucket: str, pool: ThreadPoolExecutor
) -> None:
    ring = KeyRing.new(key_id="listing")
    # Records deferred, with a flusher that stays quiet unless asked.
    svc = ObjectService(seaweed_backend, ring, TransformSettings(), ChunkReader(None, pool), pool,
                        upload_record_delay=3600)  # fmt: skip
    svc.uploads.start()
    try:
        await _listed_while_written(svc, seaweed_backend, bucket)
    finally:
        await svc.uploads.close()


async def _listed_while_written(svc: ObjectService, seaweed_backend: S3Backend, bucket: str) -> None:
    await svc.create_bucket(bucket)
    upload_id = await svc.create_upload(bucket, "held.log", content_type=None, metadata={}, headers={})
    assert ticket_of(upload_id) is not None  # its state is held here, not written yet
    root = svc.uploads.layout.uploads(bucket)
    listing = seaweed_backend.list

    async def state_written_meanwhile(backend_bucket: str, *args: Any, **kwargs: Any) -> Any:
        page = await listing(backend_bucket, *args, **kwargs)
        if kwargs.get("prefix") == root.key:
            # The store answered without the upload; its state is written before the listing goes on.
            assert page.common_prefixes == []
            await svc.uploads.keeper.flush_records()
        return page

    seaweed_backend.list = state_written_meanwhile  # type: ignore[method-assign,assignment]
    try:
        listed = [u.upload_id for u in await svc.list_uploads(bucket)]
    finally:
        del seaweed_backend.list
    assert listed == [upload_id]
    # And once written, it is listed from the store.
    assert [u.upload_id for u in await svc.list_uploads(bucket)] == [upload_id]
