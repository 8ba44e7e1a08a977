"""The size catalog codec: round trips, a pinned golden object, damage detection, the self-checking index."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tsproxy.errors import IntegrityError
from tsproxy.format.catalog import (
    NO_EXTRAS,
    CatalogIndex,
    CatalogRecord,
    HeadFacts,
    catalog_object_name,
    decode_catalog,
    encode_catalog,
)

GOLDEN_V1 = Path(__file__).parent.parent / "golden" / "catalog-v1.bin"
GOLDEN = Path(__file__).parent.parent / "golden" / "catalog-v2.bin"

texts = st.text(max_size=20)
heads = st.one_of(
    st.none(),
    st.builds(
        HeadFacts.of,
        st.one_of(st.none(), texts),
        st.dictionaries(texts, texts, max_size=3),
        st.dictionaries(texts, texts, max_size=3),
    ),
)

records = st.builds(
    CatalogRecord,
    key=st.text(min_size=1, max_size=60),
    backend_etag=st.text(alphabet="0123456789abcdef-", min_size=1, max_size=40),
    stored_size=st.integers(0, 1 << 45),
    original_size=st.integers(0, 1 << 45),
    client_etag=st.text(alphabet="0123456789abcdef-", min_size=1, max_size=40),
    last_modified_ms=st.integers(0, 1 << 45),
    head=heads,
)


def _sorted(rs: list[CatalogRecord]) -> list[CatalogRecord]:
    return sorted(rs, key=lambda r: (r.key, r.backend_etag))


@settings(max_examples=200)
@given(st.lists(records, max_size=60))
def test_round_trip(rs: list[CatalogRecord]) -> None:
    assert decode_catalog(encode_catalog(rs)) == _sorted(rs)


def _sample(with_heads: bool = True) -> list[CatalogRecord]:
    def head(p: int) -> HeadFacts | None:
        if not with_heads or p % 5 == 4:
            return None  # a record written without HEAD facts
        if p % 5 == 0:
            return HeadFacts.of("application/x-kafka-segment", {"topic": f"t{p}"}, {"cache-control": "no"})
        return NO_EXTRAS

    return [
        CatalogRecord(
            f"topic-{p}/00000000000000{p:06d}.log", f"{p:032x}", 4096 + p, 8192 + p, f"{p:032x}-2", p, head(p)
        )
        for p in range(40)
    ]


def test_golden_object_is_pinned() -> None:
    """An accidental change of the catalog bytes fails here (regenerate only with a version bump)."""
    encoded = encode_catalog(_sample())
    assert GOLDEN.read_bytes() == encoded
    assert decode_catalog(GOLDEN.read_bytes()) == _sorted(_sample())


def test_version_1_objects_still_decode() -> None:
    """Catalog objects written before HEAD facts were recorded: the same records, with no HEAD facts."""
    assert GOLDEN_V1.read_bytes()[4] == 1
    assert decode_catalog(GOLDEN_V1.read_bytes()) == _sorted(_sample(with_heads=False))


def test_unknown_record_flags_are_refused() -> None:
    import zlib

    data = bytearray(encode_catalog([CatalogRecord("k", "e", 1, 2, "c", 3)]))
    assert data[-5] == 0  # the record's flags, just before the CRC
    data[-5] = 0x04
    data[-4:] = zlib.crc32(data[:-4]).to_bytes(4, "big")
    with pytest.raises(IntegrityError, match="record flags"):
        decode_catalog(bytes(data))


def test_small_bodies_stay_raw_and_large_ones_are_compressed() -> None:
    one = encode_catalog(_sample()[:1])
    assert one[5] == 0  # flags: raw
    many = encode_catalog(_sample())
    assert many[5] == 1  # flags: zstd
    assert len(many) < sum(len(r.key) for r in _sample())


@pytest.mark.parametrize("cut", [0, 1, 4, 6, 10, -5, -1])
def test_truncated_objects_are_refused(cut: int) -> None:
    data = encode_catalog(_sample())
    with pytest.raises(IntegrityError):
        decode_catalog(data[:cut])


def test_every_flipped_byte_is_caught() -> None:
    data = encode_catalog(_sample()[:3])
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0x40
        with pytest.raises(IntegrityError):
            decode_catalog(bytes(damaged))


def test_index_answers_only_for_what_the_backend_lists() -> None:
    index = CatalogIndex()
    index.add(_sample()[:2])
    first = _sample()[0]
    assert index.lookup(first.key, first.backend_etag, first.stored_size) == first
    assert index.lookup(first.key, "other-etag", first.stored_size) is None  # overwritten elsewhere
    assert index.lookup(first.key, first.backend_etag, first.stored_size + 1) is None  # size disagrees
    assert index.lookup("passthrough.bin", "e", 1) is None
    overwrite = CatalogRecord(first.key, "newer", 1, 2, "c", 3)
    index.add([overwrite])
    assert index.lookup(first.key, "newer", 1) == overwrite
    assert index.lookup(first.key, first.backend_etag, first.stored_size) == first
    index.retain([(first.key, "newer")])
    assert len(index) == 1 and list(index.records()) == [overwrite]


def test_object_names_sort_by_time() -> None:
    names = [catalog_object_name(ms, "a1b2", seq) for ms, seq in [(5, 2), (40, 1), (1_000_000, 0)]]
    assert names == sorted(names)


def test_tombstones_retire_earlier_versions_only() -> None:
    from tsproxy.format.catalog import tombstone

    index = CatalogIndex()
    old = CatalogRecord("k", "e1", 1, 2, "c1", 100)
    newer = CatalogRecord("k", "e2", 1, 2, "c2", 300)
    index.add([old, tombstone("k", 200), newer, CatalogRecord("k", "e0", 1, 2, "c0", 50)])
    assert index.lookup("k", "e1", 1) is None and index.lookup("k", "e0", 1) is None
    assert index.lookup("k", "e2", 1) == newer
    assert [t.key for t in index.tombstones(150)] == ["k"] and not list(index.tombstones(250))
    round_tripped = CatalogIndex()
    round_tripped.add(decode_catalog(encode_catalog([*index.records(), *index.tombstones(0)])))
    assert round_tripped.lookup("k", "e2", 1) == newer


def test_a_key_keeps_its_newest_versions() -> None:
    index = CatalogIndex()
    index.add(CatalogRecord("k", f"e{i}", 1, 2, "c", i) for i in range(5))
    assert [r.backend_etag for r in index.records()] == ["e3", "e4"]
