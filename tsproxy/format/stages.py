"""The stages a chunk passes through, each with one job, sealing on the way up and opening on the way down.

* ZstdStage compresses a chunk when that makes it strictly smaller, and inflates it back.
* A seal stage makes the chunk tamper-evident, and secret when it is keyed: AesGcmSeal (AES-256-GCM
  under the object's DEK, nonce and associated data derived from the chunk's position) or Crc32cSeal
  (the chunk as it is, its CRC32C recorded in the segment entry).

A stage knows nothing of where bytes are stored, of other stages or of the manifest's encoding:
pipeline.py composes them and maps what the format records to them. Stages raise IntegrityError
with the reason only; the caller names the chunk.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import ClassVar

import zstandard
from awscrt.checksums import crc32c
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tsproxy.errors import IntegrityError

from . import zstdframes
from .context import SALT_SIZE, TAG_SIZE, ObjectContext, aad_prefix, chunk_aad, chunk_nonce

Payload = bytes | memoryview
# One frame of a range read, and the part of its original bytes [lo, hi) that the range takes.
FrameStep = tuple[zstdframes.Frame, int, int]


def join_pieces(pieces: list[Payload]) -> Payload:
    """Pieces of original bytes as one: the piece itself when there is one (no copy)."""
    if len(pieces) == 1:
        return pieces[0]
    return b"".join(pieces)


class ZstdStage:
    """zstd, kept only when smaller: a chunk becomes one standard frame (format 1), or a run of frames of
    at most `frame_size` original bytes each (format 2), every frame with its content size and no
    checksum. Either is read back whole (`open`) or in part (`open_range`, inflating only the frames
    that hold the part).

    Owns a zstd context, which is not thread-safe: one stage per encoder or decoder, one thread at a time.
    """

    name: ClassVar[str] = "zstd"

    def __init__(self, level: int | None = None, frame_size: int | None = None) -> None:
        # A level makes a compressing stage (upload); without one the stage only inflates (download).
        self._compressor = (
            None
            if level is None
            else zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=True)
        )
        self._frame_size = frame_size
        self._decompressor: zstandard.ZstdDecompressor | None = None

    def seal(self, chunk: memoryview) -> Payload:
        """The chunk's zstd frame(s) if strictly smaller than the chunk, else the chunk itself."""
        if self._compressor is None:
            raise RuntimeError("a ZstdStage without a level only opens")
        size = self._frame_size
        if size is None or len(chunk) <= size:
            packed = self._compressor.compress(chunk)
        else:
            packed = b"".join(
                self._compressor.compress(chunk[pos : pos + size]) for pos in range(0, len(chunk), size)
            )
        return packed if len(packed) < len(chunk) else chunk

    def open(self, payload: Payload, original_len: int) -> bytes:
        """The original bytes of a verified payload: itself when of the original length, else inflated.

        Every frame's declared size is checked before inflating: a hostile frame cannot ask for a huge
        buffer.
        """
        if len(payload) == original_len:
            return payload if isinstance(payload, bytes) else bytes(payload)
        run = self._frames(payload, original_len)
        if len(run) == 1:
            return self._inflate(payload, run[0])
        return b"".join(self._inflate(payload, frame) for frame in run)

    def open_range(self, payload: Payload, original_len: int, start: int, stop: int) -> Payload:
        """Original bytes [start, stop) of a verified payload, inflating only the frames that hold them."""
        return self.assemble(payload, self.range_plan(payload, original_len, start, stop), start, stop)

    def assemble(self, payload: Payload, plan: list[FrameStep] | None, start: int, stop: int) -> Payload:
        """Original bytes [start, stop) of a verified payload by its range_plan, every frame inflated here."""
        if plan is None:
            return bytes(payload[start:stop])
        return join_pieces([self.inflate_part(payload, *step) for step in plan])

    def range_plan(
        self, payload: Payload, original_len: int, start: int, stop: int
    ) -> list[FrameStep] | None:
        """How original bytes [start, stop) of a verified payload come back: None when it is stored as it
        is (they are a slice of it), else the frames that hold them, in order, each with the part of its
        output that belongs to them. The frames inflate independently (see inflate_part)."""
        if not 0 <= start <= stop <= original_len:
            raise ValueError(f"bytes {start}..{stop} are not within a chunk of {original_len}")
        if len(payload) == original_len:
            return None
        run = self._frames(payload, original_len)
        first, past, offset = zstdframes.covering(run, start, stop)
        plan = []
        for frame in run[first:past]:
            plan.append((frame, max(start - offset, 0), min(stop - offset, frame.content_size)))
            offset += frame.content_size
        return plan

    def inflate_part(self, payload: Payload, frame: zstdframes.Frame, lo: int, hi: int) -> Payload:
        """Original bytes [lo, hi) of one frame of a verified payload (a view when not all of it)."""
        data = self._inflate(payload, frame)
        return data if lo == 0 and hi == len(data) else memoryview(data)[lo:hi]

    def _frames(self, payload: Payload, original_len: int) -> list[zstdframes.Frame]:
        if len(payload) > original_len:
            raise IntegrityError("longer than its original length")
        return zstdframes.frames(payload, original_len)

    def _inflate(self, payload: Payload, frame: zstdframes.Frame) -> bytes:
        if self._decompressor is None:
            self._decompressor = zstandard.ZstdDecompressor()
        piece = memoryview(payload)[frame.offset : frame.offset + frame.length]
        try:
            data = self._decompressor.decompress(piece, max_output_size=frame.content_size)
        except zstandard.ZstdError as e:
            raise IntegrityError(f"zstd: {e}") from None
        if len(data) != frame.content_size:
            raise IntegrityError(f"decompressed to {len(data)} bytes, expected {frame.content_size}")
        return data


class SealStage(ABC):
    """The last stage up and the first down, for the chunks of one segment.

    A keyed stage uses the object's DEK: its segments record a salt (format v1, segment flag bit 1) and
    its manifest is checked by HMAC. An unkeyed one records a CRC32C per chunk (segment flag bit 2) and
    its manifest is checked by CRC32C. overhead is what sealing adds to a chunk's length.
    """

    name: ClassVar[str]
    keyed: ClassVar[bool]
    overhead: ClassVar[int]

    @classmethod
    @abstractmethod
    def for_segment(
        cls, ctx: ObjectContext, segment_no: int, salt: bytes | None = None, crcs: tuple[int, ...] = ()
    ) -> SealStage:
        """The stage for one segment: to write (salt None: a fresh one) or to read what its entry records."""

    @abstractmethod
    def seal(self, payload: Payload, chunk_no: int, last: bool) -> bytes:
        """The stored bytes of a chunk's payload."""

    @abstractmethod
    def open(self, stored: memoryview, chunk_no: int, last: bool) -> Payload:
        """The payload of a stored chunk, once verified; IntegrityError when it is not what was sealed."""

    @property
    @abstractmethod
    def salt(self) -> bytes:
        """The salt the segment entry records: 8 bytes for a keyed stage, empty otherwise."""

    @property
    @abstractmethod
    def crcs(self) -> tuple[int, ...]:
        """The chunk CRC32Cs the segment entry records (sealed so far), empty for a keyed stage."""


class AesGcmSeal(SealStage):
    """AES-256-GCM under the object's DEK; nonce = salt || chunk_no, associated data binds the position."""

    name = "aes-256-gcm"
    keyed = True
    overhead = TAG_SIZE

    def __init__(self, aead: AESGCM, salt: bytes, prefix: bytes) -> None:
        if len(salt) != SALT_SIZE:
            raise ValueError("salt must be 8 bytes")
        self._aead = aead
        self._salt = salt
        self._prefix = prefix

    @classmethod
    def for_segment(
        cls, ctx: ObjectContext, segment_no: int, salt: bytes | None = None, crcs: tuple[int, ...] = ()
    ) -> AesGcmSeal:
        if ctx.dek is None:
            raise ValueError("AES-256-GCM needs the object's DEK")
        return cls(
            AESGCM(ctx.dek),
            os.urandom(SALT_SIZE) if salt is None else salt,
            aad_prefix(ctx.object_id, segment_no),
        )

    @property
    def salt(self) -> bytes:
        return self._salt

    @property
    def crcs(self) -> tuple[int, ...]:
        return ()

    def seal(self, payload: Payload, chunk_no: int, last: bool) -> bytes:
        return self._aead.encrypt(
            chunk_nonce(self._salt, chunk_no), payload, chunk_aad(self._prefix, chunk_no, last)
        )

    def open(self, stored: memoryview, chunk_no: int, last: bool) -> Payload:
        try:
            return self._aead.decrypt(
                chunk_nonce(self._salt, chunk_no), stored, chunk_aad(self._prefix, chunk_no, last)
            )
        except InvalidTag:
            raise IntegrityError("authentication failed (tampered, moved or truncated)") from None


class Crc32cSeal(SealStage):
    """No encryption: the payload is stored as it is and its CRC32C (Castagnoli) recorded per chunk."""

    name = "crc32c"
    keyed = False
    overhead = 0

    def __init__(self, crcs: tuple[int, ...] = ()) -> None:
        # By chunk number: chunks may be sealed out of order, on several threads.
        self._crcs = dict(enumerate(crcs))

    @classmethod
    def for_segment(
        cls, ctx: ObjectContext, segment_no: int, salt: bytes | None = None, crcs: tuple[int, ...] = ()
    ) -> Crc32cSeal:
        return cls(crcs)  # a salt given to an unkeyed stage has nothing to do and is ignored

    @property
    def salt(self) -> bytes:
        return b""

    @property
    def crcs(self) -> tuple[int, ...]:
        """The CRC32Cs of chunks 0, 1, ... as far as they are sealed without a gap."""
        out: list[int] = []
        while (crc := self._crcs.get(len(out))) is not None:
            out.append(crc)
        return tuple(out)

    def seal(self, payload: Payload, chunk_no: int, last: bool) -> bytes:
        # The caller's buffer may be reused once this returns: the stored chunk must own its bytes.
        stored = payload if isinstance(payload, bytes) else bytes(payload)
        self._crcs[chunk_no] = crc32c(stored)
        return stored

    def open(self, stored: memoryview, chunk_no: int, last: bool) -> Payload:
        expected = self._crcs.get(chunk_no)
        if expected is None or crc32c(stored) != expected:
            raise IntegrityError("CRC32C mismatch (corrupted or tampered)")
        return stored
