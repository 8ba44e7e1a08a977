"""What crashed or abandoned work leaves in the backend, and which of it may go: pure, over one listing.

A killed tsproxy (or a client that gave up) leaves, under a client bucket's reserved namespace:

- client multipart uploads `.tsproxy/mpu/<upload id>/` (state, part data, part records) nobody will
  complete;
- completed-upload records `.tsproxy/mpu-done/<upload id>` past the lifetime in which they answer a
  repeated CompleteMultipartUpload;
- probe objects `.tsproxy/probe-<hex>` of an interrupted `serve --check`;

and backend multipart uploads that were never completed nor aborted (an assembly cut short).

One notion of "stale" serves the offline jobs (jobs/inventory, jobs/cleanup) and the server's janitor:
a client upload is *live* while any of its objects was written within the allowed idle time, and a
backend upload is old once initiated longer ago than that. A backend upload that belongs to a live client
upload (under its `.tsproxy/mpu/<id>/`, or at the key a live upload completes to) is never old enough.

A client upload whose parts go straight into a backend upload names it in its id (see
records.straight_upload_id). That backend upload is the client upload's own: while the client upload's
state is listed it is no leftover of its own, whatever its age; it goes when the client upload goes
(`Sweep.attached`). Once the client upload's state is gone, it is an old backend upload like any other.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from tsproxy.service.namespace import INTERNAL
from tsproxy.service.uploads import layout
from tsproxy.service.uploads.ids import backend_upload_of
from tsproxy.service.uploads.layout import (
    STATE,
    internal_part,
    is_completed_record,
    is_probe,
    is_state,
    upload_folder_of,
    upload_prefix,
)
from tsproxy.store.base import Backend, UploadInfo, list_everything

UPLOADS = INTERNAL + layout.UPLOADS  # below a bucket root


class Listed(NamedTuple):
    """One object of the listing: backend key, stored size, backend ETag, last modified (epoch seconds)."""

    key: str
    size: int
    etag: str
    modified: float


@dataclass(frozen=True)
class UploadLeftover:
    """What a tsproxy multipart upload left in the backend under `.tsproxy/mpu/<upload_id>/`."""

    upload_id: str
    prefix: str  # backend key prefix holding it
    objects: int
    bytes: int
    newest: float  # last write, epoch seconds
    has_state: bool
    keys: tuple[str, ...]

    def idle(self, now: float, idle_after: float) -> bool:
        """Nothing of the upload written for `idle_after` seconds: it is no longer live."""
        return now - self.newest >= idle_after

    def stale(self, now: float, stale_after: float) -> bool:
        """No write for `stale_after` seconds (or parts without the upload's state: never completable)."""
        return not self.has_state or self.idle(now, stale_after)

    @property
    def state_key(self) -> str:
        return self.prefix + STATE

    @property
    def backend_upload(self) -> str | None:
        """The id of the backend upload its parts go straight into, when its id names one."""
        return backend_upload_of(self.upload_id)


def owned_by(
    backend_uploads: Iterable[UploadInfo], uploads: Iterable[UploadLeftover]
) -> dict[str, UploadInfo]:
    """The backend uploads that belong to a client upload whose state is listed, by client upload id."""
    by_id = {b.upload_id: b for b in backend_uploads}
    owned = {}
    for u in uploads:
        b = by_id.get(u.backend_upload or "")
        if u.has_state and b is not None:
            owned[u.upload_id] = b
    return owned


def unowned(backend_uploads: Iterable[UploadInfo], uploads: Iterable[UploadLeftover]) -> list[UploadInfo]:
    """The backend uploads that belong to no client upload whose state is listed."""
    listed = list(backend_uploads)
    owned = {(b.key, b.upload_id) for b in owned_by(listed, uploads).values()}
    return [b for b in listed if (b.key, b.upload_id) not in owned]


def find_uploads(items: Iterable[Listed], root: str) -> list[UploadLeftover]:
    """Group the internal multipart objects of one bucket root by upload id."""
    groups: dict[str, list[Listed]] = {}
    for item in items:
        upload_id = upload_folder_of(internal_part(item.key, root) or "")
        if upload_id is not None:
            groups.setdefault(upload_id, []).append(item)
    out = []
    for upload_id, members in sorted(groups.items()):
        out.append(
            UploadLeftover(
                upload_id=upload_id, prefix=upload_prefix(root, upload_id), objects=len(members),
                bytes=sum(m.size for m in members), newest=max(m.modified for m in members),
                has_state=any(is_state(m.key) for m in members), keys=tuple(m.key for m in members),
            )
        )  # fmt: skip
    return out


@dataclass(frozen=True)
class Sweep:
    """What may go from one bucket root, and the live uploads that decided what stays."""

    uploads: tuple[UploadLeftover, ...]  # client uploads idle past the age: all their objects go
    completed: tuple[str, ...]  # completed-upload records past their lifetime
    temporary: tuple[str, ...]  # probe objects past the age
    backend_uploads: tuple[UploadInfo, ...]  # old, and not under a live client upload's prefix
    live: tuple[UploadLeftover, ...]  # client uploads still live
    # The backend uploads of the idle client uploads in `uploads`, by client upload id: they go with them.
    attached: dict[str, UploadInfo] = field(default_factory=dict)

    def at_client_keys(self, root: str) -> list[UploadInfo]:
        """The backend uploads to abort that lie outside the reserved namespace (assemblies at a key)."""
        return [u for u in self.backend_uploads if internal_part(u.key, root) is None]


def plan_sweep(
    internal: Iterable[Listed],
    root: str,
    backend_uploads: Iterable[UploadInfo],
    now: float,
    age: float,
    completed_ttl: float,
) -> Sweep:
    """The leftovers of one bucket root: `internal` lists everything under `<root>.tsproxy/`.

    Backend uploads at client keys still need `spare_completing` (the keys of live uploads come from
    their state objects, which a listing does not show).
    """
    items = list(internal)
    uploads = find_uploads(items, root)
    idle = tuple(u for u in uploads if u.idle(now, age))
    live = tuple(u for u in uploads if not u.idle(now, age))
    live_prefixes = tuple(u.prefix for u in live)
    completed, temporary = [], []
    for item in items:
        rest = internal_part(item.key, root) or ""
        if is_completed_record(rest) and now - item.modified >= completed_ttl:
            completed.append(item.key)
        elif is_probe(rest) and now - item.modified >= age:
            temporary.append(item.key)
    listed = list(backend_uploads)
    old = tuple(
        b
        for b in unowned(listed, uploads)
        if now - b.initiated.timestamp() >= age and not b.key.startswith(live_prefixes)
    )
    return Sweep(idle, tuple(completed), tuple(temporary), old, live, owned_by(listed, idle))


def spare_completing(candidates: Sequence[UploadInfo], live_keys: Iterable[str]) -> list[UploadInfo]:
    """Leave out the backend uploads at a key that a live client upload completes to (its assembly may
    be the one in flight)."""
    keys = set(live_keys)
    return [u for u in candidates if u.key not in keys]


async def list_keys(backend: Backend, bucket: str, prefix: str = "") -> list[Listed]:
    """Every object under `prefix`, in the backend's listing order, as the planning here takes them."""
    return [
        Listed(o.key, o.size, o.etag, o.last_modified.timestamp())
        for o in await list_everything(backend, bucket, prefix)
    ]
