"""The object service: S3 object semantics over a backend, in tsproxy's stored format.

The server's handlers speak HTTP; this package speaks objects. It is made of parts that hold each
other (none inherits another), under a small facade, `ObjectService`, which the server and the jobs use:

- the core (`core.ServiceCore`): what every part holds (backend, key ring, settings, CPU pool, the
  namespace and its layout, the size catalog, the resolved objects);
- objects: `reads.Reads` (resolve a key to a stored object, stream its original bytes) and
  `writes.Writes` (PutObject through the transform and its stages in `receive` and `lane`, copy,
  delete, assemble, rewrap), over `namespace` (client keys <-> backend keys);
- uploads (`uploads/`, one package): multipart uploads, each part a segment of its own until
  completion, with the reserved namespace's layout (`uploads.layout`);
- listing: `listing.Listing` (listings in the client's terms, `paging`) and `buckets.Buckets`, with
  the size catalog (`catalog`) that spares listings a HEAD per object;
- upkeep: `janitor` and `leftovers`, what abandoned uploads and killed processes leave behind.

`records` holds what the service hands out (resolved objects, listings, byte ranges).

Internal state (multipart uploads in progress) lives in the backend under the reserved namespace, or in
the upload id's ticket, so a restarted tsproxy, or another replica, picks up where the last one left off
(part records held in memory are written when an upload goes quiet and at a graceful stop).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from concurrent.futures import Executor
from datetime import datetime

from tsproxy import defaults
from tsproxy.cache.reader import ChunkReader
from tsproxy.format import KeyRing, TransformSettings
from tsproxy.metrics import Metrics
from tsproxy.s3.limits import MAX_LIST_KEYS
from tsproxy.service.buckets import Buckets
from tsproxy.service.catalog import SizeCatalog
from tsproxy.service.core import ServiceCore
from tsproxy.service.listing import Listing
from tsproxy.service.namespace import INTERNAL, Location, Namespace
from tsproxy.service.reads import Reads
from tsproxy.service.records import ByteRange, ListedObject, ListedPage, ObjectChanged, StoredObject
from tsproxy.service.uploads.multipart import Uploads
from tsproxy.service.uploads.records import CompletedUpload, PartRecord, UploadState
from tsproxy.service.writes import Writes
from tsproxy.store.base import Backend

__all__ = [
    "INTERNAL",
    "ByteRange",
    "CompletedUpload",
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


class ObjectService:
    """S3 object operations in tsproxy's format, over one backend: the facade over the service's parts
    (`core`, `reads`, `writes`, `uploads`, `listing`, `buckets`), each call handed to the part that
    serves it."""

    def __init__(
        self,
        backend: Backend,
        keyring: KeyRing | None,
        settings: TransformSettings,
        reader: ChunkReader,
        executor: Executor,
        *,
        namespace: Namespace | None = None,
        metrics: Metrics | None = None,
        part_size: int = 25 << 20,
        metadata_ttl: float = 5.0,
        stale_if_error: float = 0.0,
        catalog: SizeCatalog | None = None,
        upload_records: str = defaults.UPLOAD_RECORDS,
        upload_record_delay: float = defaults.UPLOAD_RECORD_DELAY,
    ) -> None:
        self.core = ServiceCore(
            backend,
            keyring,
            settings,
            reader,
            executor,
            namespace=namespace,
            metrics=metrics,
            part_size=part_size,
            metadata_ttl=metadata_ttl,
            stale_if_error=stale_if_error,
            catalog=catalog,
        )
        self.reads = Reads(self.core)
        self.writes = Writes(self.core, self.reads)
        self.listing = Listing(self.core, self.reads)
        self.buckets = Buckets(self.core, self.listing)
        self.uploads = Uploads(
            self.core,
            self.reads,
            self.writes,
            upload_records=upload_records,
            upload_record_delay=upload_record_delay,
        )
        # What the server and the jobs reach through the facade.
        self.backend = backend
        self.ns = self.core.ns
        self.layout = self.core.layout
        self.reader = reader
        self.pending = self.uploads.pending

    # -- life ----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background work (writing the part records of quiet uploads) with the server."""
        self.uploads.start()

    async def close(self) -> int:
        """Write every part record held (a graceful stop); how many the store refused."""
        return await self.uploads.close()

    def replace_keyring(self, keyring: KeyRing) -> None:
        self.core.replace_keyring(keyring)

    @property
    def keyring(self) -> KeyRing | None:
        return self.core.keyring

    # -- objects -------------------------------------------------------------------------------------

    async def resolve(self, bucket: str, key: str, *, head_for: int | None = None) -> StoredObject:
        return await self.reads.resolve(bucket, key, head_for=head_for)

    async def resolve_for_head(self, bucket: str, key: str) -> StoredObject:
        return await self.reads.resolve_for_head(bucket, key)

    def read(self, obj: StoredObject, first: int, last: int) -> AsyncIterator[bytes | memoryview]:
        return self.reads.read(obj, first, last)

    def invalidate(self, bucket: str, key: str) -> None:
        self.core.invalidate(bucket, key)

    async def put(
        self,
        bucket: str,
        key: str,
        payload: AsyncIterable[bytes | memoryview],
        *,
        content_type: str | None,
        metadata: Mapping[str, str],
        headers: Mapping[str, str],
        size_hint: int | None = None,
        etag: str | None = None,
        content_md5: bytes | None = None,
    ) -> StoredObject:
        return await self.writes.put(
            bucket,
            key,
            payload,
            content_type=content_type,
            metadata=metadata,
            headers=headers,
            size_hint=size_hint,
            etag=etag,
            content_md5=content_md5,
        )

    async def copy(
        self,
        src: StoredObject,
        bucket: str,
        key: str,
        *,
        replace: bool,
        content_type: str | None,
        metadata: Mapping[str, str],
        headers: Mapping[str, str],
    ) -> StoredObject:
        return await self.writes.copy(
            src, bucket, key, replace=replace, content_type=content_type, metadata=metadata, headers=headers
        )

    async def delete(self, bucket: str, key: str) -> None:
        await self.writes.delete(bucket, key)

    async def delete_many(self, bucket: str, keys: Sequence[str]) -> list[tuple[str, str, str]]:
        return await self.writes.delete_many(bucket, keys)

    async def rewrap(self, bucket: str, key: str) -> bool:
        return await self.writes.rewrap(bucket, key)

    # -- listing and buckets -------------------------------------------------------------------------

    async def list_objects(
        self,
        bucket: str,
        *,
        prefix: str = "",
        delimiter: str | None = None,
        start_after: str | None = None,
        token: str | None = None,
        max_keys: int = MAX_LIST_KEYS,
    ) -> ListedPage:
        return await self.listing.list_objects(
            bucket,
            prefix=prefix,
            delimiter=delimiter,
            start_after=start_after,
            token=token,
            max_keys=max_keys,
        )

    async def list_buckets(self) -> list[tuple[str, datetime]]:
        return await self.buckets.list_buckets()

    async def create_bucket(self, bucket: str) -> None:
        await self.buckets.create_bucket(bucket)

    async def delete_bucket(self, bucket: str) -> None:
        await self.buckets.delete_bucket(bucket)

    async def head_bucket(self, bucket: str) -> None:
        await self.core.head_bucket(bucket)

    # -- multipart uploads ---------------------------------------------------------------------------

    async def create_upload(
        self,
        bucket: str,
        key: str,
        *,
        content_type: str | None,
        metadata: Mapping[str, str],
        headers: Mapping[str, str],
    ) -> str:
        return await self.uploads.create_upload(
            bucket, key, content_type=content_type, metadata=metadata, headers=headers
        )

    async def upload_state(self, bucket: str, key: str | None, upload_id: str) -> UploadState:
        return await self.uploads.upload_state(bucket, key, upload_id)

    async def upload_part(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_no: int,
        payload: AsyncIterable[bytes | memoryview],
        *,
        content_md5: bytes | None = None,
        size_hint: int | None = None,
    ) -> PartRecord:
        return await self.uploads.upload_part(
            bucket, key, upload_id, part_no, payload, content_md5=content_md5, size_hint=size_hint
        )

    async def list_parts(self, bucket: str, key: str, upload_id: str) -> tuple[UploadState, list[PartRecord]]:
        return await self.uploads.list_parts(bucket, key, upload_id)

    async def complete_upload(
        self, bucket: str, key: str, upload_id: str, parts: Sequence[tuple[int, str]]
    ) -> CompletedUpload:
        return await self.uploads.complete_upload(bucket, key, upload_id, parts)

    async def abort_upload(self, bucket: str, key: str, upload_id: str) -> None:
        await self.uploads.abort_upload(bucket, key, upload_id)

    async def list_uploads(self, bucket: str, prefix: str = "") -> list[UploadState]:
        return await self.uploads.list_uploads(bucket, prefix)

    def forget_upload(self, bucket: str, name: str) -> None:
        self.uploads.forget_upload(bucket, name)

    async def flush_records(self) -> None:
        """Write the part records of every upload held now (tests and a graceful stop)."""
        await self.uploads.keeper.flush_records()
