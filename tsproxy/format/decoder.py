"""Reading chunks back: each stored chunk goes down its object's DownloadChain (pipeline.py), verified."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tsproxy.errors import IntegrityError

from .context import ObjectContext
from .index import ChunkRef
from .manifest import Manifest
from .pipeline import DownloadChain
from .stages import FrameStep, Payload


class ChunkDecoder:
    """Turns stored chunks of one object back into original bytes, verifying each.

    Not thread-safe (its chain owns a zstd context): one per thread or per reader.
    """

    def __init__(self, manifest: Manifest, ctx: ObjectContext) -> None:
        if ctx.object_id != manifest.object_id or ctx.encrypted != manifest.stages.keyed:
            raise ValueError("the context is not this manifest's object")
        self._chain = DownloadChain(manifest.stages, ctx, manifest.segments)

    def decode(self, ref: ChunkRef, stored: bytes | bytearray | memoryview) -> bytes:
        """The original bytes of the chunk ref; IntegrityError on any mismatch, never unverified bytes."""
        with _naming(ref):
            view = _checked(ref, stored)
            return self._chain.open(view, ref.segment_no, ref.chunk_no, ref.last, ref.original_len)

    def decode_range(
        self, ref: ChunkRef, stored: bytes | bytearray | memoryview, start: int, stop: int
    ) -> Payload:
        """Original bytes [start, stop) of the chunk (offsets within it), verified as `decode` verifies the
        whole chunk; of a chunk stored as several zstd frames (format 2) only the frames holding them are
        inflated."""
        payload, plan = self.open_range(ref, stored, start, stop)
        return self.assemble(ref, payload, plan, start, stop)

    def open_range(
        self, ref: ChunkRef, stored: bytes | bytearray | memoryview, start: int, stop: int
    ) -> tuple[Payload, list[FrameStep] | None]:
        """The first half of decode_range, for a caller that inflates the frames on several threads: the
        chunk verified and decrypted (its payload), and how original bytes [start, stop) come from it
        (ZstdStage.range_plan: None when they are a slice of it). Each step then goes to inflate_part,
        on any thread's decoder of the same object, or all of them to assemble."""
        with _naming(ref):
            view = _checked(ref, stored)
            payload = self._chain.open_seal(view, ref.segment_no, ref.chunk_no, ref.last)
            return payload, self._chain.range_plan(payload, ref.original_len, start, stop)

    def inflate_part(self, ref: ChunkRef, payload: Payload, step: FrameStep) -> Payload:
        """One step of open_range's plan: that part of one frame's original bytes."""
        with _naming(ref):
            return self._chain.inflate_part(payload, step)

    def assemble(
        self, ref: ChunkRef, payload: Payload, plan: list[FrameStep] | None, start: int, stop: int
    ) -> Payload:
        """The second half of decode_range: original bytes [start, stop) by open_range's plan, every
        step inflated here."""
        with _naming(ref):
            return self._chain.assemble(payload, plan, start, stop)


def _checked(ref: ChunkRef, stored: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(stored).cast("B")
    if len(view) != ref.stored_len:
        raise IntegrityError(f"{len(view)} stored bytes, expected {ref.stored_len}")
    return view


@contextlib.contextmanager
def _naming(ref: ChunkRef) -> Iterator[None]:
    """An IntegrityError inside names the chunk it is about (stages give the reason only)."""
    try:
        yield
    except IntegrityError as e:
        raise IntegrityError(f"chunk {ref.chunk_no} of segment {ref.segment_no}: {e}") from None
