"""The object service: S3 object semantics over a backend, in tsproxy's stored format.

The server's handlers speak HTTP; this package speaks objects. Each module has one job:

- `namespace`: where a client's bucket and key live in the backend, and the reserved namespace;
- `records`: what the service hands out and keeps (resolved objects, listings, multipart state);
- `core`: what every part shares (backend, key ring, settings, CPU pool, caches);
- `reads`: resolve a key to a stored object and stream its original bytes;
- `writes`: PutObject through the transform, copy, delete, rewrap;
- `multipart`: multipart uploads, each part a segment of its own until completion;
- `completion`: where an upload's parts are, and completing a straight upload in place;
- `tickets`: the upload ticket an upload id carries instead of a state object (pure);
- `pending`, `deferred`: part records held in memory, written when an upload goes quiet;
- `listing`, `buckets`: listings in the client's terms, and buckets;
- `catalog`: the size catalog that spares listings a HEAD per object.

Internal state (multipart uploads in progress) lives in the backend under the reserved namespace, or in
the upload id's ticket, so a restarted tsproxy, or another replica, picks up where the last one left off
(part records held in memory are written when an upload goes quiet and at a graceful stop).
"""

from __future__ import annotations

from tsproxy.service.buckets import BucketOps
from tsproxy.service.multipart import UploadOps
from tsproxy.service.namespace import INTERNAL, Location, Namespace
from tsproxy.service.records import (
    ByteRange,
    ListedObject,
    ListedPage,
    ObjectChanged,
    PartRecord,
    StoredObject,
    UploadState,
)

__all__ = [
    "INTERNAL",
    "ByteRange",
    "ListedObject",
    "ListedPage",
    "Location",
    "Namespace",
    "ObjectChanged",
    "ObjectService",
    "PartRecord",
    "StoredObject",
    "UploadState",
]


class ObjectService(UploadOps, BucketOps):
    """S3 object operations in tsproxy's format, over one backend: every part of the service in one."""
