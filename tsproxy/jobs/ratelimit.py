"""Request rate limiting for jobs: a pure token bucket, and a backend wrapper that waits on it.

A job's executors share one backend, so every task holds itself to its share of the executor's rate
(see `JobOptions.task_rate`): the executor as a whole never exceeds the rate the operator set.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Mapping, Sequence
from datetime import datetime

from tsproxy.store.base import Backend, Body, ListPage, ObjectInfo, ObjectReader, UploadInfo


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up. Pure: the caller passes the time.

    `reserve` never refuses: it takes the tokens at once (the balance may go negative, so callers queue
    in arrival order) and says how long to wait before acting. Over any interval that starts with a
    full bucket, the actions allowed to happen by time t are at most burst + rate * t.
    """

    def __init__(self, rate: float, burst: float | None = None, now: float = 0.0) -> None:
        if not rate > 0:
            raise ValueError("rate must be positive")
        self.rate = float(rate)
        self.burst = float(burst) if burst is not None else max(1.0, self.rate)
        if self.burst < 1:
            raise ValueError("burst must be at least 1")
        self._tokens = self.burst
        self._stamp = now

    def reserve(self, now: float, cost: float = 1.0) -> float:
        """Take `cost` tokens; return the seconds to wait from `now` before acting (0.0 when none)."""
        if now > self._stamp:
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
        self._tokens -= cost
        # A hair below zero is float rounding of a refill that was exactly enough, not a reason to wait.
        return 0.0 if self._tokens >= -1e-9 else -self._tokens / self.rate


class RateLimiter:
    """An asyncio front to a TokenBucket; a limiter with rate 0 (or None) never waits."""

    def __init__(self, rate: float | None, burst: float | None = None) -> None:
        self._bucket = TokenBucket(rate, burst, now=asyncio.get_running_loop().time()) if rate else None
        self.waited = 0.0  # seconds spent waiting, for the job's statistics

    async def acquire(self, cost: float = 1.0) -> None:
        """Return when the caller may make `cost` requests."""
        if self._bucket is None:
            return
        delay = self._bucket.reserve(asyncio.get_running_loop().time(), cost)
        if delay > 0:
            self.waited += delay
            await asyncio.sleep(delay)


class LimitedBackend:
    """A Backend whose every request first waits for the rate limiter; everything else is delegated.

    A streamed `put` counts as one request even when the backend turns it into a multipart upload;
    the jobs only stream object data in `migrate`, where the data transfer itself is the bound.
    """

    def __init__(self, inner: Backend, limiter: RateLimiter) -> None:
        self.inner = inner
        self.limiter = limiter
        self.min_part_size = inner.min_part_size

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def ping(self) -> None:
        await self.limiter.acquire()
        await self.inner.ping()

    async def list_buckets(self) -> builtins.list[tuple[str, datetime]]:
        await self.limiter.acquire()
        return await self.inner.list_buckets()

    async def create_bucket(self, bucket: str) -> None:
        await self.limiter.acquire()
        await self.inner.create_bucket(bucket)

    async def delete_bucket(self, bucket: str) -> None:
        await self.limiter.acquire()
        await self.inner.delete_bucket(bucket)

    async def head_bucket(self, bucket: str) -> None:
        await self.limiter.acquire()
        await self.inner.head_bucket(bucket)

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        await self.limiter.acquire()
        return await self.inner.head(bucket, key)

    async def get(
        self,
        bucket: str,
        key: str,
        first: int | None = None,
        last: int | None = None,
        *,
        if_match: str | None = None,
    ) -> ObjectReader:
        await self.limiter.acquire()
        return await self.inner.get(bucket, key, first, last, if_match=if_match)

    async def get_bytes(
        self,
        bucket: str,
        key: str,
        first: int | None = None,
        last: int | None = None,
        *,
        if_match: str | None = None,
    ) -> tuple[ObjectInfo, bytes]:
        await self.limiter.acquire()
        return await self.inner.get_bytes(bucket, key, first, last, if_match=if_match)

    async def put(
        self,
        bucket: str,
        key: str,
        body: Body,
        *,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo:
        await self.limiter.acquire()
        return await self.inner.put(bucket, key, body, metadata=metadata, content_type=content_type)

    async def delete(self, bucket: str, key: str) -> None:
        await self.limiter.acquire()
        await self.inner.delete(bucket, key)

    async def delete_many(self, bucket: str, keys: Sequence[str]) -> builtins.list[tuple[str, str, str]]:
        await self.limiter.acquire()
        return await self.inner.delete_many(bucket, keys)

    async def list(
        self,
        bucket: str,
        *,
        prefix: str = "",
        delimiter: str | None = None,
        start_after: str | None = None,
        token: str | None = None,
        max_keys: int = 1000,
    ) -> ListPage:
        await self.limiter.acquire()
        return await self.inner.list(
            bucket,
            prefix=prefix,
            delimiter=delimiter,
            start_after=start_after,
            token=token,
            max_keys=max_keys,
        )

    async def copy(
        self,
        src_bucket: str,
        src_key: str,
        dst_bucket: str,
        dst_key: str,
        *,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo:
        await self.limiter.acquire()
        return await self.inner.copy(
            src_bucket, src_key, dst_bucket, dst_key, metadata=metadata, content_type=content_type
        )

    async def create_multipart(
        self,
        bucket: str,
        key: str,
        *,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> str:
        await self.limiter.acquire()
        return await self.inner.create_multipart(bucket, key, metadata=metadata, content_type=content_type)

    async def upload_part(
        self, bucket: str, key: str, upload_id: str, part_no: int, body: Body, size: int | None = None
    ) -> str:
        await self.limiter.acquire()
        return await self.inner.upload_part(bucket, key, upload_id, part_no, body, size)

    async def upload_part_copy(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_no: int,
        src_bucket: str,
        src_key: str,
        first: int | None = None,
        last: int | None = None,
        *,
        src_etag: str | None = None,
    ) -> str:
        await self.limiter.acquire()
        return await self.inner.upload_part_copy(
            bucket, key, upload_id, part_no, src_bucket, src_key, first, last, src_etag=src_etag
        )

    async def complete_multipart(
        self, bucket: str, key: str, upload_id: str, parts: Sequence[tuple[int, str]]
    ) -> ObjectInfo:
        await self.limiter.acquire()
        return await self.inner.complete_multipart(bucket, key, upload_id, parts)

    async def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None:
        await self.limiter.acquire()
        await self.inner.abort_multipart(bucket, key, upload_id)

    async def list_multipart_uploads(self, bucket: str, prefix: str = "") -> builtins.list[UploadInfo]:
        await self.limiter.acquire()
        return await self.inner.list_multipart_uploads(bucket, prefix)
