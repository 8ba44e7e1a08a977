"""The storage interface every backend implements, and the small pure rules they share.

The server stores *already transformed* bytes through `Backend` and knows nothing of S3 clients or
directories. Every failure a backend reports is a typed S3 error from `tsproxy.errors`, so the server can
hand it to its own client as it is.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from tsproxy import errors
from tsproxy.s3.limits import MAX_KEY_BYTES, MAX_PART_SIZE, MAX_PARTS, MIB, MIN_PART_SIZE, check_part_number

__all__ = [  # the S3 limits are re-exported: the backends and their callers take them from here
    "DEFAULT_PART_SIZE",
    "MAX_KEY_BYTES",
    "MAX_PARTS",
    "MAX_PART_SIZE",
    "MIB",
    "MIN_PART_SIZE",
    "STORE_UNAVAILABLE",
    "Backend",
    "Body",
    "BodyMD5",
    "BucketCapable",
    "LeavesLeftovers",
    "ListPage",
    "MultipartCapable",
    "ObjectInfo",
    "ObjectReader",
    "StoreFault",
    "UploadInfo",
    "Uploads",
    "VersionRanges",
    "buckets_of",
    "check_key",
    "check_part_list",
    "check_part_number",
    "check_range_args",
    "iterate_body",
    "multipart_etag",
    "multipart_of",
    "normalize_metadata",
    "range_header",
    "resolve_range",
    "unquote_etag",
]

DEFAULT_PART_SIZE = 25 * MIB


class StoreFault(errors.InternalError):  # type: ignore[misc,valid-type]
    """The store answered a server error (500, 502, 504 ...) after every retry: its front door is up, yet
    it does not serve (an S3 gateway whose volumes are down, say).

    Clients get the 500 InternalError S3 gives; the store's health counts it as the store being down, as
    it does 503 ServiceUnavailable. Throttling (503 SlowDown, 429) and 501 NotImplemented are answers.
    """

    def __init__(self, status: int, code: str, message: str | None = None, **fields: str) -> None:
        super().__init__(message or f"The storage backend answered {code}.", **fields)
        self.backend_status = status
        self.backend_code = code

    @property
    def answer(self) -> str:
        """What the store answered, for a person: "500 InternalError", "502"."""
        status = str(self.backend_status) if self.backend_status else ""
        return " ".join(dict.fromkeys(part for part in (status, self.backend_code) if part))


# The failures that say the store does not serve (not reached, refusing our credentials, or answering
# server errors): what its health counts, and what lets a reader fall back on what it saw before.
STORE_UNAVAILABLE: tuple[type[BaseException], ...] = (errors.ServiceUnavailable, StoreFault)


@dataclass(frozen=True)
class ObjectInfo:
    """What a backend knows of one stored object."""

    key: str
    size: int
    etag: str  # unquoted backend ETag
    last_modified: datetime  # tz-aware UTC
    # User metadata: lower-case names without "x-amz-meta-" (empty in listings). Not part of the hash.
    metadata: Mapping[str, str] = field(default_factory=dict, hash=False)
    content_type: str | None = None


@dataclass(frozen=True)
class ListPage:
    """One page of a listing, in S3 order (UTF-8 bytes of the key)."""

    objects: list[ObjectInfo]
    common_prefixes: list[str]
    is_truncated: bool
    next_token: str | None


@dataclass(frozen=True)
class UploadInfo:
    """A backend multipart upload in progress."""

    key: str
    upload_id: str
    initiated: datetime


Uploads = list[UploadInfo]  # an alias, because `list` is also a Backend method name


@runtime_checkable
class ObjectReader(Protocol):
    """An object body being read: iterate it for bounded pieces, or `read()` the rest of a small one."""

    info: ObjectInfo  # of the whole object
    content_range: tuple[int, int] | None  # inclusive byte range served, None for the whole object

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def read(self) -> bytes: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> ObjectReader: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


Body = bytes | bytearray | memoryview | AsyncIterable[bytes]
# The MD5 of a whole body when its writer knows it (it hashed the bytes as it made them), so the backend
# need not hash them again before sending: the digest, or for a streamed body a function that gives it
# once the stream has ended. A backend that checks bodies checks them against it (BadDigest).
BodyMD5 = bytes | Callable[[], bytes]


class Backend(Protocol):
    """Where stored bytes live: the object path every backend has. All methods raise
    `tsproxy.errors.S3Error` subclasses on failure.

    Multipart uploads and bucket administration are separate capabilities (`MultipartCapable`,
    `BucketCapable`): code that needs one asks for it with `multipart_of` / `buckets_of`.
    """

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def ping(self) -> None:
        """Readiness: return when the backend answers, raise when it does not."""
        ...

    async def head(self, bucket: str, key: str) -> ObjectInfo: ...

    async def get(
        self,
        bucket: str,
        key: str,
        first: int | None = None,
        last: int | None = None,
        *,
        if_match: str | None = None,
    ) -> ObjectReader:
        """Open a body: whole object, `first..last` inclusive, `first..` or, with `first < 0`, the last
        `-first` bytes."""
        ...

    async def get_bytes(
        self,
        bucket: str,
        key: str,
        first: int | None = None,
        last: int | None = None,
        *,
        if_match: str | None = None,
    ) -> tuple[ObjectInfo, bytes]:
        """`get`, read whole (for small bodies)."""
        ...

    async def put(
        self,
        bucket: str,
        key: str,
        body: Body,
        *,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
        content_md5: BodyMD5 | None = None,
    ) -> ObjectInfo: ...

    async def delete(self, bucket: str, key: str) -> None: ...

    async def delete_many(self, bucket: str, keys: Sequence[str]) -> list[tuple[str, str, str]]:
        """Delete keys; return (key, error code, message) of those that failed."""
        ...

    async def list(
        self,
        bucket: str,
        *,
        prefix: str = "",
        delimiter: str | None = None,
        start_after: str | None = None,
        token: str | None = None,
        max_keys: int = 1000,
    ) -> ListPage: ...

    async def copy(
        self,
        src_bucket: str,
        src_key: str,
        dst_bucket: str,
        dst_key: str,
        *,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo: ...


@runtime_checkable
class MultipartCapable(Protocol):
    """A backend that assembles objects from parts, uploaded or copied server-side."""

    min_part_size: int  # the backend's own minimum size of every part but the last

    async def create_multipart(
        self,
        bucket: str,
        key: str,
        *,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> str: ...

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
    ) -> str: ...

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
        """Copy a range of another object as a part; with `src_etag`, PreconditionFailed unless the
        source still has that ETag (so a concurrent overwrite is never spliced in)."""
        ...

    async def complete_multipart(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        parts: Sequence[tuple[int, str]],
        *,
        size: int | None = None,
    ) -> ObjectInfo:
        """Complete the upload from `parts`. A caller that knows the object's `size` gets it back with
        the ETag the store answered and the time as it is here, spared a HEAD where the answer has no
        size."""
        ...

    async def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None: ...

    async def list_multipart_uploads(self, bucket: str, prefix: str = "") -> Uploads: ...

    async def list_parts(self, bucket: str, key: str, upload_id: str) -> list[tuple[int, str]]:
        """The (part number, ETag) of every part the upload holds (NoSuchUpload once it is completed or
        aborted). A store that keeps each upload of a part number (SeaweedFS) lists it once for each."""
        ...


@runtime_checkable
class BucketCapable(Protocol):
    """A backend whose buckets a client may list, create and delete."""

    async def list_buckets(self) -> list[tuple[str, datetime]]: ...

    async def create_bucket(self, bucket: str) -> None: ...

    async def delete_bucket(self, bucket: str) -> None: ...

    async def head_bucket(self, bucket: str) -> None: ...


@runtime_checkable
class LeavesLeftovers(Protocol):
    """A backend that leaves files of its own behind when its process is killed (the embedded one, its
    files being written), and removes them on request: the janitor asks, never looking at them itself."""

    async def remove_leftovers(self, older_than: float) -> int:
        """Remove what was last written before `older_than` (epoch seconds); how many went."""
        ...


def multipart_of(backend: Backend) -> MultipartCapable:
    """The backend as a multipart backend; NotImplemented (501) when it has no multipart uploads."""
    if isinstance(backend, MultipartCapable):
        return backend
    raise errors.NotImplemented_("The storage backend does not support multipart uploads.")


def buckets_of(backend: Backend) -> BucketCapable:
    """The backend as one whose buckets can be managed; NotImplemented (501) when they cannot."""
    if isinstance(backend, BucketCapable):
        return backend
    raise errors.NotImplemented_("The storage backend does not manage buckets.")


# -- shared rules, pure ------------------------------------------------------------------------------


def check_range_args(first: int | None, last: int | None) -> None:
    """Reject range arguments no Range header can produce (a caller bug, not a client error)."""
    if first is None:
        if last is not None:
            raise ValueError("a range with a last byte needs a first byte (use first < 0 for a suffix)")
        return
    if first < 0:
        if last is not None:
            raise ValueError("a suffix range (first < 0) takes no last byte")
        return
    if last is not None and last < first:
        raise ValueError(f"range {first}-{last} ends before it starts")


def resolve_range(size: int, first: int | None, last: int | None) -> tuple[int, int] | None:
    """The inclusive byte range served for an object of `size` bytes, or None for the whole object.

    As S3 (and RFC 9110) do: a last byte past the end is clamped, a suffix longer than the object
    means all of it, and a range that starts at or past the end (or any range of an empty object) is
    not satisfiable.
    """
    check_range_args(first, last)
    if first is None:
        return None
    if first < 0:
        if size == 0:
            raise errors.InvalidRange(ActualObjectSize="0")
        return (max(0, size + first), size - 1)
    if first >= size:
        raise errors.InvalidRange(ActualObjectSize=str(size))
    return (first, size - 1 if last is None else min(last, size - 1))


def range_header(first: int | None, last: int | None) -> str | None:
    """The HTTP Range header value for a backend GET."""
    check_range_args(first, last)
    if first is None:
        return None
    if first < 0:
        return f"bytes={first}"
    return f"bytes={first}-" if last is None else f"bytes={first}-{last}"


def unquote_etag(etag: str) -> str:
    """`"abc"` or `W/"abc"` -> `abc`."""
    etag = etag.strip()
    if etag.startswith("W/"):
        etag = etag[2:]
    if len(etag) >= 2 and etag[0] == etag[-1] == '"':
        etag = etag[1:-1]
    return etag


def multipart_etag(part_etags: Sequence[str]) -> str:
    """The ETag S3 gives a completed multipart upload: md5 of the parts' binary md5s, then `-N`."""
    digest = hashlib.md5()
    for etag in part_etags:
        try:
            digest.update(bytes.fromhex(unquote_etag(etag)))
        except ValueError:
            raise errors.InvalidPart() from None
    return f"{digest.hexdigest()}-{len(part_etags)}"


def check_part_list(parts: Sequence[tuple[int, str]]) -> None:
    """The checks S3 makes of a CompleteMultipartUpload part list before looking at the parts."""
    if not parts:
        raise errors.MalformedXML("You must specify at least one part")
    previous = 0
    for number, _ in parts:
        if not 1 <= number <= MAX_PARTS:
            raise errors.InvalidArgument(
                f"Part number must be an integer between 1 and {MAX_PARTS}, inclusive",
                ArgumentName="partNumber",
            )
        if number <= previous:
            raise errors.InvalidPartOrder()
        previous = number


def check_key(key: str) -> None:
    """S3's own limits on a key: not empty, at most 1024 bytes of UTF-8."""
    if not key:
        raise errors.InvalidArgument("The key must not be empty", ArgumentName="key")
    try:
        encoded = key.encode("utf-8")
    except UnicodeEncodeError:
        raise errors.InvalidArgument("The key is not valid UTF-8", ArgumentName="key") from None
    if len(encoded) > MAX_KEY_BYTES:
        raise errors.KeyTooLongError()


def normalize_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """User metadata as S3 returns it: lower-case names, no `x-amz-meta-` prefix."""
    if not metadata:
        return {}
    out: dict[str, str] = {}
    for name, value in metadata.items():
        name = name.lower()
        if name.startswith("x-amz-meta-"):
            name = name[len("x-amz-meta-") :]
        out[name] = value
    return out


async def iterate_body(body: Body) -> AsyncIterator[bytes]:
    """Any accepted body as an async stream of byte pieces."""
    if isinstance(body, bytes | bytearray | memoryview):
        if len(body):
            yield bytes(body)
        return
    async for piece in body:
        if piece:
            yield bytes(piece) if not isinstance(piece, bytes) else piece


async def aclose(iterator: AsyncIterator[Any]) -> None:
    """Close an async iterator that can be closed (an async generator); others need nothing."""
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()


class VersionRanges:
    """Byte ranges of one version of a stored object: each a GET pinned to the version's ETag
    (PreconditionFailed once the object is replaced), streamed as its bytes arrive. Called with a range
    (`start`, `end` exclusive), as the read engine fetches stored chunks."""

    __slots__ = ("backend", "bucket", "etag", "key")

    def __init__(self, backend: Backend, bucket: str, key: str, etag: str) -> None:
        self.backend, self.bucket, self.key, self.etag = backend, bucket, key, etag

    async def __call__(self, start: int, end: int) -> AsyncIterator[bytes]:
        reader = await self.backend.get(self.bucket, self.key, start, end - 1, if_match=self.etag)
        try:
            async for piece in reader:
                yield piece
        finally:
            await reader.close()


async def list_everything(backend: Backend, bucket: str, prefix: str) -> list[ObjectInfo]:
    """Every object under `prefix`, page after page, in the backend's own order.

    Pages follow the backend's continuation tokens, which hold whatever order the backend lists in
    (SeaweedFS lists by path components, not bytes); a backend whose token does not advance is refused
    by the backend itself (see S3Backend.list), so this cannot loop forever.
    """
    found: list[ObjectInfo] = []
    token: str | None = None
    while True:
        page = await backend.list(bucket, prefix=prefix, token=token)
        found += page.objects
        if not page.is_truncated or not page.next_token:
            return found
        token = page.next_token
