"""Manifest, segment info and tail encoding."""

from __future__ import annotations

import pytest
from fmt_helpers import encode_multipart, make_data
from hypothesis import given
from hypothesis import strategies as st

from tsproxy.errors import FormatError, IntegrityError
from tsproxy.format import (
    MIN_CHUNK_SIZE,
    TRAILER_SIZE,
    KeyRing,
    ObjectContext,
    SegmentEncoder,
    SegmentInfo,
    TransformSettings,
    build_manifest,
    decode_object,
    decode_tail,
    encode_object,
    encode_tail,
    is_tsproxy_trailer,
    open_object,
    tail_length,
)
from tsproxy.format.segment import MAX_SEGMENT_SIZE
from tsproxy.format.wire import Writer

texts = st.text(max_size=40)


@given(
    st.integers(1, 10000),
    st.one_of(st.just(b""), st.binary(min_size=8, max_size=8)),
    st.binary(min_size=16, max_size=16),
    st.integers(0, 40),
    st.booleans(),
    st.data(),
)
def test_segment_info_roundtrip(
    segment_no: int, salt: bytes, md5: bytes, chunks: int, compressed: bool, data: st.DataObject
) -> None:
    tag = 16 if salt else 0
    sizes = data.draw(st.lists(st.integers(1, MIN_CHUNK_SIZE + tag), min_size=chunks, max_size=chunks))
    original = 0 if not chunks else (chunks - 1) * MIN_CHUNK_SIZE + data.draw(st.integers(1, MIN_CHUNK_SIZE))
    crcs = (
        ()
        if salt
        else tuple(data.draw(st.lists(st.integers(0, 2**32 - 1), min_size=chunks, max_size=chunks)))
    )
    info = SegmentInfo(segment_no, salt, original, md5, tuple(sizes), compressed, crcs)
    assert SegmentInfo.from_bytes(info.to_bytes()) == info
    assert info.stored_size == sum(sizes)


def test_many_equal_chunks_pack_into_a_few_bytes() -> None:
    # Without compression every size is equal: 81920 chunks (a 5 GiB part in 64 KiB chunks) in a few bytes.
    count = MAX_SEGMENT_SIZE // MIN_CHUNK_SIZE
    info = SegmentInfo(7, b"salt0123", MAX_SEGMENT_SIZE, bytes(16), (MIN_CHUNK_SIZE + 16,) * count, False)
    raw = info.to_bytes()
    assert len(raw) == 1 + 1 + 1 + 8 + 5 + 16 + (3 + 3 + 1 + 0 + 3)  # the size list is 10 bytes
    assert SegmentInfo.from_bytes(raw) == info


def test_objects_of_many_equal_chunks_read_back(ring: KeyRing) -> None:
    for encryption in (True, False):
        cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE, compression="off", encryption=encryption)
        original = make_data("random", 300 * MIN_CHUNK_SIZE + 5, 1)
        stored = encode_object(original, cfg, ring)
        assert decode_object(stored, ring) == original
        stored, manifest = encode_multipart([(1, original), (2, original[:-5])], cfg, ring)
        assert len(manifest.index) == 601
        assert decode_tail(stored, ring)[0] == manifest


def test_segment_counts_are_bounded_before_allocation() -> None:
    w = Writer()
    w.u8(1)  # segment info version
    w.varint(1)
    w.u8(0x02)  # salt present
    w.raw(b"s" * 8)
    w.varint(MAX_SEGMENT_SIZE + 1)
    with pytest.raises(IntegrityError, match="exceeds"):
        SegmentInfo.from_bytes(bytes(w.buf) + bytes(16) + b"\x00")
    w = Writer()
    w.u8(1)
    w.varint(1)
    w.u8(0x00)  # neither salt nor CRC32Cs: must be empty
    w.varint(MIN_CHUNK_SIZE * 4)
    w.raw(bytes(16))
    w.varint(4)  # four chunks claimed
    with pytest.raises(IntegrityError, match="exceeds"):
        SegmentInfo.from_bytes(bytes(w.buf) + b"\x00" * 20)


def test_segment_info_rejects_bad_bytes() -> None:
    info = SegmentInfo(2, b"s" * 8, 10, bytes(16), (26,), True)
    raw = info.to_bytes()
    with pytest.raises(FormatError):
        SegmentInfo.from_bytes(b"\x07" + raw[1:])
    for cut in range(len(raw)):
        with pytest.raises(IntegrityError):
            SegmentInfo.from_bytes(raw[:cut])
    with pytest.raises(IntegrityError):
        SegmentInfo.from_bytes(raw + b"\x00")
    with pytest.raises(ValueError):
        SegmentInfo(0, b"", 0, bytes(16), (), False)
    with pytest.raises(ValueError):
        SegmentInfo(1, b"", 5, bytes(16), (5,), False)  # unencrypted needs CRC32Cs


@given(
    st.one_of(st.none(), texts),
    st.dictionaries(texts, texts, max_size=5),
    st.dictionaries(texts, texts, max_size=3),
    st.booleans(),
)
def test_client_metadata_roundtrip(
    content_type: str | None, metadata: dict[str, str], headers: dict[str, str], encryption: bool
) -> None:
    ring = KeyRing.new(key_id="m")
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE, encryption=encryption)
    stored = encode_object(
        b"payload", cfg, ring, content_type=content_type, metadata=metadata, headers=headers
    )
    manifest, _ = decode_tail(stored, ring)
    assert (manifest.content_type, manifest.metadata, manifest.headers) == (content_type, metadata, headers)
    assert manifest.md5 is not None and manifest.etag == manifest.md5.hex()


def test_manifest_fields_and_backend_metadata(ring: KeyRing) -> None:
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE, compression="on", level=5)
    parts = [(1, make_data("text", 100_000, 1)), (3, make_data("random", 10, 2))]
    stored, manifest = encode_multipart(
        parts, cfg, ring, metadata={"x": "1"}, headers={"Cache-Control": "no-store"}
    )
    decoded, ctx = decode_tail(stored, ring)
    assert decoded == manifest
    assert (decoded.size, decoded.chunk_size, decoded.compression, decoded.level) == (
        100_010,
        MIN_CHUNK_SIZE,
        "on",
        5,
    )
    assert decoded.md5 is None and decoded.etag.endswith("-2") and decoded.encrypted
    assert decoded.headers == {"Cache-Control": "no-store"}
    assert len(decoded.index) == 3
    tail_len = tail_length(stored[-TRAILER_SIZE:])
    assert decoded.backend_metadata(tail_len) == {
        "tsproxy-format": "2",
        "tsproxy-size": "100010",
        "tsproxy-etag": decoded.etag,
        "tsproxy-tail-length": str(tail_len),
    }
    assert len(stored) == decoded.data_size + tail_len
    new = decoded.replace(metadata={"y": "2"}, content_type="text/csv")
    assert new.index.size == decoded.size and new.metadata == {"y": "2"}
    restored = stored[: decoded.data_size] + encode_tail(new, ctx)
    assert decode_tail(restored, ring)[0] == new
    assert decode_object(restored, ring) == b"".join(p for _, p in parts)


def test_trailer_recognition() -> None:
    stored = encode_object(b"hello", TransformSettings(encryption=False), None)
    assert is_tsproxy_trailer(stored[-TRAILER_SIZE:]) and is_tsproxy_trailer(stored)
    assert stored.endswith(b"\x89TSPROXY")
    for other in (b"", b"x" * 15, b"PAR1" * 4, stored[:-1], bytes(16)):
        assert not is_tsproxy_trailer(other)
        with pytest.raises(FormatError):
            tail_length(other)
    future = bytearray(stored[-TRAILER_SIZE:])
    future[4:6] = (3).to_bytes(2, "big")
    with pytest.raises(FormatError, match="version 3"):
        tail_length(bytes(future))


def test_build_manifest_checks_the_segments(ring: KeyRing) -> None:
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE)
    ctx = ObjectContext.new(cfg, ring)
    infos = []
    for no in (2, 1):
        enc = SegmentEncoder(ctx, cfg, no)
        enc.feed(bytes(70_000))
        enc.finish()
        infos.append(enc.info)

    def build(segments: list[SegmentInfo], settings: TransformSettings = cfg) -> object:
        return build_manifest(
            ctx, settings, segments, etag="e", md5=None, content_type=None, metadata={}, headers={}
        )

    with pytest.raises(ValueError, match="ascending"):
        build(infos)
    build(infos[::-1])
    with pytest.raises(ValueError, match="chunks"):
        build(infos[::-1], TransformSettings(chunk_size=2 * MIN_CHUNK_SIZE))
    plain = TransformSettings(chunk_size=MIN_CHUNK_SIZE, encryption=False)
    with pytest.raises(ValueError, match="encryption"):
        build_manifest(
            ObjectContext.new(plain, None),
            plain,
            infos[::-1],
            etag="e",
            md5=None,
            content_type=None,
            metadata={},
            headers={},
        )


def test_tail_must_match_its_context(ring: KeyRing) -> None:
    stored = encode_object(b"abc", TransformSettings(), ring)
    manifest, _ = open_object(stored, ring)
    with pytest.raises(ValueError):
        encode_tail(manifest, ObjectContext.new(TransformSettings(), ring))


def test_empty_object(ring: KeyRing) -> None:
    for encryption in (True, False):
        stored = encode_object(b"", TransformSettings(encryption=encryption), ring)
        manifest, _ = open_object(stored, ring)
        assert manifest.size == 0 and len(manifest.index) == 0 and manifest.data_size == 0
        assert decode_object(stored, ring) == b""
