"""The pieces of a streamed ranged GET, held until the chunks they carry are cut out. Pure, no I/O.

A backend answer arrives in pieces of whatever size the connection hands over; a chunk may lie inside
one piece or across several. The spool keeps the pieces received and not yet passed, and gives each
chunk's stored bytes as soon as they are all in: a view when they lie inside one piece (no copy), else
joined once. Chunks are taken in stored order, so everything before a taken chunk's end is let go.
"""

from __future__ import annotations

from collections import deque


class StoredSpool:
    """Pieces of stored bytes from absolute offset `start` on, received in order."""

    def __init__(self, start: int) -> None:
        self._pieces: deque[tuple[int, memoryview]] = deque()  # (absolute offset, piece)
        self._end = start
        self._taken = start

    @property
    def end(self) -> int:
        """Absolute offset (exclusive) up to which bytes have been received."""
        return self._end

    @property
    def held(self) -> int:
        """Bytes held: received and not yet let go."""
        return sum(len(piece) for _, piece in self._pieces)

    def add(self, piece: bytes | bytearray | memoryview) -> None:
        # A bytearray may be changed by whoever handed it over: it is held as a copy.
        view = memoryview(bytes(piece)) if isinstance(piece, bytearray) else memoryview(piece).cast("B")
        if view.nbytes:
            self._pieces.append((self._end, view))
            self._end += view.nbytes

    def take(self, start: int, end: int) -> bytes | memoryview:
        """Stored bytes [start, end), all received; afterwards nothing before `end` is held.

        Takes must not go backwards: `start` is at or after the previous take's end.
        """
        if start < self._taken or end > self._end or start > end:
            raise ValueError(f"bytes {start}..{end} are not in the spool ({self._taken}..{self._end})")
        while self._pieces and self._pieces[0][0] + self._pieces[0][1].nbytes <= start:
            self._pieces.popleft()
        out: bytes | memoryview
        if not self._pieces:
            out = b""
        else:
            first_at, first = self._pieces[0]
            if end <= first_at + first.nbytes:
                out = first[start - first_at : end - first_at]
            else:
                parts = []
                for at, piece in self._pieces:
                    if at >= end:
                        break
                    parts.append(piece[max(0, start - at) : min(piece.nbytes, end - at)])
                out = b"".join(parts)
        while self._pieces and self._pieces[0][0] + self._pieces[0][1].nbytes <= end:
            self._pieces.popleft()
        self._taken = end
        return out
