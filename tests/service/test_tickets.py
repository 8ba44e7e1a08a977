"""Upload tickets: the codec pinned by a golden file, and every change to a ticket refused."""

from __future__ import annotations

import dataclasses
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.format.golden_cases import DEK, OBJECT_ID, golden_ring
from tsproxy.format import KeyRing, ObjectContext, TransformSettings
from tsproxy.service.uploads import tickets
from tsproxy.service.uploads.ids import (
    MAX_UPLOAD_ID,
    backend_upload_of,
    straight_upload_id,
    ticket_of,
    upload_name,
    upload_token,
    valid_upload_id,
)

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "upload-ticket-v1.bin"
BUCKET, KEY = "golden", "topic-0/00000000000000000000.log"
NAME = straight_upload_id("golden-token", "backend-upload")
SETTINGS = TransformSettings(
    chunk_size=4 << 20, compression="auto", level=1, encryption=True, format_version=2
)
INITIATED = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


def _golden_ctx(ring: KeyRing) -> ObjectContext:
    kek_id, wrapped = ring.wrap(DEK)
    return ObjectContext(OBJECT_ID, DEK, kek_id, wrapped)


def _golden_ticket() -> bytes:
    ctx = _golden_ctx(golden_ring())
    ticket = tickets.UploadTicket(ctx.to_state(), SETTINGS, "binary/octet-stream", INITIATED)
    return tickets.seal(ticket, ctx, BUCKET, KEY, NAME)


def test_the_golden_ticket_is_what_the_codec_makes_and_opens() -> None:
    data = GOLDEN.read_bytes()
    assert _golden_ticket() == data
    opened, ctx = tickets.open_ticket(data, BUCKET, KEY, NAME, golden_ring(), require_encryption=True)
    assert opened == tickets.UploadTicket(ctx.to_state(), SETTINGS, "binary/octet-stream", INITIATED)
    assert ctx.dek == DEK and ctx.object_id == OBJECT_ID
    # The documented offsets (docs/FORMAT.md): version, flags, settings, time, context length.
    assert data[0] == 1 and data[1] == 0b011  # encrypted; content type 1
    assert int.from_bytes(data[2:6], "big") == 4 << 20 and data[6:9] == bytes([2, 1, 2])
    assert int.from_bytes(data[9:17], "big") == 1767323045678
    n = int.from_bytes(data[17:19], "big")
    assert data[19 : 19 + n] == ctx.to_state() and len(data) == 19 + n + 16


def test_every_byte_of_a_ticket_is_checked() -> None:
    data, ring = GOLDEN.read_bytes(), golden_ring()
    for i in range(len(data)):
        for bit in (0x01, 0x80):
            changed = data[:i] + bytes([data[i] ^ bit]) + data[i + 1 :]
            with pytest.raises(tickets.TicketRefused):
                tickets.open_ticket(changed, BUCKET, KEY, NAME, ring, require_encryption=True)
    for shorter in (data[:-1], data[:10], b""):
        with pytest.raises(tickets.TicketRefused):
            tickets.open_ticket(shorter, BUCKET, KEY, NAME, ring, require_encryption=True)


def test_a_ticket_belongs_to_its_bucket_key_and_upload() -> None:
    data, ring = GOLDEN.read_bytes(), golden_ring()
    other_name = straight_upload_id("golden-token", "another-backend-upload")
    for bucket, key, name in (
        (BUCKET + "x", KEY, NAME),
        (BUCKET, KEY + "x", NAME),
        (BUCKET, KEY, other_name),
    ):
        with pytest.raises(tickets.TicketRefused):
            tickets.open_ticket(data, bucket, key, name, ring, require_encryption=True)
    with pytest.raises(tickets.TicketRefused):  # the KEK is not on this ring
        tickets.open_ticket(data, BUCKET, KEY, NAME, KeyRing.new(), require_encryption=True)
    with pytest.raises(tickets.TicketRefused):
        tickets.open_ticket(data, BUCKET, KEY, NAME, None, require_encryption=False)


def test_an_unencrypted_ticket_is_refused_where_encryption_is_on() -> None:
    ctx = ObjectContext(OBJECT_ID)
    plain = tickets.UploadTicket(
        ctx.to_state(), dataclasses.replace(SETTINGS, encryption=False), None, INITIATED
    )
    data = tickets.seal(plain, ctx, BUCKET, KEY, NAME)
    assert tickets.open_ticket(data, BUCKET, KEY, NAME, None, require_encryption=False)[0] == plain
    with pytest.raises(tickets.TicketRefused):
        tickets.open_ticket(data, BUCKET, KEY, NAME, golden_ring(), require_encryption=True)
    # An encrypted context under settings that say otherwise (or the reverse) is refused too.
    ring = golden_ring()
    mixed = tickets.UploadTicket(_golden_ctx(ring).to_state(), plain.settings, None, INITIATED)
    sealed = tickets.seal(mixed, _golden_ctx(ring), BUCKET, KEY, NAME)
    with pytest.raises(tickets.TicketRefused):
        tickets.open_ticket(sealed, BUCKET, KEY, NAME, ring, require_encryption=False)


def test_what_a_ticket_can_carry() -> None:
    assert tickets.ticketable(None, {}, {})
    assert tickets.ticketable("binary/octet-stream", {}, {}) and tickets.ticketable(
        "application/octet-stream", {}, {}
    )
    assert not tickets.ticketable("text/plain", {}, {})
    assert not tickets.ticketable(None, {"a": "1"}, {}) and not tickets.ticketable(
        None, {}, {"cache-control": "x"}
    )


@given(
    token=st.from_regex(r"[A-Za-z0-9_-]{1,40}", fullmatch=True),
    backend=st.text(min_size=1, max_size=200),
    ticket=st.binary(min_size=1, max_size=300),
)
def test_upload_ids_split_back_into_their_pieces(token: str, backend: str, ticket: bytes) -> None:
    plain, ticketed = straight_upload_id(token, backend), straight_upload_id(token, backend, ticket)
    assert valid_upload_id(plain) and (valid_upload_id(ticketed) or len(ticketed) > MAX_UPLOAD_ID)
    assert upload_name(ticketed) == upload_name(plain) == plain and upload_name(token) == token
    assert upload_token(ticketed) == token and backend_upload_of(ticketed) == backend == backend_upload_of(
        plain
    )
    assert ticket_of(ticketed) == ticket and ticket_of(plain) is None and ticket_of(token) is None


def test_ids_of_no_form_name_nothing() -> None:
    for bad in ("", "a/b", "a.b.c.d", "a..b", ".a", "a.", "a b", "x" * (MAX_UPLOAD_ID + 1), "../state"):
        assert not valid_upload_id(bad)


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    if GOLDEN.exists():
        sys.exit("the version 1 ticket exists already; it must not be regenerated")
    GOLDEN.write_bytes(_golden_ticket())


def test_an_id_whose_ticket_does_not_decode_names_no_state_object() -> None:
    uid = straight_upload_id("tok", "backend-upload", b"\x01\x02\x03")
    assert ticket_of(uid) == b"\x01\x02\x03"
    for garbled in (uid + "x", uid[:-1] + "!", uid + "A"):
        found = ticket_of(garbled)
        assert found is not None and found != b"\x01\x02\x03"  # never taken for an id without ticket
    assert ticket_of("tok.YmFja2VuZA") is None
