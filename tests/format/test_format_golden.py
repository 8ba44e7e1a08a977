"""Golden files pin stored formats v1 and v2: the writer reproduces them byte for byte, the reader decodes
every version's files."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import zstandard
from awscrt.checksums import crc32c
from golden_cases import CASES_V1, CASES_V2, DEK, OBJECT_ID, Case, encode_case, golden_ring, record_file

from tsproxy.format import decode_object, decode_tail, read_range

RECORDS = {version: json.loads(record_file(version).read_text()) for version in (1, 2)}
ALL_CASES = (*CASES_V1, *CASES_V2)


def _name(case: Case) -> str:
    return f"v{case.version}-{case.name}"


@pytest.mark.parametrize("case", ALL_CASES, ids=_name)
def test_golden_files_decode(case: Case) -> None:
    stored = case.path.read_bytes()
    record = RECORDS[case.version]["cases"][case.name]
    assert hashlib.sha256(stored).hexdigest() == record["stored_sha256"]
    assert hashlib.sha256(case.original).hexdigest() == record["original_sha256"]
    ring = golden_ring()
    assert decode_object(stored, ring) == case.original
    size = len(case.original)
    for first, last in ((0, 0), (65_535, 65_536), (size - 3000, size - 1), (1, size - 2)):
        assert read_range(stored, ring, first, last) == case.original[first : last + 1]
    manifest, ctx = decode_tail(stored, ring)
    assert manifest.version == case.version
    assert manifest.object_id == OBJECT_ID and ctx.dek == (DEK if case.settings.encryption else None)
    assert (manifest.content_type, manifest.metadata, manifest.headers) == (
        case.content_type,
        case.metadata,
        case.headers,
    )


@pytest.mark.parametrize("case", ALL_CASES, ids=_name)
def test_writer_reproduces_golden_files(case: Case) -> None:
    recorded = RECORDS[case.version]["zstd_version"]
    running = ".".join(map(str, zstandard.ZSTD_VERSION))
    if case.settings.compression != "off" and running != recorded:
        pytest.skip(f"compressed bytes were recorded with libzstd {recorded}, this is {running}")
    assert encode_case(case, golden_ring()) == case.path.read_bytes()


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def test_plain_golden_matches_the_documented_layout() -> None:
    # An independent reading of docs/FORMAT.md, field by field, without the package's decoder.
    case = next(c for c in CASES_V1 if c.name == "plain")
    stored = case.path.read_bytes()
    manifest_len, version, reserved, magic = struct.unpack(">IHH8s", stored[-16:])
    assert (version, reserved, magic) == (1, 0, b"\x89TSPROXY")
    manifest = stored[-16 - manifest_len : -16]
    body, check = manifest[:-4], manifest[-4:]
    assert crc32c(body + stored[-16:]) == int.from_bytes(check, "big")
    flags, mode, level, chunk_size = struct.unpack_from(">BBBI", body, 0)
    assert (flags, mode, level, chunk_size) == (0b110, 0, 3, 65_536)  # md5 and content type present
    assert body[7:23] == OBJECT_ID
    size, pos = _varint(body, 23)
    assert size == len(case.original)
    assert body[pos : pos + 16] == hashlib.md5(case.original, usedforsecurity=False).digest()
    pos += 16
    etag_len, pos = _varint(body, pos)
    assert (
        body[pos : pos + etag_len].decode() == hashlib.md5(case.original, usedforsecurity=False).hexdigest()
    )
    pos += etag_len
    ct_len, pos = _varint(body, pos)
    assert body[pos : pos + ct_len] == b"text/plain"
    pos += ct_len
    assert body[pos : pos + 3] == b"\x00\x00\x01"  # no metadata, no headers, one segment
    pos += 3
    segment_no, seg_flags = body[pos], body[pos + 1]
    assert (segment_no, seg_flags) == (1, 0b100)  # not compressed, no salt, CRC32Cs follow
    seg_size, pos = _varint(body, pos + 2)
    assert seg_size == size
    pos += 16  # segment MD5
    # Two chunks: count 2, base 65536 (varint 80 80 04), width 0, no packed bits, last 100 (64).
    assert body[pos : pos + 6] == b"\x02\x80\x80\x04\x00\x64"
    pos += 6
    crcs = struct.unpack_from(">II", body, pos)
    assert pos + 8 == len(body)
    assert stored[:65_636] == case.original
    assert crcs == (crc32c(case.original[:65_536]), crc32c(case.original[65_536:]))
    assert len(stored) == 65_636 + manifest_len + 16


def test_v2_chunks_are_runs_of_one_mib_zstd_frames() -> None:
    # docs/FORMAT.md, read independently: an unencrypted v2 object's stored chunk (CRC32C seal, stored as
    # is) of more than 1 MiB is a run of standard zstd frames, each declaring 1 MiB but the last.
    case = next(c for c in CASES_V2 if c.name == "unencrypted-frames")
    stored = case.path.read_bytes()
    version = struct.unpack(">IHH8s", stored[-16:])[1]
    assert version == 2
    manifest, _ = decode_tail(stored, None)
    first = manifest.segments[0].stored_sizes[0]
    chunk = stored[:first]
    sizes = []
    while chunk:
        sizes.append(zstandard.frame_content_size(chunk))
        inflater = zstandard.ZstdDecompressor().decompressobj()
        assert len(inflater.decompress(chunk)) == sizes[-1]
        chunk = inflater.unused_data
    assert sizes == [1 << 20, 1 << 20, 1 << 20]
    # Any zstd reader that reads across frames inflates the chunk whole.
    whole = zstandard.ZstdDecompressor().stream_reader(stored[:first], read_across_frames=True).read()
    assert whole == case.original[: 3 << 20]
