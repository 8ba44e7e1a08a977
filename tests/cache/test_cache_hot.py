"""HotChunks: a byte-bounded LRU of plaintext chunks in memory."""

from __future__ import annotations

import pytest

from tsproxy.cache.chunks import ChunkKey
from tsproxy.cache.hot import HotChunks


def key(n: int, object_id: bytes = b"\x01" * 16) -> ChunkKey:
    return ChunkKey(object_id, 1, n)


def test_bounded_by_bytes_least_recently_used_first() -> None:
    hot = HotChunks(10)
    for n in range(3):
        hot.put(key(n), bytes([n]) * 3)
    assert hot.get(key(0)) == b"\x00" * 3  # 0 is now the most recently used
    hot.put(key(3), b"x" * 4)  # 13 bytes: 1 must go, not 0
    assert key(1) not in hot and key(0) in hot
    assert hot.size_bytes == 10 and len(hot) == 3
    hot.put(key(0), b"yy")  # replacing an entry re-counts its size
    assert hot.size_bytes == 9 and hot.get(key(0)) == b"yy"


def test_versions_are_separate() -> None:
    hot = HotChunks(100)
    hot.put(key(0, b"\x01" * 16), b"old")
    assert hot.get(key(0, b"\x02" * 16)) is None


def test_too_large_or_disabled_is_not_held() -> None:
    hot = HotChunks(4)
    hot.put(key(0), b"12345")
    assert len(hot) == 0
    off = HotChunks(0)
    off.put(key(0), b"1")
    assert off.get(key(0)) is None
    with pytest.raises(ValueError):
        HotChunks(-1)


def test_clear() -> None:
    hot = HotChunks(100)
    hot.put(key(0), b"abc")
    hot.clear()
    assert len(hot) == 0 and hot.size_bytes == 0
