"""Reading the bucket that holds tiered segments, from Spark's driver and executors (blocking, boto3).

Two ways to reach the objects (see `StoreOptions`):

* through a tsproxy endpoint: objects come back as their original bytes and a ranged GET maps onto the
  chunks it touches, so this is plain S3;
* directly from the backend with a key ring, so a large cluster does not funnel through one proxy: an
  object that ends in a tsproxy trailer is decoded here with tsproxy.format (its tail first, then only
  the chunks a range needs), any other object is passed through as it is.

Executors build their own clients from the picklable options; one client per process and options.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from tsproxy import errors
from tsproxy.errors import KeyNotFound
from tsproxy.format import KeyRing, Manifest, ObjectContext, decode_tail
from tsproxy.format.objects import iter_range
from tsproxy.format.tail import TAIL_GUESS, TailTooLong, find_tail, first_read
from tsproxy.s3.limits import MAX_LIST_KEYS

from .options import StoreOptions

STREAM_PIECE = 1 << 20
_OPEN_CACHE = 64  # decoded tails kept per process: a worker reads several pieces of one segment

_clients: dict[StoreOptions, Any] = {}
_rings: dict[str, KeyRing] = {}
# Tails of tsproxy objects read lately (segment objects are immutable once uploaded).
_opened: OrderedDict[tuple[StoreOptions, str], _Opened] = OrderedDict()
_lock = threading.Lock()


def _client(options: StoreOptions) -> Any:
    with _lock:
        client = _clients.get(options)
        if client is None:
            config = Config(
                s3={"addressing_style": "path" if options.path_style else "auto"},
                retries={"max_attempts": 5, "mode": "standard"},
                max_pool_connections=32,
                # Plain GET/PUT work with every S3-compatible store; no flexible checksums.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            )
            session = boto3.session.Session()
            client = session.client(
                "s3",
                endpoint_url=options.endpoint,
                region_name=options.region,
                aws_access_key_id=options.access_key,
                aws_secret_access_key=options.secret_key,
                config=config,
            )
            _clients[options] = client
        return client


def _key_ring(path: str) -> KeyRing:
    with _lock:
        ring = _rings.get(path)
        if ring is None:
            ring = _rings[path] = KeyRing.load(path)
        return ring


@dataclass(frozen=True)
class _Opened:
    """What reading an object needs once its tail is known."""

    stored_size: int
    manifest: Manifest | None  # None: not a tsproxy object, read as it is
    ctx: ObjectContext | None
    suffix: bytes  # the object's last bytes, to answer tail reads without another GET


class Bucket:
    """Listing and ranged reads of original object bytes, whichever way the objects are reached."""

    def __init__(self, options: StoreOptions) -> None:
        self.options = options

    @property
    def client(self) -> Any:
        return _client(self.options)

    def uri(self, key: str) -> str:
        return self.options.uri(key)

    # -- listing --------------------------------------------------------------------------------------

    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, listed size) of every object under prefix, in key order."""
        token: str | None = None
        while True:
            args: dict[str, Any] = {"Bucket": self.options.bucket, "Prefix": prefix, "MaxKeys": MAX_LIST_KEYS}
            if token:
                args["ContinuationToken"] = token
            page = self.call(f"s3://{self.options.bucket}/{prefix}", self.client.list_objects_v2, **args)
            for item in page.get("Contents", ()):
                yield item["Key"], int(item["Size"])
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")

    # -- reading --------------------------------------------------------------------------------------

    def read(
        self, key: str, first: int = 0, end: int | None = None, *, stored_size: int | None = None
    ) -> bytes:
        """Original bytes first..end-1 of an object (end None: to its end)."""
        return b"".join(self.stream(key, first, end, stored_size=stored_size))

    def stream(
        self, key: str, first: int = 0, end: int | None = None, *, stored_size: int | None = None
    ) -> Generator[bytes, None, None]:
        """Original bytes first..end-1 of an object in pieces of about STREAM_PIECE (bounded memory)."""
        if end is not None and end <= first:
            return
        if not self.options.direct:
            yield from self._get_stream(key, first, end)
            return
        opened = self._open(key, stored_size)
        if opened.manifest is None:
            yield from self._get_stream(key, first, end)
            return
        size = opened.manifest.size
        last = size - 1 if end is None else min(end, size) - 1
        if first > last:
            return
        try:
            ring = _key_ring(self.options.key_ring or "")
            yield from iter_range(self._stored_reader(key, opened), opened.stored_size, ring, first, last)
        except KeyNotFound as e:
            raise self._key_error(key, e) from None
        except errors.FormatError as e:  # a chunk failed its check: say which object
            raise type(e)(f"{self.uri(key)}: {e}") from None

    def _get_stream(self, key: str, first: int, end: int | None) -> Iterator[bytes]:
        rng = f"bytes={first}-" if end is None else f"bytes={first}-{end - 1}"
        if first == 0 and end is None:
            rng = ""
        args: dict[str, Any] = {"Bucket": self.options.bucket, "Key": key}
        if rng:
            args["Range"] = rng
        try:
            response = self.call(self.uri(key), self.client.get_object, **args)
        except errors.InvalidRange:
            return  # the range starts at or past the end: nothing there
        body = response["Body"]
        try:
            yield from body.iter_chunks(STREAM_PIECE)
        except (BotoCoreError, OSError) as e:
            raise errors.InternalError(f"{self.uri(key)}: reading the body failed: {e}") from None
        finally:
            body.close()

    def _get(self, key: str, rng: str) -> tuple[bytes, int]:
        """The bytes of a range (e.g. 'bytes=-65536') and the object's full stored size."""
        response = self.call(
            self.uri(key), self.client.get_object, Bucket=self.options.bucket, Key=key, Range=rng
        )
        data = response["Body"].read()
        total = response.get("ContentRange", "").rpartition("/")[2]
        size = (
            int(total)
            if total.isascii() and total.isdigit()
            else int(response.get("ContentLength", len(data)))
        )
        return data, size

    # -- tsproxy objects, read directly from the backend -------------------------------------------------

    def _open(self, key: str, stored_size: int | None) -> _Opened:
        cache_key = (self.options, key)
        with _lock:
            cached = _opened.get(cache_key)
            if cached is not None and (stored_size is None or cached.stored_size == stored_size):
                _opened.move_to_end(cache_key)
                return cached
        try:
            suffix, size = self._get(key, f"bytes=-{first_read(TAIL_GUESS)}")
        except errors.InvalidRange:
            suffix, size = b"", 0  # an empty object
        manifest = ctx = None
        try:
            search = find_tail(suffix, size)
        except TailTooLong:
            raise errors.InternalError(f"{self.uri(key)}: tsproxy tail longer than the object") from None
        if search.has_trailer:
            if search.read_next:
                suffix, _ = self._get(key, f"bytes=-{search.read_next}")
            try:
                manifest, ctx = decode_tail(suffix, _key_ring(self.options.key_ring or ""))
            except KeyNotFound as e:
                raise self._key_error(key, e) from None
            except errors.FormatError as e:
                raise type(e)(f"{self.uri(key)}: {e}") from None
        opened = _Opened(size, manifest, ctx, suffix)
        with _lock:
            _opened[cache_key] = opened
            while len(_opened) > _OPEN_CACHE:
                _opened.popitem(last=False)
        return opened

    def _stored_reader(self, key: str, opened: _Opened) -> Callable[[int, int], bytes]:
        suffix_start = opened.stored_size - len(opened.suffix)

        def read(start: int, end: int) -> bytes:
            # iter_range reads the trailer and tail first: those come from the suffix already fetched.
            if start >= suffix_start:
                return opened.suffix[start - suffix_start : end - suffix_start]
            data, _ = self._get(key, f"bytes={start}-{end - 1}")
            if len(data) != end - start:
                raise errors.InternalError(
                    f"{self.uri(key)}: short read ({len(data)} of {end - start} bytes)"
                )
            return data

        return read

    def _key_error(self, key: str, e: KeyNotFound) -> KeyNotFound:
        return KeyNotFound(f"{self.uri(key)}: {e} (key ring {self.options.key_ring})")

    # -- errors -----------------------------------------------------------------------------------------

    def call(self, where: str, fn: Callable[..., Any], **args: Any) -> Any:
        """fn(**args) on the client, its failures turned into typed errors that name `where`."""
        try:
            return fn(**args)
        except ClientError as e:
            raise _s3_error(where, e, self.options) from None
        except BotoCoreError as e:
            raise errors.ServiceUnavailable(
                f"{where}: cannot reach {self.options.endpoint or 'AWS S3'}: {e}"
            ) from None


def _s3_error(where: str, e: ClientError, options: StoreOptions) -> errors.S3Error:
    """The typed error for a failed request, with a message that says what to check."""
    code = str(e.response.get("Error", {}).get("Code", ""))
    status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 500) or 500)
    if code in ("NoSuchKey", "404") or (status == 404 and code not in ("NoSuchBucket",)):
        return errors.NoSuchKey(f"{where}: no such object (deleted after the read was planned?)")
    if code == "NoSuchBucket":
        return errors.NoSuchBucket(f"{where}: no such bucket")
    if code in ("InvalidRange", "416") or status == 416:
        return errors.InvalidRange(f"{where}: range not satisfiable")
    if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403") or status == 403:
        how = "accessKey/secretKey" if options.access_key else "the AWS credential chain"
        return errors.AccessDenied(f"{where}: access denied ({code or status}); check {how}")
    return errors.InternalError(f"{where}: {code or status}: {e}")
