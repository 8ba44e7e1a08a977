"""Upload tickets: what CreateMultipartUpload decided, carried in the client's upload id. Pure, no I/O.

A straight upload (its parts go into a backend multipart upload) whose object has no user metadata, no
kept headers and no content type but none or an octet-stream default needs no state object: its id
carries a ticket, so any instance, or this one after a restart, takes its parts without a backend
request. The ticket holds the object context as persisted (the DEK wrapped by a KEK, never the plain
one), the transform settings, the content type and the initiation time, then a check over them and the
upload's bucket, key and name (token and backend upload id): for an encrypted upload an HMAC under a key
derived from the DEK (`ObjectContext.ticket_mac`), so whoever holds the upload id can read its ticket but
only the holder of the DEK can make or change one; for an unencrypted upload a SHA-256, which catches a
ticket moved to another upload, not a forger (who, without encryption, has nothing to gain).

Bytes, big-endian (docs/FORMAT.md, "Upload tickets"; pinned by tests/golden/upload-ticket-v1.bin):

    offset  size  field
    0       1     version: 1
    1       1     flags: bit 0 encryption; bits 1-2 content type (0 none, 1 binary/octet-stream,
                  2 application/octet-stream); other bits 0
    2       4     chunk size
    6       1     compression: 0 off, 1 on, 2 auto
    7       1     zstd level
    8       1     stored format version the upload's segments are written in
    9       8     initiated, milliseconds since the epoch
    17      2     n: length of the object context state
    19      n     object context state (ObjectContext.to_state)
    19 + n  16    check of bytes 0 .. 19 + n, then the bucket, the key and the upload name, each a
                  varint length and UTF-8
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from tsproxy import errors
from tsproxy.format import KeyRing, ObjectContext, TransformSettings
from tsproxy.format.context import TICKET_MAC_SIZE
from tsproxy.format.settings import COMPRESSION_MODES, FORMAT_VERSION
from tsproxy.format.wire import varint

VERSION = 1
# version, flags, chunk size, compression, level, stored format version, initiated, n
_HEADER = struct.Struct(">BBIBBBQH")
_FLAG_ENCRYPTED = 0x01
_CONTENT_TYPE_SHIFT, _CONTENT_TYPE_MASK = 1, 0x06
# The content types a ticket can carry: none, and the defaults SDKs send on CreateMultipartUpload (the
# AWS SDK for Java v2 sends binary/octet-stream, v1 application/octet-stream; boto3 and the aws cli
# send none for a Kafka segment's name).
CONTENT_TYPES: tuple[str | None, ...] = (None, "binary/octet-stream", "application/octet-stream")


class TicketRefused(Exception):
    """The ticket is not one this upload was given (damaged, changed, moved, or not acceptable here)."""


@dataclass(frozen=True)
class UploadTicket:
    ctx_state: bytes  # ObjectContext.to_state(): the DEK wrapped, never plain
    # With the stored format version its segments are written in: every part of one object in one.
    settings: TransformSettings
    content_type: str | None
    initiated: datetime


def ticketable(content_type: str | None, metadata: Mapping[str, str], headers: Mapping[str, str]) -> bool:
    """Whether an upload created with these can do without a state object."""
    return content_type in CONTENT_TYPES and not metadata and not headers


def _body(ticket: UploadTicket) -> bytes:
    s = ticket.settings
    flags = (_FLAG_ENCRYPTED if s.encryption else 0) | (
        CONTENT_TYPES.index(ticket.content_type) << _CONTENT_TYPE_SHIFT
    )
    initiated = round(ticket.initiated.timestamp() * 1000)
    header = _HEADER.pack(
        VERSION,
        flags,
        s.chunk_size,
        COMPRESSION_MODES.index(s.compression),
        s.level,
        s.format_version,
        initiated,
        len(ticket.ctx_state),
    )
    return header + ticket.ctx_state


def _checked(body: bytes | memoryview, bucket: str, key: str, name: str) -> bytes:
    out = bytearray(body)
    for text in (bucket, key, name):
        raw = text.encode()
        out += varint(len(raw)) + raw
    return bytes(out)


def _check(ctx: ObjectContext, message: bytes) -> bytes:
    if ctx.encrypted:
        return ctx.ticket_mac(message)
    return hashlib.sha256(message).digest()[:TICKET_MAC_SIZE]


def seal(ticket: UploadTicket, ctx: ObjectContext, bucket: str, key: str, name: str) -> bytes:
    """The ticket's bytes for the upload `name` of `key` in `bucket`; `ctx` is the upload's context."""
    if ctx.to_state() != ticket.ctx_state:
        raise ValueError("the ticket's context is not the one given")
    body = _body(ticket)
    return body + _check(ctx, _checked(body, bucket, key, name))


def decode(data: bytes) -> UploadTicket:
    """The ticket's fields, unchecked (see `open_ticket`); TicketRefused when they do not parse."""
    if len(data) < _HEADER.size + TICKET_MAC_SIZE:
        raise TicketRefused("too short")
    version, flags, chunk_size, compression, level, stored_version, initiated, n = _HEADER.unpack_from(
        data, 0
    )
    if version != VERSION:
        raise TicketRefused(f"unknown version {version}")
    if not 1 <= stored_version <= FORMAT_VERSION:
        raise TicketRefused(f"stored format version {stored_version} is not one this release writes")
    if flags & ~(_FLAG_ENCRYPTED | _CONTENT_TYPE_MASK):
        raise TicketRefused("unknown flags")
    content_code = (flags & _CONTENT_TYPE_MASK) >> _CONTENT_TYPE_SHIFT
    if content_code >= len(CONTENT_TYPES) or compression >= len(COMPRESSION_MODES):
        raise TicketRefused("unknown content type or compression")
    if len(data) != _HEADER.size + n + TICKET_MAC_SIZE:
        raise TicketRefused("wrong length")
    try:
        settings = TransformSettings(
            chunk_size=chunk_size,
            compression=COMPRESSION_MODES[compression],
            level=level,
            encryption=bool(flags & _FLAG_ENCRYPTED),
            format_version=stored_version,
        )
    except errors.ConfigError as e:
        raise TicketRefused(str(e)) from None
    try:
        when = datetime.fromtimestamp(initiated / 1000, UTC)
    except (ValueError, OverflowError, OSError):
        raise TicketRefused("initiation time out of range") from None
    ctx_state = bytes(data[_HEADER.size : _HEADER.size + n])
    return UploadTicket(ctx_state, settings, CONTENT_TYPES[content_code], when)


def open_ticket(
    data: bytes,
    bucket: str,
    key: str,
    name: str,
    keyring: KeyRing | None,
    *,
    require_encryption: bool,
) -> tuple[UploadTicket, ObjectContext]:
    """The ticket and the upload's context (its DEK unwrapped), once the ticket is found to be the one
    this upload was given; TicketRefused otherwise, and for an unencrypted ticket when this instance
    encrypts (a client must not turn encryption off by editing its upload id)."""
    ticket = decode(data)
    if require_encryption and not ticket.settings.encryption:
        raise TicketRefused("unencrypted, and encryption is on")
    try:
        ctx = ObjectContext.from_state(ticket.ctx_state, keyring)
    except (errors.TsproxyError, ValueError) as e:
        raise TicketRefused(f"context: {e}") from None
    if ctx.encrypted != ticket.settings.encryption:
        raise TicketRefused("context and settings disagree on encryption")
    body_len = len(data) - TICKET_MAC_SIZE
    expected = _check(ctx, _checked(data[:body_len], bucket, key, name))
    if not hmac.compare_digest(expected, data[body_len:]):
        raise TicketRefused("check failed")
    return ticket, ctx
