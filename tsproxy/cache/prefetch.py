"""Prefetch policy: how far ahead of a reader to schedule chunks. Pure bookkeeping, no I/O.

Kafka reads a remote segment forward: either one long GET from a position to the segment's end that it
consumes lazily (and often drops after about 1 MiB), or a series of ranged GETs, each starting where the
previous one ended. The policy keeps, per object, a few *streams*: where a reader started, how far it has
consumed, and how far ahead chunks have been scheduled (the frontier). A read that starts after a
stream's start and not far past where it stopped continues that stream, which marks it sequential; any
other read starts a new stream. How far past: after a read served to its last byte, at most
`finished_slack` (a Kafka fetch starts at a batch at or before the previous fetch's end, a plugin's
chunk read at its end); after one cut short, `forward_slack`, since the client read on past what the
stream counts as consumed (a long GET dropped after about 1 MiB counts only the chunks it got whole).
Consumers seeking at random thus rarely pass for forward readers and set off read-ahead they never use.

A reader asks `want()` as it consumes. When less than a window lies scheduled ahead of it, the answer
is the next whole window after the frontier, so windows go out as one large request each rather than a
chunk at a time (a 16 MiB window of 4 MiB chunks is one GET per 16 MiB read). The reader bounds the
range it may schedule: the end of its own read, or the object's end once the stream is sequential.

Chunks scheduled ahead of need are counted as issued; as used when a read consumes them; as wasted when
their object's entry leaves the table (least recently used objects go first) still unread.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


@dataclass
class Stream:
    """One reader's forward progress through an object (original byte offsets)."""

    start: int  # where the latest read of the stream began
    position: int  # consumed up to here (exclusive): where a sequential next read begins
    frontier: int  # chunks are scheduled up to here (exclusive)
    sequential: bool = False  # a read has continued this stream: prefetch may go past a read's end
    finished: bool = False  # its latest read was served to its last byte (see `finished`)


@dataclass
class _Tracked:
    streams: list[Stream] = field(default_factory=list)  # most recently used last
    prefetched: set[int] = field(default_factory=set)  # chunk indexes issued ahead of need, unread


class PrefetchPolicy:
    """Per-object read-ahead bookkeeping; see the module docstring."""

    def __init__(
        self,
        window_bytes: int = 16 << 20,
        *,
        forward_slack: int = 4 << 20,
        finished_slack: int = 64 << 10,
        max_objects: int = 1024,
        max_streams: int = 4,
        on_count: Callable[[str, int], None] | None = None,
    ) -> None:
        if window_bytes < 0 or forward_slack < 0 or finished_slack < 0 or max_objects < 1 or max_streams < 1:
            raise ValueError("prefetch policy bounds must be positive")
        self.window_bytes = window_bytes
        self.forward_slack = forward_slack
        self.finished_slack = finished_slack
        self.max_objects = max_objects
        self.max_streams = max_streams
        self._on_count = on_count
        self._objects: OrderedDict[bytes, _Tracked] = OrderedDict()
        self.issued = 0
        self.used = 0
        self.wasted = 0

    def __len__(self) -> int:
        """Objects tracked."""
        return len(self._objects)

    def begin(self, object_id: bytes, first: int) -> Stream:
        """The stream a read starting at original offset `first` belongs to (a new one if none fits)."""
        tracked = self._touch(object_id)
        best: Stream | None = None
        for s in tracked.streams:
            slack = self.finished_slack if s.finished else self.forward_slack
            if s.start < first <= s.position + slack and (
                best is None or abs(first - s.position) < abs(first - best.position)
            ):
                best = s
        if best is not None:
            tracked.streams.remove(best)
            best.sequential = True
            best.finished = False
            best.start = first
            best.position = max(best.position, first)
        else:
            best = Stream(start=first, position=first, frontier=first)
            if len(tracked.streams) >= self.max_streams:
                tracked.streams.pop(0)
        tracked.streams.append(best)
        return best

    def want(self, stream: Stream, position: int, limit: int) -> tuple[int, int] | None:
        """Original bytes [start, end) to schedule now for a reader at `position`, scheduling up to `limit`.

        None when enough is scheduled ahead already, or nothing is left before limit.
        """
        stream.frontier = max(stream.frontier, position)
        if not self.window_bytes or stream.frontier >= limit:
            return None
        # Keep between one and two windows ahead: a reader taking big steps (4 MiB chunk GETs) would
        # otherwise catch up with a window still in flight and wait for all of it.
        if stream.frontier - position >= self.window_bytes:
            return None
        return stream.frontier, min(stream.frontier + self.window_bytes, limit)

    @staticmethod
    def scheduled(stream: Stream, end: int) -> None:
        """Chunks up to original offset `end` (exclusive) are scheduled (fetching, cached, or on hand)."""
        stream.frontier = max(stream.frontier, end)

    def issued_ahead(self, object_id: bytes, chunk_indexes: Iterable[int]) -> None:
        """Chunks were requested ahead of need."""
        tracked = self._touch(object_id)
        before = len(tracked.prefetched)
        tracked.prefetched.update(chunk_indexes)
        self._count("issued", len(tracked.prefetched) - before)

    def consumed(self, object_id: bytes, stream: Stream, chunk_index: int, position: int) -> None:
        """A read consumed chunk_index up to original offset `position` (exclusive)."""
        stream.position = max(stream.position, position)
        tracked = self._objects.get(object_id)
        if tracked is not None and chunk_index in tracked.prefetched:
            tracked.prefetched.discard(chunk_index)
            self._count("used", 1)

    @staticmethod
    def finished(stream: Stream) -> None:
        """The stream's latest read was served to its last byte: its position is where the client is."""
        stream.finished = True

    def forget(self, object_id: bytes) -> None:
        """Stop tracking an object; its unread prefetched chunks count as wasted."""
        tracked = self._objects.pop(object_id, None)
        if tracked is not None:
            self._count("wasted", len(tracked.prefetched))

    def clear(self) -> None:
        """Stop tracking every object (on shutdown)."""
        for object_id in list(self._objects):
            self.forget(object_id)

    def _touch(self, object_id: bytes) -> _Tracked:
        tracked = self._objects.get(object_id)
        if tracked is None:
            tracked = self._objects[object_id] = _Tracked()
            while len(self._objects) > self.max_objects:
                self.forget(next(iter(self._objects)))
        else:
            self._objects.move_to_end(object_id)
        return tracked

    def _count(self, state: str, n: int) -> None:
        if not n:
            return
        if state == "issued":
            self.issued += n
        elif state == "used":
            self.used += n
        else:
            self.wasted += n
        if self._on_count is not None:
            self._on_count(state, n)
