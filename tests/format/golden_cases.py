"""The golden objects that pin stored format versions 1 and 2 (files under tests/golden/).

Every input is fixed (DEK, object id, salts, KEK), so encoding is deterministic. The files must never be
regenerated for an existing version: a later format version adds new files beside these, and its
reader must still decode them. Run `python tests/format/golden_cases.py --write` only to create files
for a new version's cases (it writes the cases of a version whose record file does not exist yet).
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import zstandard

from tsproxy.format import (
    KeyRing,
    ObjectContext,
    SegmentEncoder,
    TransformSettings,
    build_manifest,
    encode_tail,
)

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
KEYRING = GOLDEN / "format-v1-keyring.json"
CASES = GOLDEN / "format-v1-cases.json"


def record_file(version: int) -> Path:
    """The JSON record (libzstd version, SHA-256 of each case) of a format version's golden files."""
    return GOLDEN / f"format-v{version}-cases.json"


OBJECT_ID = bytes.fromhex("0f1e2d3c4b5a69788796a5b4c3d2e1f0")
DEK = hashlib.sha256(b"tsproxy golden DEK").digest()


def text(size: int) -> bytes:
    """Compressible JSON-ish lines, defined by formula so any Python produces the same bytes."""
    lines = (
        b'{"seq": %d, "sensor": "s-%d", "reading": %d}\n' % (i, i % 17, (i * 7919) % 1000)
        for i in range(size)
    )
    out = bytearray()
    for line in lines:
        out += line
        if len(out) >= size:
            break
    return bytes(out[:size])


def noise(size: int, label: bytes) -> bytes:
    """Incompressible bytes from SHAKE-256."""
    return hashlib.shake_256(label).digest(size)


@dataclass(frozen=True)
class Case:
    name: str
    settings: TransformSettings
    parts: tuple[tuple[int, bytes, bytes], ...]  # (segment_no, salt, original bytes)
    multipart: bool
    content_type: str | None
    metadata: dict[str, str]
    headers: dict[str, str]

    @property
    def version(self) -> int:
        return self.settings.format_version

    @property
    def path(self) -> Path:
        return GOLDEN / f"format-v{self.version}-{self.name}.bin"

    @property
    def original(self) -> bytes:
        return b"".join(p for _, _, p in self.parts)


CASES_V1 = (
    Case(
        name="encrypted-multipart",
        settings=TransformSettings(
            chunk_size=64 * 1024, compression="on", level=3, encryption=True, format_version=1
        ),
        parts=(
            (1, b"salt-one", text(70_000)),
            (2, b"salt-two", noise(3_000, b"part two")),
        ),
        multipart=True,
        content_type="application/x-kafka-segment",
        metadata={"team": "streams", "note": "gr\u00fc\u00df"},
        headers={"Cache-Control": "max-age=60"},
    ),
    Case(
        name="plain",
        settings=TransformSettings(
            chunk_size=64 * 1024, compression="off", level=3, encryption=False, format_version=1
        ),
        parts=((1, b"", text(65_636)),),
        multipart=False,
        content_type="text/plain",
        metadata={},
        headers={},
    ),
)

# Version 2: a compressed chunk is a run of zstd frames of frame_size (the last shorter). These were
# recorded with 1 MiB frames (the default of the release that introduced version 2), kept so.
CASES_V2 = (
    Case(
        name="encrypted-frames",
        settings=TransformSettings(
            chunk_size=2 << 20,
            compression="on",
            level=3,
            encryption=True,
            format_version=2,
            frame_size=1 << 20,
        ),
        parts=(
            (1, b"frames-1", text(2_400_000)),  # a chunk of two frames, then one of one
            (2, b"frames-2", noise(5_000, b"v2 part two")),  # stored raw: does not shrink
        ),
        multipart=True,
        content_type="application/x-kafka-segment",
        metadata={"origin": "golden-v2"},
        headers={},
    ),
    Case(
        name="unencrypted-frames",
        settings=TransformSettings(
            chunk_size=3 << 20,
            compression="on",
            level=1,
            encryption=False,
            format_version=2,
            frame_size=1 << 20,
        ),
        parts=((1, b"", text(3_500_000)),),  # three frames, then one
        multipart=False,
        content_type=None,
        metadata={},
        headers={},
    ),
)
CASES_BY_VERSION = {1: CASES_V1, 2: CASES_V2}


def golden_ring() -> KeyRing:
    return KeyRing.load(KEYRING)


def encode_case(case: Case, ring: KeyRing) -> bytes:
    """The stored bytes of a case, from its fixed inputs."""
    if case.settings.encryption:
        kek_id, wrapped = ring.wrap(DEK)
        ctx = ObjectContext(OBJECT_ID, DEK, kek_id, wrapped)
    else:
        ctx = ObjectContext(OBJECT_ID)
    out = bytearray()
    infos = []
    for segment_no, salt, data in case.parts:
        enc = SegmentEncoder(ctx, case.settings, segment_no, salt=salt or None)
        for piece in enc.feed(data) + enc.finish():
            out += piece
        infos.append(enc.info)
    if case.multipart:
        joined = b"".join(i.md5 for i in infos)
        etag, md5 = f"{hashlib.md5(joined, usedforsecurity=False).hexdigest()}-{len(infos)}", None
    else:
        etag, md5 = infos[0].md5.hex(), infos[0].md5
    manifest = build_manifest(
        ctx,
        case.settings,
        infos,
        etag=etag,
        md5=md5,
        content_type=case.content_type,
        metadata=case.metadata,
        headers=case.headers,
    )
    return bytes(out) + encode_tail(manifest, ctx)


def write() -> None:
    """Create the golden files of every version that has none yet (never regenerate existing ones)."""
    GOLDEN.mkdir(exist_ok=True)
    if not KEYRING.exists():
        _write_keyring()
    ring = golden_ring()
    for version, cases in CASES_BY_VERSION.items():
        if record_file(version).exists():
            continue  # a version's files are written once
        record = {"zstd_version": ".".join(map(str, zstandard.ZSTD_VERSION)), "cases": {}}
        for case in cases:
            stored = encode_case(case, ring)
            case.path.write_bytes(stored)
            record["cases"][case.name] = {  # type: ignore[index]
                "original_sha256": hashlib.sha256(case.original).hexdigest(),
                "stored_sha256": hashlib.sha256(stored).hexdigest(),
            }
        record_file(version).write_text(json.dumps(record, indent=2) + "\n")


def _write_keyring() -> None:
    kek = hashlib.sha256(b"tsproxy golden KEK").digest()
    KEYRING.write_text(
        json.dumps(
            {
                "tsproxy_key_ring": 1,
                "active": "golden-kek",
                "keys": [
                    {
                        "id": "golden-kek",
                        "kind": "aes-256-kw",
                        "created": "2026-01-01T00:00:00Z",
                        "key": base64.b64encode(kek).decode(),
                    }
                ],
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    write()
