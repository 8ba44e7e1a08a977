"""Format v2's runs of zstd frames: any range of a chunk reads back exactly, inflating only the frames
that hold it, and a hostile run is an IntegrityError, never a crash, an over-read or wrong bytes."""

from __future__ import annotations

import os

import pytest
import zstandard
from fmt_helpers import make_data
from hypothesis import given, settings
from hypothesis import strategies as st

from tsproxy.errors import IntegrityError
from tsproxy.format import (
    ChunkDecoder,
    ChunkRef,
    KeyRing,
    Manifest,
    ObjectContext,
    SegmentEncoder,
    TransformSettings,
    build_manifest,
)
from tsproxy.format.stages import ZstdStage
from tsproxy.format.zstdframes import FRAME_SIZE, Frame, FrameError, covering, frames

KIB = 1024


@st.composite
def chunk_and_range(draw: st.DrawFn) -> tuple[bytes, int, int, int]:
    """(chunk, frame size, start, stop): compressible or not, frames small enough to be many."""
    frame = draw(st.sampled_from((512, 1000, 4096)))
    size = draw(st.integers(1, 6 * frame + 7))
    kind = draw(st.sampled_from(("text", "noise", "zeros")))
    data = (
        make_data("text", size, draw(st.integers(0, 5)))
        if kind == "text"
        else os.urandom(size)
        if kind == "noise"
        else bytes(size)
    )
    start = draw(st.integers(0, size))
    stop = draw(st.integers(start, size))
    return data, frame, start, stop


@settings(max_examples=200, deadline=None)
@given(chunk_and_range())
def test_any_range_of_a_run_reads_back_exactly(case: tuple[bytes, int, int, int]) -> None:
    data, frame, start, stop = case
    packed = ZstdStage(1, frame).seal(memoryview(data))
    down = ZstdStage()
    assert down.open(packed, len(data)) == data
    assert down.open_range(packed, len(data), start, stop) == data[start:stop]
    if len(packed) < len(data):  # compressed: a run of frames of `frame` bytes, the last shorter
        run = frames(packed, len(data))
        assert [f.content_size for f in run[:-1]] == [frame] * (len(run) - 1)
        assert 0 < run[-1].content_size <= frame
        assert sum(f.length for f in run) == len(packed)


def test_a_partial_read_inflates_only_the_frames_it_needs() -> None:
    data = make_data("text", 4 * FRAME_SIZE, 3)
    packed = ZstdStage(1, FRAME_SIZE).seal(memoryview(data))
    run = frames(packed, len(data))
    assert len(run) == 4
    assert covering(run, 0, 1) == (0, 1, 0)
    assert covering(run, FRAME_SIZE - 1, FRAME_SIZE + 1) == (0, 2, 0)
    assert covering(run, 2 * FRAME_SIZE + 5, 3 * FRAME_SIZE) == (2, 3, 2 * FRAME_SIZE)
    assert covering(run, 3 * FRAME_SIZE, 4 * FRAME_SIZE) == (3, 4, 3 * FRAME_SIZE)
    down = ZstdStage()
    inflated: list[int] = []
    inflate = down._inflate

    def counting(payload: bytes | memoryview, frame: Frame) -> bytes:
        inflated.append(frame.offset)
        return inflate(payload, frame)

    down._inflate = counting  # type: ignore[method-assign]
    assert down.open_range(packed, len(data), 10, 20) == data[10:20]
    assert inflated == [run[0].offset]
    inflated.clear()
    assert (
        down.open_range(packed, len(data), 2 * FRAME_SIZE - 1, 2 * FRAME_SIZE + 1)
        == data[2 * FRAME_SIZE - 1 : 2 * FRAME_SIZE + 1]
    )
    assert inflated == [run[1].offset, run[2].offset]


def test_runs_that_do_not_add_up_are_refused() -> None:
    data = make_data("text", 10 * KIB, 1)
    packed = ZstdStage(1, 4 * KIB).seal(memoryview(data))
    down = ZstdStage()
    with pytest.raises(IntegrityError, match="declares"):
        down.open(packed, len(data) - 1)
    with pytest.raises(IntegrityError, match="declares"):
        down.open(packed[: frames(packed, len(data))[-1].offset], len(data))  # last frame dropped
    with pytest.raises(IntegrityError):
        down.open(packed + packed[:100], len(data) + 100)  # a frame cut short at the end
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    with pytest.raises(IntegrityError, match="content size"):
        down.open(no_size, len(data))
    with pytest.raises(ValueError):
        down.open_range(packed, len(data), 5, 4)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_a_mangled_run_is_an_integrity_error_or_the_original(data: st.DataObject) -> None:
    original = make_data("text", 9000, 2)
    packed = bytearray(ZstdStage(3, 2000).seal(memoryview(original)))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(packed) - 1))
        packed[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        packed = packed[: data.draw(st.integers(0, len(packed)))]
    down = ZstdStage()
    start = data.draw(st.integers(0, len(original)))
    stop = data.draw(st.integers(start, len(original)))
    try:
        got = down.open_range(bytes(packed), len(original), start, stop)
    except IntegrityError:
        return
    # Unauthenticated here (the seal is what authenticates a chunk): a run may still inflate, to the
    # declared sizes; the point is that nothing but IntegrityError escapes and nothing over-reads.
    assert len(got) == stop - start


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 1 << 21))
def test_random_bytes_never_crash_the_frame_walker(payload: bytes, total: int) -> None:
    try:
        run = frames(b"\x28\xb5\x2f\xfd" + payload, total)
    except FrameError:
        return
    assert all(isinstance(f, Frame) and f.length > 0 for f in run)


def _first_chunk(
    settings_: TransformSettings, ring: KeyRing | None, data: bytes
) -> tuple[Manifest, ChunkDecoder, ChunkRef, bytes]:
    """data stored as one segment: its manifest, a decoder of it, and its first chunk (ref, stored bytes)."""
    ctx = ObjectContext.new(settings_, ring)
    enc = SegmentEncoder(ctx, settings_, 1)
    stored = b"".join(enc.feed(data) + enc.finish())
    manifest = build_manifest(
        ctx, settings_, [enc.info], etag="x", md5=None, content_type=None, metadata={}, headers={}
    )
    ref = manifest.index.chunk(0)
    return (
        manifest,
        ChunkDecoder(manifest, ctx),
        ref,
        stored[ref.stored_offset : ref.stored_offset + ref.stored_len],
    )


@pytest.mark.parametrize("version", [1, 2])
def test_chunk_decoder_reads_ranges_of_both_versions(ring: KeyRing, version: int) -> None:
    settings_ = TransformSettings(chunk_size=3 << 20, compression="on", format_version=version)
    data = make_data("text", (3 << 20) + 12345, 4)
    manifest, decoder, ref, chunk = _first_chunk(settings_, ring, data)
    assert manifest.version == version
    assert decoder.decode(ref, chunk) == data[: 3 << 20]
    for start, stop in ((0, 1), (FRAME_SIZE - 3, FRAME_SIZE + 3), (2 * FRAME_SIZE, 3 << 20), (7, 7)):
        assert decoder.decode_range(ref, chunk, start, stop) == data[start:stop]
    tampered = bytearray(chunk)
    tampered[-1] ^= 1
    with pytest.raises(IntegrityError):
        decoder.decode_range(ref, bytes(tampered), 0, 10)  # the seal covers the whole chunk


@pytest.mark.parametrize("frame_size", [FRAME_SIZE, 1 << 20, 100_000])
def test_the_frame_size_is_the_writers_choice_and_any_one_reads(frame_size: int) -> None:
    # The default (256 KiB), the 1 MiB of objects written by releases before, and an odd size: the
    # writer cuts each chunk into frames of that size and a decoder, told nothing of it, reads any range.
    settings_ = TransformSettings(
        chunk_size=1 << 20, compression="on", encryption=False, frame_size=frame_size
    )
    data = make_data("text", (1 << 20) + 777, 6)
    _, decoder, ref, chunk = _first_chunk(settings_, None, data)  # unencrypted: the chunk is its frames
    sizes = [f.content_size for f in frames(chunk, 1 << 20)]
    assert sizes == [frame_size] * ((1 << 20) // frame_size) + (
        [(1 << 20) % frame_size] if (1 << 20) % frame_size else []
    )
    assert decoder.decode(ref, chunk) == data[: 1 << 20]
    for start, stop in ((0, 1), (frame_size - 1, min(frame_size + 1, 1 << 20)), (300_000, 1 << 20)):
        assert decoder.decode_range(ref, chunk, start, stop) == data[start:stop]


def test_frame_sizes_out_of_range_are_refused() -> None:
    for bad in (0, 4095, (64 << 20) + 1, "256KiB"):
        with pytest.raises(Exception, match="frame_size"):
            TransformSettings(frame_size=bad)  # type: ignore[arg-type]
