"""Fixtures of the object-service tests: a fresh bucket in whichever backend a test runs against."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from tests.store.conftest import empty_bucket
from tsproxy.store.base import Backend


@pytest.fixture
async def bucket(backend: Backend) -> AsyncIterator[str]:
    """A new bucket in `backend`, removed with its contents after the test."""
    name = f"t-{uuid.uuid4().hex[:20]}"
    await backend.create_bucket(name)
    yield name
    await empty_bucket(backend, name)
