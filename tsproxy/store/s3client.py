"""The S3 backend's client side: the aiobotocore session and its settings, and the retry loop every
request of `S3Backend` goes through.

Choices that make it work with common S3-compatible stores (AWS S3, MinIO, Ceph RGW, SeaweedFS …):

- **No flexible checksums.** botocore ≥ 1.36 adds CRC checksums, sent as aws-chunked trailers, to
  every PutObject/UploadPart by default (`request_checksum_calculation="when_supported"`); several
  stores reject or mishandle those. We use `"when_required"` (checksums only on operations that
  demand one, such as DeleteObjects) and likewise do not ask for response checksums.
- **Integrity by Content-MD5, not by payload signing.** Bodies are sent as `UNSIGNED-PAYLOAD` with a
  Content-MD5 header computed in a worker thread, which every S3-compatible store checks (BadDigest).
  Signing the payload would make botocore hash every body on the event loop over plain http.
  `sign_payload=True` restores botocore's default; `content_md5=False` drops the header.
- **Lean listing parses.** botocore parses every timestamp with dateutil and reads each 200 answer's
  XML twice (once to look for an error S3 may send with a 200). Over a 1,000-key listing page that
  was most of tsproxy's CPU time, so the session here parses ISO 8601 timestamps with the standard
  library (dateutil stays the fallback), reads ListObjectsV2 pages in one ElementTree pass
  (s3listparse.py), and checks a listing page for being whole (its closing tag) instead of parsing
  it a second time. Other operations keep botocore's parser and check.
- **Our own retry loop.** botocore's retries are off; each operation is retried here with exponential
  backoff and full jitter on connection errors, throttling and 5xx answers. Every attempt is first
  admitted by the `on_request` observer (see `observe`), and the retries are counted in its report.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from datetime import UTC, datetime
from typing import Any, TypeVar

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session
from botocore import handlers as botocore_handlers
from botocore.utils import parse_timestamp

from tsproxy import errors
from tsproxy.store import s3errors
from tsproxy.store.base import (
    DEFAULT_PART_SIZE,
    MAX_PART_SIZE,
    MIB,
    MIN_PART_SIZE,
    ObjectInfo,
    normalize_metadata,
    unquote_etag,
)
from tsproxy.store.observe import BackendCall, OnRequest, observer_of
from tsproxy.store.retry import Backoff
from tsproxy.store.s3lean import Credentials, LeanRequests
from tsproxy.store.s3listparse import LeanParserFactory

T = TypeVar("T")

COPY_THRESHOLD = 5 << 30  # CopyObject's limit; larger objects are copied part by part
COPY_PART_SIZE = 512 * MIB


def fast_timestamp(value: Any) -> datetime:
    """botocore's timestamp parser, by the standard library for the ISO 8601 S3 lists in its XML."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            parsed = datetime.fromisoformat(value)
            return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    result: datetime = parse_timestamp(value)
    return result


# Listing operations: a 200 answer is a listing, so checking it for an error means checking it is whole.
_LISTINGS = {
    "ListObjectsV2": b"</ListBucketResult>",
    "ListObjects": b"</ListBucketResult>",
    "ListMultipartUploads": b"</ListMultipartUploadsResult>",
    "ListParts": b"</ListPartsResult>",
}


def _error_in_200(operation_model: Any, response_dict: Any, **kwargs: Any) -> None:
    """botocore's check for an error inside a 200 answer, without a second XML parse of listings."""
    closing = _LISTINGS.get(operation_model.name)
    if closing is None:
        botocore_handlers._handle_200_error(operation_model, response_dict, **kwargs)
    elif response_dict and response_dict.get("status_code") == 200:
        end = bytes(memoryview(response_dict.get("body") or b"")[-(len(closing) + 64) :])  # no whole copy
        if not end.rstrip().endswith(closing):
            response_dict["status_code"] = 500  # cut short: retried like any 5xx


def lean_session() -> AioSession:
    """An aiobotocore session whose S3 answers cost less CPU to parse (see the module's notes)."""
    session = get_session()
    factory = LeanParserFactory()
    factory.set_parser_defaults(timestamp_parser=fast_timestamp)
    session.register_component("response_parser_factory", factory)
    session.unregister("before-parse.s3.*", botocore_handlers._handle_200_error)
    session.get_component("event_emitter").register_first("before-parse.s3.*", _error_in_200)
    for operation in ("PutObject", "UploadPart"):
        # A bytes body stays bytes: botocore's BytesIO made aiohttp copy it whole before sending it in
        # 64 KiB copies, and (as any file-like body) wait for a 100 Continue before the first byte.
        session.unregister(
            f"before-parameter-build.s3.{operation}", botocore_handlers.convert_body_to_file_like_object
        )
    return session


def utc(value: datetime | None) -> datetime:
    """A store's timestamp as tz-aware UTC (now, when the store gave none)."""
    if value is None:
        return datetime.now(UTC)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def quote_etag(etag: str) -> str:
    return f'"{unquote_etag(etag)}"'


def info_of(key: str, response: Mapping[str, Any], size: int) -> ObjectInfo:
    """ObjectInfo from the headers of a HeadObject or GetObject answer."""
    return ObjectInfo(
        key=key,
        size=size,
        etag=unquote_etag(response.get("ETag", "")),
        last_modified=utc(response.get("LastModified")),
        metadata=normalize_metadata(response.get("Metadata")),
        content_type=response.get("ContentType"),
    )


class S3Client:
    """Settings, the aiobotocore client and the observed retry loop; `S3Backend` builds on it."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        region: str | None = None,
        path_style: bool = True,
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        part_size: int = DEFAULT_PART_SIZE,
        max_attempts: int = 5,
        backoff_base: float = 0.1,
        backoff_cap: float = 5.0,
        pool_size: int = 64,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        verify: bool | str | None = None,
        sign_payload: bool = False,
        content_md5: bool = True,
        copy_threshold: int = COPY_THRESHOLD,
        copy_part_size: int = COPY_PART_SIZE,
        read_size: int = MIB,
        executor: Executor | None = None,
        on_request: OnRequest | None = None,
        lean_gets: bool = True,
    ) -> None:
        """`endpoint` None means AWS S3 itself; credentials None means the standard AWS chain.

        lean_gets: GetObject and UploadPart are signed and sent without botocore (see s3lean); False keeps
        them on botocore.
        """
        if not MIN_PART_SIZE <= part_size <= MAX_PART_SIZE:
            raise ValueError(f"part_size must be between {MIN_PART_SIZE} and {MAX_PART_SIZE} bytes")
        if not MIN_PART_SIZE <= copy_part_size <= MAX_PART_SIZE:
            raise ValueError(f"copy_part_size must be between {MIN_PART_SIZE} and {MAX_PART_SIZE} bytes")
        if (access_key is None) != (secret_key is None):
            raise ValueError("give both access_key and secret_key, or neither")
        self.endpoint = endpoint
        self.region = region or "us-east-1"
        self.path_style = path_style
        self.part_size = part_size
        self.min_part_size = MIN_PART_SIZE
        self.backoff = Backoff(max_attempts=max_attempts, base=backoff_base, cap=backoff_cap)
        self.copy_threshold = copy_threshold
        self.copy_part_size = copy_part_size
        self.read_size = read_size
        self.content_md5 = content_md5
        # Whether this store's part ETags are their MD5s, which lets a part go out unhashed as it is produced
        # and be checked by its ETag (s3multipart); set false by the first part that shows otherwise.
        self.etags_are_md5 = True
        self.executor = executor
        self.on_request = on_request
        self.observer = observer_of(on_request)
        self._credentials = (access_key, secret_key, session_token)
        self._config = AioConfig(
            region_name=self.region,
            signature_version="s3v4",
            s3={
                "addressing_style": "path" if path_style else "virtual",
                "payload_signing_enabled": sign_payload,
            },
            retries={"total_max_attempts": 1, "mode": "standard"},  # retried here, and counted
            max_pool_connections=pool_size,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            warm_up_loader_caches=True,
        )
        self._verify = verify
        self._pool_size, self._timeouts = pool_size, (connect_timeout, read_timeout)
        self._lean_wanted = lean_gets
        self._stack: contextlib.AsyncExitStack | None = None
        self._client: Any = None
        self._session: AioSession | None = None
        self.lean: LeanRequests | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.endpoint or 'aws'!r})"

    # -- lifecycle

    async def start(self) -> None:
        """Create the aiobotocore client (and its connection pool)."""
        if self._client is not None:
            return
        access_key, secret_key, token = self._credentials
        stack = contextlib.AsyncExitStack()
        self._session = lean_session()
        self._client = await stack.enter_async_context(
            self._session.create_client(
                "s3",
                endpoint_url=self.endpoint,
                region_name=self.region,
                aws_access_key_id=access_key,
                aws_secret_access_key=secret_key,
                aws_session_token=token,
                verify=self._verify,
                config=self._config,
            )
        )
        self._stack = stack
        if self._lean_wanted:
            lean = LeanRequests(
                self._client.meta.endpoint_url,
                region=self._client.meta.region_name or self.region,
                path_style=self.path_style,
                credentials=self._current_credentials,
                pool_size=self._pool_size,
                connect_timeout=self._timeouts[0],
                read_timeout=self._timeouts[1],
                verify=self._verify,
            )
            await lean.start()
            stack.push_async_callback(lean.close)
            self.lean = lean

    async def _current_credentials(self) -> Credentials:
        """The credentials the botocore client signs with: the configured keys, or the session's provider
        chain, frozen now (a refreshable set renews itself when it is about to expire)."""
        access_key, secret_key, token = self._credentials
        if access_key is not None and secret_key is not None:
            return access_key, secret_key, token
        assert self._session is not None
        found = await self._session.get_credentials()
        if found is None:
            raise errors.ServiceUnavailable("No credentials for the storage backend were found.")
        frozen = await found.get_frozen_credentials()
        return frozen.access_key, frozen.secret_key, frozen.token

    async def close(self) -> None:
        if self._stack is not None:
            stack, self._stack, self._client, self.lean = self._stack, None, None, None
            await stack.aclose()

    @property
    def client(self) -> Any:
        """The aiobotocore S3 client (after `start`)."""
        if self._client is None:
            raise RuntimeError(f"{type(self).__name__} used before start()")
        return self._client

    # -- the retry loop

    def _call(self, operation: str) -> BackendCall:
        return BackendCall(self.observer, operation)

    async def _attempts(
        self,
        call: BackendCall,
        operation: Callable[[], Awaitable[T]],
        *,
        not_found: type[errors.S3Error] = errors.NoSuchKey,
        **fields: str,
    ) -> T:
        """Run `operation` until it succeeds, fails for good, or runs out of attempts."""
        attempt = 0
        while True:
            attempt += 1
            await call.admit()
            try:
                return await operation()
            except Exception as e:
                if not (s3errors.is_retryable(e) and self.backoff.allows_another(attempt)):
                    raise s3errors.to_s3_error(e, not_found=not_found, **fields) from e
                throttled = s3errors.is_throttling(e)
            call.retries += 1
            await asyncio.sleep(self.backoff.delay(attempt, throttled=throttled))

    async def _request(
        self,
        name: str,
        method: str,
        *,
        not_found: type[errors.S3Error] = errors.NoSuchKey,
        fields: Mapping[str, str] | None = None,
        bytes_out: int = 0,
        **params: Any,
    ) -> dict[str, Any]:
        """One observed, retried client call: `name` is the S3 operation, `method` the client's."""
        with self._call(name) as call:
            bound = functools.partial(getattr(self.client, method), **params)
            response: dict[str, Any] = await self._attempts(
                call, bound, not_found=not_found, **(fields or {})
            )
            call.bytes_out += bytes_out
            return response

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        """HeadObject: here rather than with the rest of the object path, for multipart needs it too."""
        response = await self._request(
            "HeadObject", "head_object", fields={"Key": key}, Bucket=bucket, Key=key
        )
        return info_of(key, response, response.get("ContentLength", 0))

    async def _md5(self, data: bytes | bytearray, known: bytes | None = None) -> str | None:
        """The Content-MD5 header of a body: the digest its writer gave, else hashed here (off the loop)."""
        if not self.content_md5:
            return None
        digest = known
        if digest is None:
            loop = asyncio.get_running_loop()
            digest = await loop.run_in_executor(self.executor, lambda: hashlib.md5(data).digest())
        return base64.b64encode(digest).decode("ascii")
