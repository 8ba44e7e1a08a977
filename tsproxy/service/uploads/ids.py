"""Client upload ids: what one is made of, and what it tells. Pure.

A client upload id is a random token. A *straight* upload is one whose parts go straight into a backend
multipart upload at the object's own key, begun with the client's upload (see service.uploads); its id
carries that backend upload's id after the token (`<token>.<backend upload id, base64url without
padding>`), so a bare listing of the reserved namespace tells which backend upload belongs to which
client upload. An upload that needs no state object adds its ticket (uploads.tickets) after another dot:
base64url has no dot, so the pieces split unambiguously. The upload's objects live below its *name*,
the id less the ticket (a key has at most 1024 bytes; the name stays short whatever the ticket holds).
"""

from __future__ import annotations

import base64
import re

_SEPARATOR = "."
_UPLOAD_ID = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+){0,2}")
MAX_UPLOAD_ID = 1024


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        return None


def straight_upload_id(token: str, backend_upload: str, ticket: bytes | None = None) -> str:
    """The client upload id of an upload whose parts go straight into `backend_upload` (with its ticket,
    when it has one)."""
    name = f"{token}{_SEPARATOR}{_b64(backend_upload.encode())}"
    return name if ticket is None else f"{name}{_SEPARATOR}{_b64(ticket)}"


def valid_upload_id(upload_id: str) -> bool:
    """Whether `upload_id` has one of the forms tsproxy hands out (anything else names no upload)."""
    return len(upload_id) <= MAX_UPLOAD_ID and _UPLOAD_ID.fullmatch(upload_id) is not None


def upload_token(upload_id: str) -> str:
    """The random token a client upload id begins with."""
    return upload_id.partition(_SEPARATOR)[0]


def upload_name(upload_id: str) -> str:
    """Where the upload's objects live (`.tsproxy/mpu/<name>/`): the id without its ticket."""
    token, _, rest = upload_id.partition(_SEPARATOR)
    backend = rest.partition(_SEPARATOR)[0]
    return f"{token}{_SEPARATOR}{backend}" if backend else token


def backend_upload_of(upload_id: str) -> str | None:
    """The backend upload a client upload id (or an upload's name) names, or None."""
    encoded = upload_id.split(_SEPARATOR)[1] if _SEPARATOR in upload_id else ""
    decoded = _unb64(encoded) if encoded else None
    if decoded is None:
        return None
    try:
        return decoded.decode()
    except UnicodeDecodeError:
        return None


def ticket_of(upload_id: str) -> bytes | None:
    """The ticket bytes a client upload id carries, or None (then the upload has a state object). An id
    with a ticket that does not decode gives b"", which no ticket check passes: it never falls back to
    the state object its upload may have written meanwhile."""
    pieces = upload_id.split(_SEPARATOR)
    if len(pieces) != 3:
        return None
    return _unb64(pieces[2]) or b""
