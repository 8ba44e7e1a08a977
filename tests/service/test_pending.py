"""The records an instance holds unwritten: never dropped unless written or their upload ends, bounded."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from tsproxy.format import SegmentInfo, TransformSettings
from tsproxy.service.uploads.keeper import current_records, lacking
from tsproxy.service.uploads.pending import (
    BUSY_WRITE_AFTER,
    RECORD_OVERHEAD,
    TRANSITIONS,
    Event,
    PendingUploads,
    Phase,
)
from tsproxy.service.uploads.records import PartRecord, UploadState

WHEN = datetime(2026, 1, 2, tzinfo=UTC)
STATE = UploadState(
    "tok.YmFja2VuZA.dGlja2V0", "k", b"ctx", TransformSettings(), None, {}, {}, WHEN, "backend"
)


def _record(
    no: int, inline: bytes | None = None, *, at: float = 0, backend_etag: str | None = None
) -> PartRecord:
    segment = SegmentInfo(no, b"salt0123", 100, bytes(16), (len(inline or b"x" * 64),), True)
    received = WHEN + timedelta(seconds=at)
    return PartRecord(no, f"{no:032x}", 100, "", segment, received, backend_etag, inline, received=received)


def test_held_records_are_bounded_and_leave_only_once_written() -> None:
    pending = PendingUploads(max_bytes=2 * RECORD_OVERHEAD + 100)
    entry = pending.open("b", STATE, state_written=False)
    assert pending.get("b", "tok.YmFja2VuZA") is entry and entry.has_unwritten
    one, two = _record(1, b"a" * 50), _record(2, b"b" * 50)
    assert pending.hold(entry, one) and pending.hold(entry, two)
    assert not pending.hold(entry, _record(3, b"c")), "past the bound: the caller writes it at once"
    assert pending.held_bytes == 2 * RECORD_OVERHEAD + 100 and entry.unwritten == {1, 2}
    # A part sent again replaces its held record in the count.
    newer = _record(2, b"B" * 10, at=1)
    assert pending.hold(entry, newer) and pending.held_bytes == 2 * RECORD_OVERHEAD + 60
    pending.wrote(entry, one, "k1", "etag-1")
    assert entry.unwritten == {2} and entry.parts[1].inline is None and entry.parts[1].record_etag == "etag-1"
    # The older record of part 2 written (by a flush that began before the newer came): the newer stays.
    pending.wrote(entry, two, "k2", "etag-2")
    assert entry.unwritten == {2} and entry.parts[2] is newer
    assert entry.phase is Phase.CREATED  # the state is still to be written
    pending.state_stored(entry, "ks")
    assert entry.phase is Phase.HOLDING
    pending.wrote(entry, newer, "k2", "etag-3")
    assert not entry.has_unwritten and pending.held_bytes == 0 and entry.written == {"k1", "k2", "ks"}
    assert entry.phase is Phase.WRITTEN


def test_an_eager_write_of_a_newer_part_replaces_the_held_one() -> None:
    pending = PendingUploads(max_bytes=1 << 20)
    entry = pending.open("b", STATE, state_written=True)
    older = _record(5, b"old")
    assert pending.hold(entry, older)
    pending.wrote(entry, _record(5, b"new", at=1), "k5", "e")
    assert not entry.unwritten and pending.held_bytes == 0 and entry.parts[5].inline is None


def test_quiet_busy_and_closed_uploads() -> None:
    pending = PendingUploads(max_bytes=1 << 20)
    entry = pending.open("b", STATE, state_written=True)
    assert pending.hold(entry, _record(1, b"x"))
    start = entry.last_activity
    entry.in_flight = 1
    assert pending.due(start + 10, 2.0) == [] and pending.live("b") == [entry]
    assert pending.due(entry.held_since + BUSY_WRITE_AFTER, 2.0) == [entry], (
        "busy for long: written all the same"
    )
    entry.in_flight = 0
    assert pending.due(start + 1, 2.0) == [] and pending.due(start + 2, 2.0) == [entry]
    entry.completing = 1
    assert pending.due(start + 2, 2.0) == []
    entry.completing = 0
    pending.close(entry)
    assert entry.closed and pending.get("b", entry.name) is None and pending.held_bytes == 0
    assert pending.live("b") == []


def test_the_current_record_of_a_part_is_the_newest_the_backend_still_holds() -> None:
    stale = _record(1, at=0, backend_etag="old")
    fresh = _record(1, at=5, backend_etag="new")
    held = _record(2, b"tail", at=3)
    older_held = dataclasses.replace(_record(2, b"t", at=1), etag="f" * 32)
    records = current_records([fresh, stale, older_held, held], {1: {"new"}})
    assert records == {1: fresh, 2: held}
    # A store that keeps both uploads of part 1 (SeaweedFS): the newer still wins.
    assert current_records([stale, fresh], {1: {"old", "new"}})[1] is fresh
    # The backend no longer holds what a straight record names: that part has no record.
    assert current_records([stale], {1: {"new"}}) == {}
    assert lacking(records, [(1, f'"{1:032x}"'), (2, f"{2:032x}")], None) is False
    assert lacking(records, [(3, "x")], None) and lacking(records, [(2, "f" * 32)], None)
    assert lacking({}, None, {1: {"new"}}) and not lacking(records, None, {1: {"new"}})


def test_the_lifecycle_table_is_whole_and_done_is_final() -> None:
    assert set(TRANSITIONS) == {(phase, event) for phase in Phase for event in Event}
    assert all(TRANSITIONS[(Phase.DONE, event)] is Phase.DONE for event in Event)
    assert all(TRANSITIONS[(phase, Event.CLOSE)] is Phase.DONE for phase in Phase)
    # Every phase is reached from a fresh upload of one kind or the other.
    reached = {Phase.CREATED, Phase.WRITTEN}
    while True:
        more = {TRANSITIONS[(phase, event)] for phase in reached for event in Event} - reached
        if not more:
            break
        reached |= more
    assert reached == set(Phase)


@pytest.mark.parametrize("state_stored_first", [False, True])
def test_the_bookkeeping_walks_the_table(state_stored_first: bool) -> None:
    """Each call of the bookkeeping takes its event, and the phase is the table's."""
    pending = PendingUploads(max_bytes=1 << 20)
    entry = pending.open("b", STATE, state_written=state_stored_first)
    expected = Phase.WRITTEN if state_stored_first else Phase.CREATED
    assert entry.phase is expected

    def after(*events: Event) -> Phase:
        nonlocal expected
        for event in events:
            expected = TRANSITIONS[(expected, event)]
        return expected

    one, two = _record(1, b"a"), _record(2, b"b")
    assert pending.hold(entry, one) and entry.phase is after(Event.HOLD)
    assert pending.hold(entry, two) and entry.phase is after(Event.HOLD)
    if not state_stored_first:
        pending.state_stored(entry, "state")
        assert entry.phase is after(Event.STATE_STORED)
    pending.wrote(entry, one, "k1", "e1")
    assert entry.phase is expected is Phase.HOLDING  # part 2 is still held
    pending.superseded(entry, two)
    assert entry.phase is after(Event.ALL_WRITTEN) is Phase.WRITTEN
    assert pending.hold(entry, _record(3, b"c")) and entry.phase is after(Event.HOLD) is Phase.HOLDING
    pending.close(entry)
    assert entry.phase is after(Event.CLOSE) is Phase.DONE and entry.closed and not entry.has_unwritten
