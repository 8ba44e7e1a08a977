"""What the object service hands out: resolved objects, listings, byte ranges (uploads: uploads.records)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from tsproxy import errors
from tsproxy.format import (
    Manifest,
    ObjectContext,
)
from tsproxy.service.namespace import Location
from tsproxy.service.prefix import StoredHead
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
    # The object's first stored bytes, fetched with its tail for the read that resolved it (see
    # service.prefix); never kept with the object beyond that read.
    head: StoredHead | None = field(default=None, compare=False, repr=False)

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
class ByteRange:
    """An inclusive byte range of a backend object, to become part of an assembled object."""

    loc: Location
    first: int
    last: int
    etag: str | None = None  # the source version the range must come from (None: any)
