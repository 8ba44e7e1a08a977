"""What the object service hands out and keeps: resolved objects, listings, multipart state, byte ranges."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from tsproxy import errors
from tsproxy.format import (
    Manifest,
    ObjectContext,
    SegmentInfo,
    TransformSettings,
)
from tsproxy.service.namespace import Location
from tsproxy.store.base import ObjectInfo


class ObjectChanged(errors.TsproxyError):
    """The backend object was replaced after it was resolved; its chunks belong to another version."""


@dataclass(frozen=True)
class StoredObject:
    """An object as the client sees it, plus what is needed to read it."""

    loc: Location
    size: int
    etag: str  # unquoted, as the client knows it
    last_modified: datetime
    content_type: str | None
    metadata: Mapping[str, str]
    headers: Mapping[str, str]
    backend_etag: str
    manifest: Manifest | None = None  # None: passthrough (not written by tsproxy)
    ctx: ObjectContext | None = None
    backend_metadata: Mapping[str, str] = field(default_factory=dict)
    # Described by the size catalog for a HEAD: no manifest was read, so it can't be read from.
    head_only: bool = False

    @property
    def passthrough(self) -> bool:
        return self.manifest is None and not self.head_only

    @classmethod
    def written(
        cls,
        loc: Location,
        info: ObjectInfo,
        manifest: Manifest,
        ctx: ObjectContext,
        backend_metadata: Mapping[str, str],
    ) -> StoredObject:
        """A tsproxy object: what the client sees comes from its manifest, the rest from the backend."""
        return cls(
            loc,
            manifest.size,
            manifest.etag,
            info.last_modified,
            manifest.content_type,
            dict(manifest.metadata),
            dict(manifest.headers),
            info.etag,
            manifest,
            ctx,
            backend_metadata,
        )


@dataclass(frozen=True)
class ListedObject:
    key: str
    size: int
    etag: str
    last_modified: datetime


@dataclass(frozen=True)
class ListedPage:
    objects: list[ListedObject]
    common_prefixes: list[str]
    is_truncated: bool
    next_token: str | None


@dataclass(frozen=True)
class PartRecord:
    """One uploaded part of a multipart upload (the state kept in its `.info` object)."""

    part_no: int
    etag: str
    size: int
    data_key: str  # the part's stored bytes as an object of their own; "" when straight or inline
    segment: SegmentInfo
    last_modified: datetime
    # The ETag of the backend multipart part (number `part_no` of the upload's `backend_upload`) that
    # holds the stored bytes, when they went there straight; None when they are at `data_key`.
    backend_etag: str | None = None
    # The stored bytes themselves, for a part small enough to be kept in its `.info` object (after the
    # segment): one PUT instead of a data object and a record.
    inline: bytes | None = field(default=None, compare=False, repr=False)
    # The backend ETag of the `.info` object this record was read from or written as (not stored): a
    # copy of inline bytes from there is pinned to it.
    record_etag: str | None = field(default=None, compare=False, repr=False)
    # When the instance that took the part received it (its clock): of two records of one part number
    # written by different instances, the newer one is the part (records written before had none).
    received: datetime | None = None

    @property
    def kept_inline(self) -> bool:
        return not self.data_key and self.backend_etag is None

    def _head(self, inline: int | None) -> bytes:
        fields: dict[str, object] = {
            "part": self.part_no,
            "etag": self.etag,
            "size": self.size,
            "data": self.data_key,
        }
        if self.backend_etag is not None:
            fields["backend_etag"] = self.backend_etag
        if self.received is not None:
            fields["received"] = self.received.isoformat()
        if inline is not None:
            fields["inline"] = inline
        return json.dumps(fields).encode() + b"\n" + self.segment.to_bytes()

    def to_bytes(self) -> bytes:
        if self.inline is None:
            return self._head(None)
        return self._head(len(self.inline)) + self.inline

    @property
    def inline_offset(self) -> int:
        """Where a part kept inline starts in its `.info` object (its stored size is the segment's)."""
        return len(self._head(self.segment.stored_size))

    @classmethod
    def from_head(
        cls, data: bytes, stored_len: int, last_modified: datetime, record_etag: str | None = None
    ) -> PartRecord | None:
        """The record from the first bytes of its `.info` object (`stored_len` bytes in all), without the
        part it may keep (`inline` stays None; `kept_inline` tells). None when `data` is too short."""
        head, newline, rest = data.partition(b"\n")
        if not newline:
            return None
        fields = json.loads(head)
        kept = int(fields["inline"]) if "inline" in fields else 0
        segment_len = stored_len - len(head) - 1 - kept
        if kept < 0 or segment_len < 0:
            raise ValueError("a part record shorter than the part it keeps")
        if len(rest) < segment_len:
            return None
        return cls(
            fields["part"],
            fields["etag"],
            fields["size"],
            fields["data"],
            SegmentInfo.from_bytes(rest[:segment_len]),
            last_modified,
            fields.get("backend_etag"),
            None,
            record_etag,
            _received(fields),
        )

    @classmethod
    def from_bytes(cls, data: bytes, last_modified: datetime, record_etag: str | None = None) -> PartRecord:
        head, _, seg = data.partition(b"\n")
        fields = json.loads(head)
        inline: bytes | None = None
        if "inline" in fields:
            size = int(fields["inline"])
            if not 0 <= size <= len(seg):
                raise ValueError("a part record shorter than the part it keeps")
            seg, inline = seg[: len(seg) - size], seg[len(seg) - size :]
        return cls(
            fields["part"],
            fields["etag"],
            fields["size"],
            fields["data"],
            SegmentInfo.from_bytes(seg),
            last_modified,
            fields.get("backend_etag"),
            inline,
            record_etag,
            _received(fields),
        )

    @property
    def newness(self) -> datetime:
        """When the part arrived, as well as it is known: its receipt, else its record's write."""
        return self.received if self.received is not None else self.last_modified


def _received(fields: Mapping[str, object]) -> datetime | None:
    value = fields.get("received")
    return datetime.fromisoformat(value) if isinstance(value, str) else None


# A client upload id is a random token; one whose parts go straight into a backend multipart upload
# carries that upload's id after it (`<token>.<backend upload id, base64url without padding>`), so a bare
# listing of the reserved namespace tells which backend upload belongs to which client upload. An upload
# that needs no state object adds its ticket (service.tickets) after another dot: base64url has no dot,
# so the pieces split unambiguously. The upload's objects live below its *name*, the id less the ticket
# (a key has at most 1024 bytes; the name stays short whatever the ticket holds).
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


@dataclass(frozen=True)
class UploadState:
    """A multipart upload in progress: what CreateMultipartUpload decided, kept in the backend."""

    upload_id: str
    key: str
    ctx_state: bytes
    settings: TransformSettings
    content_type: str | None
    metadata: dict[str, str]
    headers: dict[str, str]
    initiated: datetime
    # The backend multipart upload at the object's own key that parts go to straight (None: every part
    # is kept as an object of its own until completion, as uploads begun by older versions are).
    backend_upload: str | None = None

    def to_bytes(self) -> bytes:
        s = self.settings
        fields: dict[str, object] = {
            "upload_id": self.upload_id,
            "key": self.key,
            "ctx": base64.b64encode(self.ctx_state).decode(),
            # The stored format version rides last, and only when it is not 1 (states written by
            # releases before format 2 have four settings, and are read as version 1).
            "settings": [s.chunk_size, s.compression, s.level, s.encryption]
            + ([s.format_version] if s.format_version != 1 else []),
            "content_type": self.content_type,
            "metadata": self.metadata,
            "headers": self.headers,
            "initiated": self.initiated.isoformat(),
        }
        if self.backend_upload is not None:
            fields["backend_upload"] = self.backend_upload
        return json.dumps(fields).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> UploadState:
        f = json.loads(data)
        chunk_size, compression, level, encryption, *rest = f["settings"]
        return cls(
            f["upload_id"],
            f["key"],
            base64.b64decode(f["ctx"]),
            TransformSettings(
                chunk_size=chunk_size,
                compression=compression,
                level=level,
                encryption=encryption,
                format_version=int(rest[0]) if rest else 1,
            ),
            f["content_type"],
            f["metadata"],
            f["headers"],
            datetime.fromisoformat(f["initiated"]),
            f.get("backend_upload"),
        )


@dataclass(frozen=True)
class ByteRange:
    """An inclusive byte range of a backend object, to become part of an assembled object."""

    loc: Location
    first: int
    last: int
    etag: str | None = None  # the source version the range must come from (None: any)
