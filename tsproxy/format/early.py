"""A stored chunk's zstd frames found, and handed out to be inflated, while its bytes are still arriving.

A reader that needs part of a chunk must have the whole chunk to verify it (its seal covers all of it),
but the frames holding that part can be inflated before then: the seal stage turns the bytes that have
arrived into payload bytes without verifying them (SealStage.unverified), and each frame the part needs
is handed out as soon as it is whole. Nothing found here is trusted. The caller verifies the whole chunk
the usual way (ChunkDecoder.open_range) and uses an inflated frame only when that frame, as the verified
payload gives it, is the same frame with the same bytes (`matches`); anything else is decoded again from
the verified payload. So a bug or a tampered chunk costs the work done ahead, never a wrong byte.
"""

from __future__ import annotations

from collections.abc import Callable

from . import zstdframes
from .stages import FrameStep, Payload
from .zstdframes import Frame, FrameError


class EarlyFrames:
    """Frames of one stored chunk holding original bytes [start, stop), found as its bytes are fed."""

    def __init__(
        self,
        unverified: Callable[[memoryview], bytes],
        payload_len: int,
        original_len: int,
        start: int,
        stop: int,
    ) -> None:
        if not 0 <= start < stop <= original_len:
            raise ValueError(f"bytes {start}..{stop} are not within a chunk of {original_len}")
        self._unverified = unverified
        self._payload_len = payload_len
        self._original_len = original_len
        self._start, self._stop = start, stop
        self._payload = bytearray()
        self._fed = 0  # stored bytes fed
        self._next = 0  # payload offset of the next frame
        self._offset = 0  # original offset of the next frame
        self._done = False
        self.found: dict[Frame, bytes] = {}  # the frames handed out, with the bytes they were found with

    def feed(self, stored: memoryview) -> list[tuple[Frame, bytes]]:
        """The next stored bytes of the chunk, in order (the seal's own bytes past the payload are left
        out): the frames holding part of [start, stop) that are now whole, each with its bytes."""
        if self._done:
            return []
        room = self._payload_len - self._fed
        piece = stored[:room]
        self._fed += len(piece)
        if piece:
            self._payload += self._unverified(piece)
        out: list[tuple[Frame, bytes]] = []
        view = memoryview(self._payload)
        try:
            while self._offset < self._stop:
                frame = zstdframes.frame_if_whole(view, self._next)
                if frame is None:
                    break
                if self._offset + frame.content_size > self._original_len:
                    raise FrameError("declares more than the chunk")
                if self._offset + frame.content_size > self._start:
                    data = bytes(view[frame.offset : frame.offset + frame.length])
                    self.found[frame] = data
                    out.append((frame, data))
                self._next += frame.length
                self._offset += frame.content_size
        except FrameError:
            self._done = True  # not what a verified payload would be: left to the usual path
        finally:
            view.release()
        if self._offset >= self._stop:
            self._done = True
        return out

    def matches(self, payload: Payload, plan: list[FrameStep]) -> bool:
        """Whether every frame of the verified payload's plan was found, with the same bytes."""
        view = memoryview(payload)
        for frame, _, _ in plan:
            data = self.found.get(frame)
            if data is None or view[frame.offset : frame.offset + frame.length] != data:
                return False
        return True
