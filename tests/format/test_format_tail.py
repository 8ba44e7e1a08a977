"""Finding an object's tail from its end: at most two reads, the tail exactly, typed errors otherwise."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tsproxy.errors import FormatError, IntegrityError
from tsproxy.format import MAGIC, MIN_CHUNK_SIZE, TRAILER_SIZE, TransformSettings, decode_tail, encode_object
from tsproxy.format.manifest import META_TAIL_LENGTH, tail_length
from tsproxy.format.tail import TAIL_GUESS, TailSearch, TailTooLong, find_tail, first_read, metadata_guess

SETTINGS = TransformSettings(chunk_size=MIN_CHUNK_SIZE, compression="off", encryption=False)
# Stored objects of 0, 1 and 40 chunks (the manifest grows with the chunk count).
SIZES = (0, 1000, 40 * MIN_CHUNK_SIZE)
STORED = [encode_object(bytes(range(256)) * (n // 256), SETTINGS, None) for n in SIZES]


def tail_of(stored: bytes) -> bytes:
    return stored[len(stored) - tail_length(stored) :]


def search(stored: bytes, guess: int) -> tuple[TailSearch, list[int]]:
    """Follow find_tail's answers over `stored` as a reader does; also the suffix lengths read."""
    reads = [first_read(guess)]
    found = find_tail(stored[-reads[-1] :] if reads[-1] < len(stored) else stored, len(stored))
    while found.read_next:
        assert len(reads) < 3, "more than two reads"
        reads.append(found.read_next)
        found = find_tail(stored[-reads[-1] :] if reads[-1] < len(stored) else stored, len(stored))
    return found, reads


@given(st.sampled_from(STORED), st.binary(max_size=300), st.integers(0, 3000))
def test_finds_the_tail_in_one_read_when_the_guess_holds_it_else_two(
    stored: bytes, prefix: bytes, guess: int
) -> None:
    obj = prefix + stored  # whatever precedes the tail, the tail is found from the end alone
    tail = tail_of(stored)
    found, reads = search(obj, guess)
    assert found.has_trailer and found.length == len(tail)
    assert found.tail is not None and bytes(found.tail) == tail
    assert len(reads) == (1 if max(guess, TRAILER_SIZE) >= len(tail) else 2)
    assert reads[-1] >= len(tail) and (len(reads) == 1 or reads[-1] == len(tail))
    manifest, _ = decode_tail(found.tail, None)
    assert manifest.data_size == len(stored) - len(tail)


@given(st.binary(max_size=200), st.integers(0, 300))
def test_an_object_without_the_magic_costs_one_read(data: bytes, guess: int) -> None:
    if data.endswith(MAGIC):
        data += b"x"
    found, reads = search(data, guess)
    assert found == TailSearch(0, 0, None) and len(reads) == 1 and not found.has_trailer


@given(st.sampled_from(STORED[1:]), st.data())
def test_a_tail_longer_than_the_object_is_a_truncation(stored: bytes, data: st.DataObject) -> None:
    tail = tail_of(stored)
    kept = data.draw(st.integers(TRAILER_SIZE, len(tail) - 1))  # the object's start was cut away
    cut = stored[-kept:]
    with pytest.raises(TailTooLong) as e:
        find_tail(cut, len(cut))
    assert isinstance(e.value, IntegrityError)
    assert (e.value.length, e.value.size) == (len(tail), kept)
    assert str(e.value) == f"the trailer names a {len(tail)}-byte tail in a {kept}-byte object"


def test_less_than_a_trailer_of_a_longer_object_asks_for_the_trailer() -> None:
    stored = STORED[1]
    assert find_tail(stored[-5:], len(stored)) == TailSearch(0, TRAILER_SIZE, None)
    assert find_tail(b"", 0) == TailSearch(0, 0, None)  # an empty object has no trailer
    assert find_tail(stored[-5:], 5) == TailSearch(0, 0, None)  # a 5-byte object has none either


def test_an_unsupported_version_or_a_malformed_trailer_is_refused() -> None:
    stored = bytearray(STORED[1])
    length, version, reserved, magic = struct.unpack(">IHH8s", stored[-TRAILER_SIZE:])
    future = stored[:-TRAILER_SIZE] + struct.pack(">IHH8s", length, version + 1, reserved, magic)
    with pytest.raises(FormatError, match="not supported"):
        find_tail(future, len(future))
    malformed = stored[:-TRAILER_SIZE] + struct.pack(">IHH8s", length, version, 1, magic)
    with pytest.raises(IntegrityError, match="malformed"):
        find_tail(malformed, len(malformed))


def test_first_read_is_at_least_a_trailer() -> None:
    assert first_read(0) == first_read(-5) == TRAILER_SIZE
    assert first_read(TAIL_GUESS) == TAIL_GUESS == 64 << 10


@given(st.integers(0, 1 << 40), st.one_of(st.integers(-5, 1 << 41).map(str), st.text(max_size=6)))
def test_metadata_guess_is_the_recorded_length_when_plausible(size: int, recorded: str) -> None:
    guess = metadata_guess({META_TAIL_LENGTH: recorded}, size)
    plausible = recorded.isascii() and recorded.isdigit() and TRAILER_SIZE < int(recorded) <= size
    assert guess == (int(recorded) if plausible else TRAILER_SIZE)
    assert metadata_guess({}, size) == TRAILER_SIZE
