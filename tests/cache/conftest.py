"""Fixtures for the chunk cache and read engine tests."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tsproxy.cache.chunks import ChunkCache
from tsproxy.format import KeyRing


@pytest.fixture(scope="session")
def ring() -> KeyRing:
    """An AES key-wrap ring with one active key."""
    return KeyRing.new(key_id="cache-tests")


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    """The transform pool a reader decodes in."""
    pool = ThreadPoolExecutor(4, thread_name_prefix="test-transform")
    yield pool
    pool.shutdown(wait=True)


@pytest.fixture
def io_executor() -> Iterator[ThreadPoolExecutor]:
    """The pool the disk cache runs in."""
    pool = ThreadPoolExecutor(4, thread_name_prefix="test-cache-io")
    yield pool
    pool.shutdown(wait=True)


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "chunks"


@pytest.fixture
def cache(cache_dir: Path, io_executor: ThreadPoolExecutor) -> Iterator[ChunkCache]:
    """A 64 MiB chunk cache in a fresh directory."""
    c = ChunkCache(cache_dir, 64 << 20, executor=io_executor)
    yield c
    c.close()
