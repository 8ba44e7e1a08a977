"""EarlyFrames: a chunk's frames found while its stored bytes arrive, used only when verification agrees."""

from __future__ import annotations

import itertools

import pytest
from fmt_helpers import KIB, encode_multipart, make_data
from hypothesis import given, settings
from hypothesis import strategies as st

from tsproxy.errors import IntegrityError
from tsproxy.format import KeyRing, ObjectContext, TransformSettings
from tsproxy.format.decoder import ChunkDecoder
from tsproxy.format.early import EarlyFrames
from tsproxy.format.index import ChunkRef
from tsproxy.format.stages import FrameStep, Payload, ZstdStage
from tsproxy.format.zstdframes import Frame, frames

CHUNK = 64 * KIB
FRAME = 4 * KIB
RING = KeyRing.new(key_id="early")


def _object(encrypted: bool, kind: str) -> tuple[bytes, bytes, ChunkDecoder, list[ChunkRef]]:
    conf = TransformSettings(chunk_size=CHUNK, compression="on", encryption=encrypted, frame_size=FRAME)
    data = make_data(kind, 3 * CHUNK + 1234, 7)
    ring = RING if encrypted else None
    ctx = ObjectContext.new(conf, ring)
    stored, manifest = encode_multipart([(1, data)], conf, ring, ctx=ctx)
    refs = [manifest.index.chunk(i) for i in range(len(manifest.index))]
    return data, stored, ChunkDecoder(manifest, ctx), refs


def _feed(early: EarlyFrames, stored: bytes, cuts: list[int]) -> list[tuple[Frame, bytes]]:
    """Feed a chunk's stored bytes cut at `cuts`; every frame handed out, in order."""
    out = []
    edges = [0, *sorted({c for c in cuts if 0 < c < len(stored)}), len(stored)]
    for a, b in itertools.pairwise(edges):
        out += early.feed(memoryview(stored)[a:b])
    return out


def _inflated(found: list[tuple[Frame, bytes]]) -> bytes:
    zstd = ZstdStage()
    return b"".join(zstd._inflate(data, Frame(0, frame.length, frame.content_size)) for frame, data in found)


@settings(max_examples=60, deadline=None)
@given(
    encrypted=st.booleans(),
    kind=st.sampled_from(("text", "mixed")),
    chunk=st.integers(0, 3),
    span=st.tuples(st.integers(0, CHUNK), st.integers(1, CHUNK)),
    cuts=st.lists(st.integers(0, CHUNK), max_size=12),
)
def test_the_frames_found_early_are_the_ones_verification_gives(
    encrypted: bool, kind: str, chunk: int, span: tuple[int, int], cuts: list[int]
) -> None:
    data, stored, decoder, refs = _object(encrypted, kind)
    ref = refs[chunk]
    start = min(span[0], ref.original_len - 1)
    stop = min(start + span[1], ref.original_len)
    piece = stored[ref.stored_offset : ref.stored_offset + ref.stored_len]
    payload, plan = decoder.open_range(ref, piece, start, stop)
    early = decoder.early(ref, start, stop)
    if plan is None:  # stored as it is: nothing to inflate, nothing to find
        assert early is None
        return
    assert early is not None
    found = _feed(early, piece, cuts)
    assert [f for f, _ in found] == [f for f, _, _ in plan]
    assert early.matches(payload, plan)
    original = data[ref.original_offset : ref.original_offset + ref.original_len]
    first = sum(f.content_size for f in _frames_before(payload, ref, plan))
    whole = _inflated(found)
    assert whole[start - first : stop - first] == original[start:stop]


def _frames_before(payload: Payload, ref: ChunkRef, plan: list[FrameStep]) -> list[Frame]:
    run = frames(payload, ref.original_len)
    return run[: run.index(plan[0][0])]


@pytest.mark.parametrize("encrypted", [True, False])
def test_a_tampered_chunk_is_refused_whatever_was_found_early(encrypted: bool) -> None:
    """Bytes changed inside the frames a read needs: what is found early may be garbage or nothing,
    and the verification that must come before any of it is used fails."""
    _, stored, decoder, refs = _object(encrypted, "text")
    ref = refs[1]
    piece = bytearray(stored[ref.stored_offset : ref.stored_offset + ref.stored_len])
    piece[len(piece) // 3] ^= 0x40
    early = decoder.early(ref, 10 * KIB, 30 * KIB)
    assert early is not None
    _feed(early, bytes(piece), [1000, 5000])
    with pytest.raises(IntegrityError):
        decoder.open_range(ref, bytes(piece), 10 * KIB, 30 * KIB)


def test_frames_found_in_other_bytes_do_not_match_the_verified_payload() -> None:
    """Another chunk's bytes fed in its place (as a wrong keystream or a mix-up would give): frames may
    well be found, but none matches the chunk's verified payload, so none is used."""
    _, stored, decoder, refs = _object(False, "text")
    ref, other = refs[1], refs[2]
    early = decoder.early(ref, 0, 20 * KIB)
    assert early is not None
    _feed(early, stored[other.stored_offset : other.stored_offset + other.stored_len], [])
    piece = stored[ref.stored_offset : ref.stored_offset + ref.stored_len]
    payload, plan = decoder.open_range(ref, piece, 0, 20 * KIB)
    assert plan is not None
    assert not early.matches(payload, plan)


def test_garbage_ends_the_search_without_an_error() -> None:
    _, _, decoder, refs = _object(True, "text")
    ref = refs[0]
    early = decoder.early(ref, 0, CHUNK)
    assert early is not None
    assert early.feed(memoryview(bytes(ref.stored_len))) == []  # zeros decrypt to noise: no frame
    assert early.feed(memoryview(b"more")) == []
