"""Where the stages compose: the upload chain of a segment, the download chain of an object, and the registry.

How stages compose
------------------
Upload, per segment (UploadChain.seal, one chunk at a time)::

    chunk -> [ZstdStage, when the segment's decision says so] -> AesGcmSeal | Crc32cSeal -> stored

Download, per object (DownloadChain.open), the mirror image::

    stored -> open seal (tag or CRC32C verified) -> open compression (inflate when shorter) -> chunk

Which stages an object uses is its Stages: the compression codec and the seal, by name. New objects get
keyed_seal() with a DEK and unkeyed_seal() without one; a stored object's Stages comes from what its
manifest records (format v1: manifest flag bit 0 names the seal; the codec is always zstd). The seal
is set up per segment (salt, or CRC32Cs); compression is per object (level) and decided per segment
(auto's Kafka probe). The decision is recorded but does not change how a chunk is read: a payload
shorter than its chunk's original length is a zstd frame.

Adding a stage
--------------
A new cipher is a SealStage subclass in stages.py (name, keyed, overhead, for_segment, seal, open) and
its entry in SEALS below under a new manifest flag bit (an older reader refuses an unknown bit rather
than misread the object; that is a new format version: docs/FORMAT.md and golden files). To write new
objects with it, keyed_seal() returns its name. A keyed seal records a salt per segment and derives
its nonce and associated data from the chunk's position (context.py); the manifest, segment entries,
chunk index and callers need no change. A new codec is a class shaped like ZstdStage in CODECS, plus
the record that names it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import reduce
from operator import or_
from typing import Protocol

from tsproxy.errors import FormatError, IntegrityError

from .context import ObjectContext
from .kafka_probe import contains_compressed_kafka, looks_like_compressed_kafka
from .settings import TransformSettings
from .stages import AesGcmSeal, Crc32cSeal, FrameStep, Payload, SealStage, ZstdStage


class SegmentSeals(Protocol):
    """What a download needs of a segment's record (segment.SegmentInfo is one) to open its seals."""

    @property
    def segment_no(self) -> int: ...
    @property
    def salt(self) -> bytes: ...
    @property
    def crc32c(self) -> tuple[int, ...]: ...


# The registry. Seal stages by name, each with the manifest flag bits format v1 records it by.
SEALS: dict[str, tuple[type[SealStage], int]] = {
    AesGcmSeal.name: (AesGcmSeal, 0x01),
    Crc32cSeal.name: (Crc32cSeal, 0x00),
}
# Every manifest flag bit that names a seal stage.
SEAL_FLAG_BITS = reduce(or_, (flag for _, flag in SEALS.values()))
CODECS: dict[str, type[ZstdStage]] = {ZstdStage.name: ZstdStage}
# Format v1 names no codec: every compressed chunk is a zstd frame.
V1_CODEC = ZstdStage.name


def keyed_seal() -> str:
    """The seal new objects with a DEK get."""
    return AesGcmSeal.name


def unkeyed_seal() -> str:
    """The seal new objects without a DEK get."""
    return Crc32cSeal.name


@dataclass(frozen=True)
class Stages:
    """The stages an object's chunks go through, by name, in upload order: compression codec, then seal."""

    codec: str
    seal: str

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise ValueError(f"unknown compression stage {self.codec!r}")
        if self.seal not in SEALS:
            raise ValueError(f"unknown seal stage {self.seal!r}")

    @property
    def seal_stage(self) -> type[SealStage]:
        return SEALS[self.seal][0]

    @property
    def keyed(self) -> bool:
        """Whether the chunks are sealed under the object's DEK (and the manifest checked by HMAC)."""
        return self.seal_stage.keyed

    @property
    def overhead(self) -> int:
        """Bytes sealing adds to each chunk."""
        return self.seal_stage.overhead

    @property
    def names(self) -> tuple[str, ...]:
        return (self.codec, self.seal)

    @classmethod
    def for_context(cls, ctx: ObjectContext) -> Stages:
        """The stages a new object written under ctx gets."""
        return cls(V1_CODEC, keyed_seal() if ctx.encrypted else unkeyed_seal())

    @classmethod
    def from_manifest_flags(cls, flags: int) -> Stages:
        """The stages a format v1 manifest's flags name; FormatError when they name none."""
        bits = flags & SEAL_FLAG_BITS
        for name, (_, flag) in SEALS.items():
            if flag == bits:
                return cls(V1_CODEC, name)
        raise FormatError(f"manifest flags {flags:#x} name no known seal stage")

    @property
    def manifest_flags(self) -> int:
        """The manifest flag bits format v1 records these stages by."""
        return SEALS[self.seal][1]


class UploadChain:
    """The stages of one segment on the way up: chunk -> compress? -> seal.

    The compression decision is made on the segment's first chunk: off never, on always, auto unless the
    segment is (object_start) or holds (a later part) producer-compressed Kafka batches. Once it is made
    (decide(), or sealing chunk 0 first), chunks may be sealed in any order and on several threads at
    once: each sealing borrows a zstd context no other holds meanwhile.
    """

    def __init__(
        self,
        ctx: ObjectContext,
        settings: TransformSettings,
        segment_no: int,
        *,
        salt: bytes | None = None,
        object_start: bool = True,
    ) -> None:
        self.stages = Stages.for_context(ctx)
        self._settings = settings
        self._object_start = object_start
        self._seal = self.stages.seal_stage.for_segment(ctx, segment_no, salt)
        self._compress = False
        self._decided = False
        # Idle zstd contexts (one is not thread-safe): as many are made as seal at once, then reused.
        self._codecs: list[ZstdStage] = []

    @property
    def compressed(self) -> bool:
        """Whether the segment's chunks go through compression (known once the first chunk is sealed)."""
        return self._compress

    @property
    def decision(self) -> bool | None:
        """Whether the segment's chunks go through compression; None until that is decided."""
        return self._compress if self._decided else None

    @property
    def seal_stage(self) -> SealStage:
        """The segment's seal stage, with what the segment entry records of it (salt, CRC32Cs)."""
        return self._seal

    def seal(self, chunk: memoryview, chunk_no: int, last: bool) -> bytes:
        """The stored bytes of one of the segment's chunks."""
        if not self._decided:
            self.decide(chunk)  # sealed one by one: the first chunk sealed is chunk 0
        payload: Payload = chunk
        if self._compress:
            try:
                codec = self._codecs.pop()  # atomic: two threads never get one context
            except IndexError:
                # Format 2 cuts a chunk into frames, so a partial read inflates only what it needs.
                frame_size = self._settings.frame_size if self._settings.format_version >= 2 else None
                codec = CODECS[self.stages.codec](self._settings.level, frame_size)
            try:
                payload = codec.seal(chunk)
            finally:
                self._codecs.append(codec)
        return self._seal.seal(payload, chunk_no, last)

    def decide(self, first_chunk: memoryview) -> None:
        """Make the segment's compression decision on its first chunk, before any chunk is sealed."""
        if self._decided:
            return
        self._decided = True
        mode = self._settings.compression
        probe = looks_like_compressed_kafka if self._object_start else contains_compressed_kafka
        self._compress = mode == "on" or (mode == "auto" and not probe(first_chunk))


class DownloadChain:
    """The stages of one object on the way down: open seal -> open compression. Not thread-safe (zstd)."""

    def __init__(self, stages: Stages, ctx: ObjectContext, segments: Iterable[SegmentSeals]) -> None:
        self.stages = stages
        self._ctx = ctx
        self._segments = {s.segment_no: s for s in segments}
        # Built on first use: a read touches few of a multipart object's segments.
        self._seals: dict[int, SealStage] = {}
        self._codec = CODECS[stages.codec]()

    def open(
        self, stored: memoryview, segment_no: int, chunk_no: int, last: bool, original_len: int
    ) -> bytes:
        """The original bytes of a stored chunk; IntegrityError (the reason only) on any mismatch."""
        seal = self._seals.get(segment_no) or self._seal_for(segment_no)
        return self._codec.open(seal.open(stored, chunk_no, last), original_len)

    def open_seal(self, stored: memoryview, segment_no: int, chunk_no: int, last: bool) -> Payload:
        """A stored chunk verified (and decrypted): its payload, still compressed. The seal covers the
        whole chunk, so a read of part of it verifies all of it, then inflates only the frames it needs
        (range_plan, then inflate_part or assemble)."""
        seal = self._seals.get(segment_no) or self._seal_for(segment_no)
        return seal.open(stored, chunk_no, last)

    def range_plan(
        self, payload: Payload, original_len: int, start: int, stop: int
    ) -> list[FrameStep] | None:
        """See ZstdStage.range_plan."""
        return self._codec.range_plan(payload, original_len, start, stop)

    def inflate_part(self, payload: Payload, step: FrameStep) -> Payload:
        """See ZstdStage.inflate_part."""
        return self._codec.inflate_part(payload, *step)

    def assemble(self, payload: Payload, plan: list[FrameStep] | None, start: int, stop: int) -> Payload:
        """See ZstdStage.assemble."""
        return self._codec.assemble(payload, plan, start, stop)

    def _seal_for(self, segment_no: int) -> SealStage:
        info = self._segments.get(segment_no)
        if info is None:
            raise IntegrityError("no such segment in the manifest")
        seal = self.stages.seal_stage.for_segment(self._ctx, segment_no, info.salt, info.crc32c)
        self._seals[segment_no] = seal
        return seal
