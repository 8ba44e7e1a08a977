"""The service's small in-memory caches."""

from __future__ import annotations

from tsproxy.service.core import BytesLru


def test_bytes_lru_is_bounded_in_bytes_and_in_entries() -> None:
    lru: BytesLru[str] = BytesLru(3, 10)
    lru.put("a", b"1234")
    lru.put("b", b"5678")
    assert lru.get("a") == b"1234"  # now the most recently used
    lru.put("c", b"90")  # 10 bytes: all three fit
    assert [lru.get(k) for k in "abc"] == [b"1234", b"5678", b"90"]
    lru.put("d", b"x")  # four entries: the least recently used goes
    assert lru.get("a") is None and lru.get("d") == b"x"
    lru.put("e", b"y" * 8)  # over 10 bytes: the oldest go until it fits
    assert [lru.get(k) for k in "bcde"] == [None, None, b"x", b"y" * 8]


def test_bytes_lru_keeps_the_newest_even_when_it_alone_is_over() -> None:
    lru: BytesLru[str] = BytesLru(3, 4)
    lru.put("a", b"12")
    lru.put("big", b"123456")
    assert lru.get("a") is None and lru.get("big") == b"123456"
    lru.pop_where(lambda k: k == "big")
    assert lru.get("big") is None
