"""Tampered, truncated or mis-keyed stored data gives a typed error, never bytes."""

from __future__ import annotations

import pytest
from fmt_helpers import encode_multipart, make_data
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tsproxy.errors import FormatError, IntegrityError, KeyNotFound
from tsproxy.format import (
    MIN_CHUNK_SIZE,
    TRAILER_SIZE,
    ChunkDecoder,
    KeyRing,
    ObjectContext,
    TransformSettings,
    decode_object,
    decode_tail,
    encode_object,
    encode_tail,
    open_object,
    read_range,
    tail_length,
)
from tsproxy.format.settings import CompressionMode

REFUSALS = (FormatError, KeyNotFound)  # IntegrityError is a FormatError
fixture_ok = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _stored(
    ring: KeyRing | None, encryption: bool, compression: CompressionMode = "on"
) -> tuple[bytes, bytes]:
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE, compression=compression, encryption=encryption)
    original = make_data("mixed", 2 * MIN_CHUNK_SIZE + 1000, 7)
    return original, encode_object(original, cfg, ring, content_type="a/b", metadata={"owner": "x"})


@pytest.fixture(scope="module")
def encrypted(ring: KeyRing) -> tuple[bytes, bytes]:
    return _stored(ring, True)


@pytest.fixture(scope="module")
def plain() -> tuple[bytes, bytes]:
    return _stored(None, False)


def _flip(stored: bytes, bit: int) -> bytes:
    out = bytearray(stored)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


@fixture_ok
@given(st.data())
def test_flipped_bit_anywhere_is_refused(
    ring: KeyRing, encrypted: tuple[bytes, bytes], plain: tuple[bytes, bytes], data: st.DataObject
) -> None:
    for stored, keyring in ((encrypted[1], ring), (plain[1], None)):
        # Half the draws land in the tail, where the fields are dense.
        tail_bits = 8 * tail_length(stored[-TRAILER_SIZE:])
        bit = data.draw(
            st.one_of(
                st.integers(0, 8 * len(stored) - 1),
                st.integers(8 * len(stored) - tail_bits, 8 * len(stored) - 1),
            )
        )
        with pytest.raises(REFUSALS):
            decode_object(_flip(stored, bit), keyring)


def test_every_tail_bit_flip_is_refused(
    ring: KeyRing, encrypted: tuple[bytes, bytes], plain: tuple[bytes, bytes]
) -> None:
    for stored, keyring in ((encrypted[1], ring), (plain[1], None)):
        tail_len = tail_length(stored[-TRAILER_SIZE:])
        for bit in range(8 * (len(stored) - tail_len), 8 * len(stored)):
            with pytest.raises(REFUSALS):
                decode_object(_flip(stored, bit), keyring)


@pytest.mark.parametrize("encryption", [True, False])
def test_swapped_chunks_are_refused(ring: KeyRing, encryption: bool) -> None:
    original, stored = _stored(ring, encryption, compression="off")
    manifest, ctx = open_object(stored, ring)
    a, b = manifest.index.chunk(0), manifest.index.chunk(1)
    assert a.stored_len == b.stored_len
    chunk_a = stored[a.stored_offset : a.stored_offset + a.stored_len]
    chunk_b = stored[b.stored_offset : b.stored_offset + b.stored_len]
    swapped = chunk_b + chunk_a + stored[b.stored_offset + b.stored_len :]
    with pytest.raises(IntegrityError):
        decode_object(swapped, ring)
    decoder = ChunkDecoder(manifest, ctx)
    with pytest.raises(IntegrityError):
        decoder.decode(a, chunk_b)
    assert decoder.decode(a, chunk_a) == original[: a.original_len]


def test_chunk_from_another_object_is_refused(ring: KeyRing) -> None:
    _, first = _stored(ring, True, compression="off")
    _, second = _stored(ring, True, compression="off")
    manifest, _ = open_object(first, ring)
    ref = manifest.index.chunk(1)
    moved = (
        first[: ref.stored_offset]
        + second[ref.stored_offset : ref.stored_offset + ref.stored_len]
        + first[ref.stored_offset + ref.stored_len :]
    )
    with pytest.raises(IntegrityError):
        decode_object(moved, ring)
    with pytest.raises(IntegrityError):
        read_range(moved, ring, ref.original_offset, ref.original_offset)


def test_chunk_moved_between_segments_of_one_object_is_refused(ring: KeyRing) -> None:
    # One DEK and one salt for both segments: only the segment number in the associated data differs.
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE, compression="off")
    ctx = ObjectContext.new(cfg, ring)
    payload = make_data("random", 1000, 1)
    stored, manifest = encode_multipart(
        [(1, payload), (2, payload)], cfg, ring, ctx=ctx, salts={1: b"samesalt", 2: b"samesalt"}
    )
    a, b = manifest.index.chunk(0), manifest.index.chunk(1)
    swapped = (
        stored[b.stored_offset : b.stored_offset + b.stored_len]
        + stored[a.stored_offset : a.stored_offset + a.stored_len]
    )
    swapped += stored[b.stored_offset + b.stored_len :]
    with pytest.raises(IntegrityError):
        decode_object(swapped, ring)


def test_truncated_objects_are_refused(ring: KeyRing, encrypted: tuple[bytes, bytes]) -> None:
    _, stored = encrypted
    manifest, _ = open_object(stored, ring)
    tail = stored[manifest.data_size :]
    last = manifest.index.chunk(len(manifest.index) - 1)
    cases = [
        stored[:-1],  # trailer cut
        stored[: manifest.data_size],  # tail gone
        stored[: last.stored_offset] + tail,  # last chunk dropped, tail kept
        stored[: last.stored_offset + last.stored_len - 1] + tail,  # last chunk cut short
        tail,  # no data at all
        stored[: manifest.data_size] + b"extra" + tail,  # data area longer than the manifest says
        stored[-TRAILER_SIZE:],
        b"",
    ]
    for case in cases:
        with pytest.raises(REFUSALS):
            decode_object(case, ring)


def test_last_chunk_flag_is_authenticated(ring: KeyRing) -> None:
    # Cutting a segment after a full chunk and presenting it as complete needs the chunk to claim `last`.
    _, stored = _stored(ring, True, compression="off")
    manifest, ctx = open_object(stored, ring)
    ref = manifest.index.chunk(0)
    fake = type(ref)(**{**ref.__dict__, "last": True})
    with pytest.raises(IntegrityError):
        ChunkDecoder(manifest, ctx).decode(
            fake, stored[ref.stored_offset : ref.stored_offset + ref.stored_len]
        )


def test_wrong_or_missing_kek(ring: KeyRing, encrypted: tuple[bytes, bytes]) -> None:
    _, stored = encrypted
    with pytest.raises(KeyNotFound):
        decode_object(stored, None)
    with pytest.raises(KeyNotFound):
        decode_object(stored, KeyRing.new(key_id="some-other-key"))
    impostor = KeyRing.new(key_id=ring.active_id)  # same id, different material
    with pytest.raises(IntegrityError):
        decode_object(stored, impostor)


def test_manifest_rewritten_without_the_dek_is_refused(ring: KeyRing, encrypted: tuple[bytes, bytes]) -> None:
    # An attacker who can rewrite the tail but not unwrap the DEK cannot produce a matching HMAC.
    _, stored = encrypted
    manifest, ctx = open_object(stored, ring)
    forged_ctx = ObjectContext(ctx.object_id, b"\x00" * 32, ctx.kek_id, ctx.wrapped_dek)
    for forged in (
        manifest.replace(metadata={"owner": "mallory"}),
        manifest.replace(content_type="text/html"),
        manifest.replace(etag="0" * 32),
        manifest,
    ):
        tampered = stored[: manifest.data_size] + encode_tail(forged, forged_ctx)
        with pytest.raises(IntegrityError, match="HMAC"):
            decode_object(tampered, ring)


def test_tail_of_another_object_is_refused(ring: KeyRing) -> None:
    _, first = _stored(ring, True, compression="off")
    _, second = _stored(ring, True, compression="off")
    m1, _ = open_object(first, ring)
    m2, _ = open_object(second, ring)
    assert m1.data_size == m2.data_size
    mixed = first[: m1.data_size] + second[m2.data_size :]
    with pytest.raises(IntegrityError):
        decode_object(mixed, ring)


def test_plain_tail_must_cover_the_manifest() -> None:
    _, stored = _stored(None, False)
    needed = tail_length(stored[-TRAILER_SIZE:])
    with pytest.raises(FormatError):
        decode_tail(stored[-(needed - 1) :], None)
    decode_tail(stored[-needed:], None)


def test_garbage_after_a_valid_magic_is_refused() -> None:
    for body in (b"", b"\x01" * 40, bytes(200)):
        for length in (0, 5, len(body), len(body) + 16, 2**32 - 1):
            trailer = length.to_bytes(4, "big") + b"\x00\x01\x00\x00\x89TSPROXY"
            with pytest.raises(REFUSALS):
                decode_object(body + trailer, None)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_tails_never_crash(body: bytes) -> None:
    trailer = len(body).to_bytes(4, "big") + b"\x00\x01\x00\x00\x89TSPROXY"
    with pytest.raises(REFUSALS):
        decode_tail(body + trailer, None)
