"""Fixtures of the storage tests: a fresh bucket in whichever backend a test runs against."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from tsproxy import errors
from tsproxy.store.base import Backend


async def empty_bucket(backend: Backend, bucket: str) -> None:
    """Remove everything from a bucket (objects and multipart uploads) and the bucket itself."""
    try:
        for upload in await backend.list_multipart_uploads(bucket):
            await backend.abort_multipart(bucket, upload.key, upload.upload_id)
        token = None
        while True:
            page = await backend.list(bucket, token=token)
            await backend.delete_many(bucket, [o.key for o in page.objects])
            if not page.is_truncated:
                break
            token = page.next_token
        await backend.delete_bucket(bucket)
    except errors.NoSuchBucket:
        pass


@pytest.fixture
async def bucket(backend: Backend) -> AsyncIterator[str]:
    """A new bucket in `backend`, removed with its contents after the test."""
    name = f"t-{uuid.uuid4().hex[:20]}"
    await backend.create_bucket(name)
    yield name
    await empty_bucket(backend, name)
