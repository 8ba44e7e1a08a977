"""Fixtures of the object-service tests: a fresh bucket in whichever backend a test runs against, a key
ring (one per module) and a thread pool for the service's CPU work."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.store.conftest import empty_bucket
from tsproxy.format import KeyRing
from tsproxy.store.base import Backend


@pytest.fixture
async def bucket(backend: Backend) -> AsyncIterator[str]:
    """A new bucket in `backend`, removed with its contents after the test."""
    name = f"t-{uuid.uuid4().hex[:20]}"
    await backend.create_bucket(name)
    yield name
    await empty_bucket(backend, name)


@pytest.fixture(scope="module")
def ring() -> KeyRing:
    return KeyRing.new(key_id="service-tests")


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as executor:
        yield executor
