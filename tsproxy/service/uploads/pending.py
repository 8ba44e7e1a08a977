"""What an instance holds of the multipart uploads it takes parts of: records acknowledged, not yet written.

A part that went straight into its upload's backend upload, or a small one held for the tail, is
answered before its `.info` record is written; the record (with a small part's stored bytes) waits here
until the upload goes quiet, the instance stops, or a completion by this instance makes it needless.
This is not a cache: a record leaves only once written, or with its upload (completed, aborted, removed
by the janitor). What may go unbidden are the uploads with nothing left to write, which only spare a
completion here a listing. Memory is bounded by `max_bytes` of held records: past it, the caller writes
a record at once instead (`hold` says so).

An upload's life here is a state table (`TRANSITIONS`), walked by the events the bookkeeping sees:

    phase     what is stored of the upload                     events: hold  state_stored  all_written  close
    CREATED   not its state object (its id carries a ticket)          CREATED HOLDING      CREATED      DONE
    HOLDING   its state; some part records are held unwritten         HOLDING HOLDING      WRITTEN      DONE
    WRITTEN   its state and every record this instance took           HOLDING WRITTEN      WRITTEN      DONE
    DONE      completed, aborted or removed: nothing more is written  DONE    DONE         DONE         DONE

Two counts ride beside the phase, as they are concurrency rather than life: the UploadPart requests in
flight (the upload is busy) and the completions in flight here (no flush starts meanwhile).

Pure bookkeeping, no I/O: uploads.keeper writes what this holds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum

from tsproxy.service.uploads.ids import upload_name
from tsproxy.service.uploads.records import PartRecord, UploadState

# What a record costs here besides the stored bytes it may keep (its JSON head and segment, and the
# bookkeeping around them), counted against the bound.
RECORD_OVERHEAD = 1024
# Uploads with nothing left to write are forgotten past this many (oldest first) or this many seconds
# of quiet: a completion then lists what is stored, as any other instance's does.
KEEP_WRITTEN = 4096
KEEP_WRITTEN_SECONDS = 3600.0
# An upload that never goes quiet has what it holds written after this many seconds all the same: a crash
# then loses at most this much of a long upload, and the janitors of other instances see it written to.
BUSY_WRITE_AFTER = 60.0


class Phase(Enum):
    """Where an upload this instance took parts of is in its life (see the module docstring)."""

    CREATED = "created"  # its state object is not stored yet
    HOLDING = "holding"  # its state is stored; part records are held unwritten
    WRITTEN = "written"  # its state and every record taken here are stored
    DONE = "done"  # completed, aborted or removed


class Event(Enum):
    HOLD = "hold"  # a part's record is held unwritten
    STATE_STORED = "state stored"  # the upload's state object is in the backend
    ALL_WRITTEN = "all written"  # no record is held unwritten any more
    CLOSE = "close"  # the upload is completed, aborted or removed


TRANSITIONS: dict[tuple[Phase, Event], Phase] = {
    (Phase.CREATED, Event.HOLD): Phase.CREATED,
    (Phase.CREATED, Event.STATE_STORED): Phase.HOLDING,  # then ALL_WRITTEN, when nothing is held
    (Phase.CREATED, Event.ALL_WRITTEN): Phase.CREATED,  # its state is still to be written
    (Phase.CREATED, Event.CLOSE): Phase.DONE,
    (Phase.HOLDING, Event.HOLD): Phase.HOLDING,
    (Phase.HOLDING, Event.STATE_STORED): Phase.HOLDING,
    (Phase.HOLDING, Event.ALL_WRITTEN): Phase.WRITTEN,
    (Phase.HOLDING, Event.CLOSE): Phase.DONE,
    (Phase.WRITTEN, Event.HOLD): Phase.HOLDING,
    (Phase.WRITTEN, Event.STATE_STORED): Phase.WRITTEN,
    (Phase.WRITTEN, Event.ALL_WRITTEN): Phase.WRITTEN,
    (Phase.WRITTEN, Event.CLOSE): Phase.DONE,
    # A part taken while its upload ends is not written: nothing is, once DONE.
    (Phase.DONE, Event.HOLD): Phase.DONE,
    (Phase.DONE, Event.STATE_STORED): Phase.DONE,
    (Phase.DONE, Event.ALL_WRITTEN): Phase.DONE,
    (Phase.DONE, Event.CLOSE): Phase.DONE,
}


@dataclass(eq=False)
class PendingUpload:
    """One upload this instance took parts of (see the module docstring)."""

    bucket: str
    state: UploadState
    phase: Phase
    # The newest record this instance took of each part number, written or not (inline bytes are kept
    # only while unwritten).
    parts: dict[int, PartRecord] = field(default_factory=dict)
    unwritten: set[int] = field(default_factory=set)  # part numbers whose record in `parts` is not stored
    written: set[str] = field(default_factory=set)  # backend keys of the upload's objects known to be there
    in_flight: int = 0  # UploadPart requests being served
    last_activity: float = field(default_factory=time.monotonic)
    held_since: float = field(default_factory=time.monotonic)  # since when something is unwritten
    retry_after: float = 0.0  # monotonic time before which a failed write is not tried again
    completing: int = 0  # completions of the upload in flight here: they write what they need themselves
    # Held by a flush and by an abort of the upload (and taken by a completion as it starts), so neither
    # writes nor deletes what the other is about to.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def name(self) -> str:
        return upload_name(self.state.upload_id)

    def advance(self, event: Event) -> Phase:
        """Take `event`: the phase the table gives."""
        self.phase = TRANSITIONS[(self.phase, event)]
        return self.phase

    @property
    def closed(self) -> bool:
        """Completed, aborted or removed: nothing more is written."""
        return self.phase is Phase.DONE

    @property
    def state_written(self) -> bool:
        """Nothing is left to write of the upload's state: it is stored (or the upload is done)."""
        return self.phase is not Phase.CREATED

    @property
    def has_unwritten(self) -> bool:
        return self.phase in (Phase.CREATED, Phase.HOLDING)

    def idle(self, now: float, delay: float) -> bool:
        """No part arriving or in flight for `delay` seconds."""
        return self.in_flight == 0 and now - self.last_activity >= delay


def cost(record: PartRecord) -> int:
    return RECORD_OVERHEAD + (len(record.inline) if record.inline is not None else 0)


class PendingUploads:
    """The uploads this instance holds records of, by (client bucket, upload name)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held_bytes = 0  # cost of the unwritten records
        self._uploads: dict[tuple[str, str], PendingUpload] = {}

    def __len__(self) -> int:
        return len(self._uploads)

    def __iter__(self) -> Iterator[PendingUpload]:
        return iter(list(self._uploads.values()))

    def get(self, bucket: str, name: str) -> PendingUpload | None:
        return self._uploads.get((bucket, name))

    def open(self, bucket: str, state: UploadState, *, state_written: bool) -> PendingUpload:
        """The upload's entry, made when this instance first meets it."""
        key = (bucket, upload_name(state.upload_id))
        entry = self._uploads.get(key)
        if entry is None or entry.closed:
            phase = Phase.WRITTEN if state_written else Phase.CREATED
            entry = self._uploads[key] = PendingUpload(bucket, state, phase)
            self._forget_written()
        return entry

    def state_stored(self, entry: PendingUpload, key: str) -> None:
        """The upload's state object is in the backend, at `key`."""
        entry.written.add(key)
        entry.advance(Event.STATE_STORED)
        if not entry.unwritten:
            entry.advance(Event.ALL_WRITTEN)

    def hold(self, entry: PendingUpload, record: PartRecord) -> bool:
        """Keep `record` unwritten as its part number's newest; False (nothing kept) when that would pass
        the bound, and the caller writes it at once."""
        old = entry.parts.get(record.part_no) if record.part_no in entry.unwritten else None
        freed = cost(old) if old is not None else 0
        if self.held_bytes - freed + cost(record) > self.max_bytes:
            return False
        if not entry.has_unwritten:
            entry.held_since = time.monotonic()
        self.held_bytes += cost(record) - freed
        entry.parts[record.part_no] = record
        entry.unwritten.add(record.part_no)
        entry.advance(Event.HOLD)
        return True

    def wrote(self, entry: PendingUpload, record: PartRecord, key: str, record_etag: str) -> None:
        """`record` is stored at `key` with ETag `record_etag` (its inline bytes are dropped here). A newer
        record of the same part number taken meanwhile stays unwritten."""
        entry.written.add(key)
        current = entry.parts.get(record.part_no)
        if current is not None and current is not record and current.newness >= record.newness:
            return
        if current is not None and record.part_no in entry.unwritten:
            entry.unwritten.discard(record.part_no)  # this record, or an older one it replaces
            self.held_bytes -= cost(current)
        entry.parts[record.part_no] = dataclasses.replace(record, inline=None, record_etag=record_etag)
        if not entry.unwritten:
            entry.advance(Event.ALL_WRITTEN)

    def superseded(self, entry: PendingUpload, record: PartRecord) -> None:
        """`record` is no longer the part (a newer one is stored, or its backend part was replaced): it is
        neither written nor used."""
        if entry.parts.get(record.part_no) is record and record.part_no in entry.unwritten:
            entry.unwritten.discard(record.part_no)
            self.held_bytes -= cost(record)
            del entry.parts[record.part_no]
            if not entry.unwritten:
                entry.advance(Event.ALL_WRITTEN)

    def close(self, entry: PendingUpload) -> None:
        """The upload is completed, aborted or removed: its records go unwritten."""
        entry.advance(Event.CLOSE)
        for no in entry.unwritten:
            self.held_bytes -= cost(entry.parts[no])
        entry.unwritten.clear()
        key = (entry.bucket, entry.name)
        if self._uploads.get(key) is entry:
            del self._uploads[key]

    def due(self, now: float, delay: float) -> list[PendingUpload]:
        """The uploads with something to write that went quiet `delay` seconds ago, or have held it for
        BUSY_WRITE_AFTER (and are not being flushed, completed or aborted right now)."""
        return [
            e
            for e in self._uploads.values()
            if e.has_unwritten
            and (e.idle(now, delay) or now - e.held_since >= BUSY_WRITE_AFTER)
            and now >= e.retry_after
            and not e.completing
            and not e.lock.locked()
        ]

    def live(self, bucket: str) -> list[PendingUpload]:
        """This instance's uploads in `bucket` that the backend does not show whole (records or state
        unwritten, or a part arriving)."""
        return [e for e in self._uploads.values() if e.bucket == bucket and (e.has_unwritten or e.in_flight)]

    def records_unwritten(self) -> int:
        return sum(len(e.unwritten) for e in self._uploads.values())

    def _forget_written(self) -> None:
        now = time.monotonic()
        done = [e for e in self._uploads.values() if not e.has_unwritten and not e.in_flight]
        old = {id(e) for e in done if now - e.last_activity > KEEP_WRITTEN_SECONDS}
        if len(done) > KEEP_WRITTEN:
            done.sort(key=lambda e: e.last_activity)
            old |= {id(e) for e in done[: len(done) - KEEP_WRITTEN]}
        for e in done:
            if id(e) in old and not e.lock.locked():
                del self._uploads[(e.bucket, e.name)]
