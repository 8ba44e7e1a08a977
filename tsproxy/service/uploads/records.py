"""What an upload keeps in the backend: its state, the record of each part, and what a completion
answered (docs/FORMAT.md gives their bytes; uploads.layout where they are)."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from tsproxy.format import SegmentInfo, TransformSettings

# How long a completed upload answers a repeated CompleteMultipartUpload as the first one was answered
# (SDKs repeat a Complete whose answer they did not get).
COMPLETED_UPLOAD_TTL = timedelta(hours=1)


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
class CompletedUpload:
    """What a CompleteMultipartUpload answered, kept for COMPLETED_UPLOAD_TTL to answer a retry alike."""

    key: str
    etag: str
    parts: tuple[tuple[int, str], ...]  # the request's (part number, ETag) list
    completed: datetime

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "key": self.key,
                "etag": self.etag,
                "parts": [list(p) for p in self.parts],
                "completed": self.completed.isoformat(),
            }
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> CompletedUpload:
        f = json.loads(data)
        parts = tuple((int(no), str(etag)) for no, etag in f["parts"])
        return cls(f["key"], f["etag"], parts, datetime.fromisoformat(f["completed"]))

    def answers(self, key: str, parts: Sequence[tuple[int, str]], now: datetime) -> bool:
        """Whether a Complete of `key` with `parts` repeats this one, within its lifetime."""
        return key == self.key and tuple(parts) == self.parts and now - self.completed < COMPLETED_UPLOAD_TTL
