"""Whether the object store is up, and the one wrapper through which its health meets the request path.

`BackendHealth` holds the up/down state: whether the store serves, not merely whether it answers.
Probes (server.probes) set it; request outcomes move it too: three requests in a row that fail for the
store's sake (after their retries) mark the store down, any other answer marks it up. Failing for the
store's sake is not reaching it (or its refusing tsproxy's credentials: ServiceUnavailable) and its
answering a server error, 500, 502, 503 or 504 (`StoreFault`): an S3 gateway whose volumes are down
answers every request, and serves none. Throttling (503 SlowDown, 429) is the store serving, but busy:
it is retried more patiently and passed on, and never marks the store down. Nor is an answer about the
object or bucket (NoSuchKey, PreconditionFailed ...) or 501 NotImplemented.

While it is down, `GuardedBackend` answers 503 at once instead of letting every request wait out its
retries and timeouts, and lets one request through every few seconds to see whether the store is back
(a trial that fails gets the same 503). A probe that passes brings it back, unless a request got a server
error since the probe before: the probes only ask about the bucket, which a store may answer while every
object request fails (a store that could not be reached, and now can, is back). Cached reads never reach
the backend and go on.

`GuardedBackend` spells out every backend operation it guards (the object path, multipart uploads and
bucket administration); lifecycle (`start`, `close`) and `ping` go to the store untouched, and the
probes use the store as opened, not this wrapper, so they can see it come back.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import TypeVar

from tsproxy import errors
from tsproxy.store.base import (
    STORE_UNAVAILABLE,
    Backend,
    Body,
    BodyMD5,
    LeavesLeftovers,
    ListPage,
    MultipartCapable,
    ObjectInfo,
    ObjectReader,
    StoreFault,
    Uploads,
    buckets_of,
    multipart_of,
)
from tsproxy.store.s3errors import BackendRefused

log = logging.getLogger("tsproxy.backend")

TRIP_AFTER = 3  # consecutive unavailable outcomes that mark the store down
TRIAL_EVERY = 2.0  # seconds between requests let through while the store is down

T = TypeVar("T")
# Aliases, because `list` is also a method name here.
PartList = list[tuple[int, str]]
BucketList = list[tuple[str, datetime]]


def unavailable(reason: str) -> errors.S3Error:
    """The error clients get while the store is down."""
    return errors.ServiceUnavailable(
        f"The object store behind tsproxy is unavailable ({reason}); cached data is still served. "
        "Retry later."
    )


def fails_store(error: BaseException) -> bool:
    """Whether a backend request's failure says the store does not serve (see the module docstring)."""
    return isinstance(error, STORE_UNAVAILABLE)


def reason_of(error: errors.S3Error) -> str:
    """Why the store is down, from a failed request: a sentence for the log and the clients' 503."""
    if isinstance(error, StoreFault):
        return f"it answers {error.answer}"
    return str(error.message).rstrip(".")


class BackendHealth:
    """Whether the object store is up, from probes and request outcomes.

    on_change(up) is called with every state set (the `tsproxy_backend_up` gauge).
    """

    def __init__(
        self,
        on_change: Callable[[bool], None] | None = None,
        *,
        trip_after: int = TRIP_AFTER,
        trial_every: float = TRIAL_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.on_change = on_change
        self.trip_after = trip_after
        self.trial_every = trial_every
        self.clock = clock
        self.up = True
        self.reason = ""
        self._failures = 0
        self._last_trial = 0.0  # when the store went down, or the last trial request went through
        self._last_fault = -math.inf  # when a request last got a server error (StoreFault)
        self._last_probe = -math.inf
        if on_change is not None:
            on_change(True)

    def probed(self, failure: str | None) -> None:
        """A probe's result: the message of the first failure that makes the store unusable, or None.

        A probe that passes does not bring the store back while requests keep getting server errors: it
        stays down when one got one since the probe before (see the module docstring).
        """
        now = self.clock()
        previous, self._last_probe = self._last_probe, now
        if failure is None and not self.up and self._last_fault >= previous:
            return
        self._set(failure is None, failure or "")

    def outcome(self, error: BaseException | None) -> None:
        """A backend request's outcome (after its retries)."""
        if error is None or not fails_store(error):
            # Any other answer means the store serves (NoSuchKey and SlowDown are answers).
            if error is None or isinstance(error, errors.S3Error):
                self._failures = 0
                self._set(True, "")
            return
        assert isinstance(error, errors.S3Error)
        self._failures += 1
        if isinstance(error, StoreFault):
            self._last_fault = self.clock()
        if self._failures >= self.trip_after or not self.up:
            self._set(False, reason_of(error))

    def admit(self) -> None:
        """Raise the 503 clients get while the store is down, except for one trial now and then."""
        if self.up:
            return
        now = self.clock()
        if now - self._last_trial >= self.trial_every:
            self._last_trial = now
            return
        raise unavailable(self.reason)

    def _set(self, up: bool, reason: str) -> None:
        was = self.up
        self.up, self.reason = up, reason if not up else ""
        if self.on_change is not None:
            self.on_change(up)
        if was and not up:
            self._last_trial = self.clock()
            log.error(
                "object store unavailable: uncached reads and writes fail fast with 503 until it is back",
                extra={"fields": {"reason": reason}},
            )
        elif up and not was:
            self._failures = 0
            log.warning("object store available again")


class GuardedBackend:
    """A backend that fails fast while the store is down and reports every outcome to `health`.

    A backend AccessDenied is tsproxy's problem, not the client's: it becomes BackendRefused (503).
    Multipart and bucket operations reach the store only when it has them (else the 501 of
    `multipart_of` / `buckets_of`), and `min_part_size` is set only when the store has it, so
    `isinstance(guarded, MultipartCapable)` tells the truth about what it wraps.
    """

    min_part_size: int  # set only when the store has multipart uploads (see the class docstring)

    def __init__(self, inner: Backend, health: BackendHealth) -> None:
        self.inner = inner
        self.health = health
        if isinstance(inner, MultipartCapable):
            self.min_part_size = inner.min_part_size

    async def _guarded(self, call: Awaitable[T]) -> T:
        health = self.health
        try:
            health.admit()
        except BaseException:
            if hasattr(call, "close"):
                call.close()  # the call never started: no "never awaited" warning
            raise
        try:
            result = await call
        except errors.AccessDenied as e:
            refused = BackendRefused("AccessDenied")
            health.outcome(refused)
            raise refused from e
        except StoreFault as e:
            health.outcome(e)
            if health.up:
                raise
            # The store is down (now, or still, after a trial): the 503 every other request gets.
            raise unavailable(health.reason) from e
        except errors.S3Error as e:
            health.outcome(e)
            raise
        health.outcome(None)
        return result

    # -- untouched: lifecycle and readiness ----------------------------------------------------------

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def ping(self) -> None:
        await self.inner.ping()

    async def remove_leftovers(self, older_than: float) -> int:
        """The store's own leftovers (LeavesLeftovers), when it leaves any: local files, no request."""
        inner = self.inner
        return await inner.remove_leftovers(older_than) if isinstance(inner, LeavesLeftovers) else 0

    # -- the object path -----------------------------------------------------------------------------

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        return await self._guarded(self.inner.head(bucket, key))

    async def get(
        self,
        bucket: str,
        key: str,
        first: int | None = None,
        last: int | None = None,
        *,
        if_match: str | None = None,
    ) -> ObjectReader:
        return await self._guarded(self.inner.get(bucket, key, first, last, if_match=if_match))

    async def get_bytes(
        self,
        bucket: str,
        key: str,
        first: int | None = None,
        last: int | None = None,
        *,
        if_match: str | None = None,
    ) -> tuple[ObjectInfo, bytes]:
        return await self._guarded(self.inner.get_bytes(bucket, key, first, last, if_match=if_match))

    async def put(
        self,
        bucket: str,
        key: str,
        body: Body,
        *,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
        content_md5: BodyMD5 | None = None,
    ) -> ObjectInfo:
        return await self._guarded(
            self.inner.put(
                bucket, key, body, metadata=metadata, content_type=content_type, content_md5=content_md5
            )
        )

    async def delete(self, bucket: str, key: str) -> None:
        await self._guarded(self.inner.delete(bucket, key))

    async def delete_many(self, bucket: str, keys: Sequence[str]) -> list[tuple[str, str, str]]:
        return await self._guarded(self.inner.delete_many(bucket, keys))

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
        return await self._guarded(
            self.inner.list(
                bucket,
                prefix=prefix,
                delimiter=delimiter,
                start_after=start_after,
                token=token,
                max_keys=max_keys,
            )
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
        return await self._guarded(
            self.inner.copy(
                src_bucket, src_key, dst_bucket, dst_key, metadata=metadata, content_type=content_type
            )
        )

    # -- multipart uploads (MultipartCapable) --------------------------------------------------------

    async def create_multipart(
        self,
        bucket: str,
        key: str,
        *,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> str:
        mp = multipart_of(self.inner)
        return await self._guarded(
            mp.create_multipart(bucket, key, metadata=metadata, content_type=content_type)
        )

    async def upload_part(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_no: int,
        body: Body,
        size: int | None = None,
        *,
        content_md5: BodyMD5 | None = None,
    ) -> str:
        mp = multipart_of(self.inner)
        return await self._guarded(
            mp.upload_part(bucket, key, upload_id, part_no, body, size, content_md5=content_md5)
        )

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
        mp = multipart_of(self.inner)
        return await self._guarded(
            mp.upload_part_copy(
                bucket, key, upload_id, part_no, src_bucket, src_key, first, last, src_etag=src_etag
            )
        )

    async def complete_multipart(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        parts: Sequence[tuple[int, str]],
        *,
        size: int | None = None,
    ) -> ObjectInfo:
        mp = multipart_of(self.inner)
        return await self._guarded(mp.complete_multipart(bucket, key, upload_id, parts, size=size))

    async def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None:
        await self._guarded(multipart_of(self.inner).abort_multipart(bucket, key, upload_id))

    async def list_multipart_uploads(self, bucket: str, prefix: str = "") -> Uploads:
        return await self._guarded(multipart_of(self.inner).list_multipart_uploads(bucket, prefix))

    async def list_parts(self, bucket: str, key: str, upload_id: str) -> PartList:
        return await self._guarded(multipart_of(self.inner).list_parts(bucket, key, upload_id))

    # -- buckets (BucketCapable) ---------------------------------------------------------------------

    async def list_buckets(self) -> BucketList:
        return await self._guarded(buckets_of(self.inner).list_buckets())

    async def create_bucket(self, bucket: str) -> None:
        await self._guarded(buckets_of(self.inner).create_bucket(bucket))

    async def delete_bucket(self, bucket: str) -> None:
        await self._guarded(buckets_of(self.inner).delete_bucket(bucket))

    async def head_bucket(self, bucket: str) -> None:
        await self._guarded(buckets_of(self.inner).head_bucket(bucket))
