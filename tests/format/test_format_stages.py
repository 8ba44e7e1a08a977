"""The transform stages one by one, the registry that names them, and the chains that compose them."""

from __future__ import annotations

import os

import pytest
import zstandard
from fmt_helpers import make_data
from golden_cases import CASES_V1, golden_ring

from tsproxy.errors import IntegrityError
from tsproxy.format import KeyRing, ObjectContext, TransformSettings, decode_tail
from tsproxy.format.context import TAG_SIZE
from tsproxy.format.pipeline import CODECS, SEAL_FLAG_BITS, SEALS, Stages, UploadChain
from tsproxy.format.stages import AesGcmSeal, Crc32cSeal, SealStage, ZstdStage

CHUNK = 64 * 1024


def _context(keyed: bool, ring: KeyRing) -> ObjectContext:
    return ObjectContext.new(TransformSettings(encryption=keyed), ring)


@pytest.mark.parametrize(
    ("name", "names", "flag"),
    [("plain", ("zstd", "crc32c"), 0), ("encrypted-multipart", ("zstd", "aes-256-gcm"), 1)],
)
def test_golden_manifests_name_their_stages(name: str, names: tuple[str, str], flag: int) -> None:
    case = next(c for c in CASES_V1 if c.name == name)
    stored = case.path.read_bytes()
    manifest, _ = decode_tail(stored, golden_ring())
    assert manifest.stages.names == names
    assert manifest.encrypted == (flag == 1)
    # The stages are named by what v1 already records: bit 0 of the manifest's flags, nothing more.
    body_start = len(stored) - 16 - int.from_bytes(stored[-16:-12], "big")
    assert stored[body_start] & SEAL_FLAG_BITS == flag == manifest.stages.manifest_flags


def test_registry_maps_each_seal_to_its_own_flags_and_back() -> None:
    flags = [flag for _, flag in SEALS.values()]
    assert len(set(flags)) == len(flags)
    assert SEAL_FLAG_BITS & (0x02 | 0x04) == 0  # the MD5 and content-type bits stay theirs
    for name, (stage, flag) in SEALS.items():
        assert stage.name == name
        assert Stages.from_manifest_flags(flag | 0x06) == Stages("zstd", name)
    assert set(CODECS) == {"zstd"}
    with pytest.raises(ValueError, match="seal"):
        Stages("zstd", "rot13")
    with pytest.raises(ValueError, match="compression"):
        Stages("lz4", "crc32c")


@pytest.mark.parametrize("keyed", [True, False])
def test_seal_stage_opens_what_it_sealed_and_only_at_its_position(keyed: bool, ring: KeyRing) -> None:
    ctx = _context(keyed, ring)
    stage_type = AesGcmSeal if keyed else Crc32cSeal
    assert Stages.for_context(ctx).seal_stage is stage_type
    writer = stage_type.for_segment(ctx, 3)
    payloads = [os.urandom(n) for n in (CHUNK, CHUNK, 10)]
    stored = [writer.seal(memoryview(p), i, i == 2) for i, p in enumerate(payloads)]
    assert [len(s) for s in stored] == [len(p) + stage_type.overhead for p in payloads]
    assert writer.overhead == (TAG_SIZE if keyed else 0)
    assert (len(writer.salt), len(writer.crcs)) == ((8, 0) if keyed else (0, 3))

    reader: SealStage = stage_type.for_segment(ctx, 3, writer.salt, writer.crcs)
    for i, (p, s) in enumerate(zip(payloads, stored, strict=True)):
        assert bytes(reader.open(memoryview(s), i, i == 2)) == p
    flipped = bytearray(stored[1])
    flipped[5] ^= 1
    with pytest.raises(IntegrityError, match=r"authentication|CRC32C"):
        reader.open(memoryview(flipped), 1, False)
    if keyed:
        # Nonce and associated data bind chunk number, last flag and segment: a moved chunk fails.
        for chunk_no, last, segment_no in ((0, False, 3), (1, True, 3), (1, False, 4)):
            other = stage_type.for_segment(ctx, segment_no, writer.salt)
            with pytest.raises(IntegrityError, match="authentication"):
                other.open(memoryview(stored[1]), chunk_no, last)
    else:
        with pytest.raises(IntegrityError, match="CRC32C"):
            reader.open(memoryview(stored[0]), 5, False)  # no such chunk recorded


def test_keyed_seal_needs_a_dek_and_an_eight_byte_salt(ring: KeyRing) -> None:
    with pytest.raises(ValueError, match="DEK"):
        AesGcmSeal.for_segment(_context(False, ring), 1)
    with pytest.raises(ValueError, match="8 bytes"):
        AesGcmSeal.for_segment(_context(True, ring), 1, b"short")


def test_zstd_stage_keeps_a_frame_only_when_smaller_and_checks_it_on_the_way_down() -> None:
    stage = ZstdStage(3)
    text = memoryview(make_data("text", CHUNK, 1))
    noise = memoryview(os.urandom(CHUNK))
    frame = stage.seal(text)
    assert isinstance(frame, bytes) and len(frame) < CHUNK
    assert stage.seal(noise) is noise
    down = ZstdStage()
    assert down.open(frame, CHUNK) == text
    assert down.open(noise, CHUNK) == noise
    with pytest.raises(IntegrityError, match="declares"):
        down.open(frame, CHUNK - 1)
    with pytest.raises(IntegrityError, match="longer"):
        down.open(noise, CHUNK - 1)
    with pytest.raises(IntegrityError, match="not a zstd frame"):
        down.open(b"\x00" * 100, CHUNK)
    lying = zstandard.ZstdCompressor(write_content_size=True).compress(b"a" * 100)
    with pytest.raises(IntegrityError, match="declares"):
        down.open(lying, CHUNK)
    with pytest.raises(RuntimeError):
        down.seal(text)


@pytest.mark.parametrize(("mode", "compressed"), [("off", False), ("on", True), ("auto", True)])
def test_upload_chain_compresses_when_the_segment_decision_says_so(
    mode: str, compressed: bool, ring: KeyRing
) -> None:
    settings = TransformSettings(chunk_size=CHUNK, compression=mode)  # type: ignore[arg-type]
    chain = UploadChain(_context(True, ring), settings, 1)
    data = memoryview(make_data("text", CHUNK, 2))
    stored = chain.seal(data, 0, True)
    assert chain.compressed is compressed
    assert (len(stored) < CHUNK) is compressed
    assert chain.stages == Stages("zstd", "aes-256-gcm")
