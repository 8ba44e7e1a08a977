"""Buckets: a backend bucket each, or a prefix each inside one backend bucket (see namespace)."""

from __future__ import annotations

from datetime import UTC, datetime

from tsproxy import errors
from tsproxy.s3.limits import MAX_LIST_KEYS
from tsproxy.service.core import ServiceCore
from tsproxy.service.listing import Listing
from tsproxy.store.base import buckets_of


class Buckets:
    """List, create and delete buckets (a bucket must be empty to go); with Listing, the listing part."""

    def __init__(self, core: ServiceCore, listing: Listing) -> None:
        self.core = core
        self.listing = listing
        self.backend = core.backend
        self.ns = core.ns
        self.layout = core.layout
        self.catalog = core.catalog

    async def list_buckets(self) -> list[tuple[str, datetime]]:
        if not self.ns.mapped:
            return await buckets_of(self.backend).list_buckets()
        assert self.ns.backend_bucket is not None
        page = await self.backend.list(
            self.ns.backend_bucket, prefix=self.ns.backend_prefix, delimiter="/", max_keys=MAX_LIST_KEYS
        )
        names = [p[len(self.ns.backend_prefix) :].rstrip("/") for p in page.common_prefixes]
        # `<prefix>.tsproxy/` holds tsproxy's own objects (serve --check's probe), and no prefix whose
        # name CreateBucket refuses is a bucket.
        return [(n, datetime.fromtimestamp(0, UTC)) for n in names if self.ns.addressable(n)]

    async def create_bucket(self, bucket: str) -> None:
        if not self.ns.mapped:
            await buckets_of(self.backend).create_bucket(bucket)
            return
        marker = self.layout.bucket_marker(bucket)
        try:
            await self.backend.head(marker.bucket, marker.key)
        except errors.NoSuchKey:
            await self.backend.put(marker.bucket, marker.key, b"")
            self.core.bucket_exists(bucket)
            return
        raise errors.BucketAlreadyOwnedByYou(BucketName=bucket)

    async def delete_bucket(self, bucket: str) -> None:
        root = self.ns.root(bucket)
        await self.core.head_bucket(bucket)
        page = await self.listing.list_objects(bucket, max_keys=1)
        if page.objects or page.common_prefixes:
            raise errors.BucketNotEmpty(BucketName=bucket)
        # Drop internal leftovers (aborted uploads' state, size catalog) before the bucket itself.
        if self.catalog is not None:
            self.catalog.forget(bucket)
        internal = self.layout.reserved(bucket)
        while True:
            inner = await self.backend.list(internal.bucket, prefix=internal.key, max_keys=MAX_LIST_KEYS)
            keys = [o.key for o in inner.objects if not self.layout.is_bucket_marker(o.key)]
            if keys:
                await self.backend.delete_many(internal.bucket, keys)
            if not inner.is_truncated or not keys:
                break
        if self.ns.mapped:
            marker = self.layout.bucket_marker(bucket)
            self.core.bucket_gone(bucket)
            await self.backend.delete(marker.bucket, marker.key)
        else:
            await buckets_of(self.backend).delete_bucket(root.bucket)
