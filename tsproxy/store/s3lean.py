"""GetObject and a streamed UploadPart without botocore: signed here (SigV4, unsigned payload) and sent
on aiohttp directly.

A cold read is a chain of ranged GETs (the object's tail, then its chunks) that a reader waits on one
after another, so each one's latency counts. botocore spends CPU on every GetObject (parameter
validation, a dozen event hooks, the signer's canonicalisation, the response parser) before and after the
bytes move, a good part of a ranged GET's latency on the same host (README, "Figures behind the code's
constants"). A ranged GET of an object is the simplest request S3 has, so it
is built here:

- the URL is the botocore client's own endpoint (`meta.endpoint_url`), path style or virtual-host
  style as the backend is configured; the key is URI-encoded once, as S3 canonicalises it, and sent
  exactly so (`encoded=True`), so the signed path and the sent path are the same bytes;
- credentials are the ones the botocore client was made with, or the session's provider chain (IAM
  roles, web identity ...), whose refreshable credentials are frozen per request;
- the answer becomes the dict botocore would have given (ContentLength, ContentRange, ETag,
  LastModified, Metadata, ContentType, Body), and an error answer a botocore `ClientError` carrying the
  backend's code, message and status, so the retry loop and the error mapping (s3errors) are the same
  for both paths.

Proxies: HTTP_PROXY, HTTPS_PROXY and NO_PROXY apply as they do to botocore, worked out once per host
(aiohttp's `trust_env` would read the environment again at every request, and look for a `~/.netrc` in
a thread of the default executor: a thread hop before each cold read's GET).

UploadPart is here first for one case botocore cannot serve: a body sent while it is still being
produced, with its length known in advance (an uncompressed part, see s3multipart). A part in hand (a
compressed part, sealed whole) goes the same way with its Content-MD5, sparing botocore's handling of
a large body on the event loop. Everything else (listings, PUTs, HEADs, buckets, the multipart
upload's creation and completion) stays on botocore.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
import urllib.request
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit
from xml.etree import ElementTree

import aiohttp
import botocore.exceptions
from yarl import URL

from tsproxy.s3.sigv4 import derive_signing_key, sign, uri_encode

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
# Error bodies are small XML documents; more than this is not one (and is not read whole).
MAX_ERROR_BODY = 64 << 10

Credentials = tuple[str, str, str | None]  # access key, secret key, session token
CredentialSource = Callable[[], Awaitable[Credentials]]


def canonical_query(params: Mapping[str, str]) -> str:
    """SigV4's canonical query string (also the query to send): names and values URI-encoded, sorted."""
    pairs = sorted(
        (uri_encode(k, keep_slash=False), uri_encode(v, keep_slash=False)) for k, v in params.items()
    )
    return "&".join(f"{k}={v}" for k, v in pairs)


def canonical_request(
    method: str, path: str, headers: Mapping[str, str], payload_hash: str, query: str = ""
) -> tuple[str, str]:
    """SigV4's canonical request, and its signed-headers list.

    `path` is the URI-encoded path as sent, `query` the canonical query string (canonical_query);
    `headers` are the headers to sign (host included), by any case; values are trimmed as SigV4 requires.
    """
    signed = sorted((name.lower(), " ".join(value.split())) for name, value in headers.items())
    names = ";".join(name for name, _ in signed)
    lines = "".join(f"{name}:{value}\n" for name, value in signed)
    return f"{method}\n{path}\n{query}\n{lines}\n{names}\n{payload_hash}", names


def authorization(
    method: str,
    path: str,
    headers: Mapping[str, str],
    *,
    access_key: str,
    secret_key: str,
    region: str,
    amz_date: str,
    payload_hash: str = UNSIGNED_PAYLOAD,
    service: str = "s3",
    query: str = "",
) -> str:
    """The Authorization header of a SigV4-signed request (header form)."""
    canonical, names = canonical_request(method, path, headers, payload_hash, query)
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogateescape")).hexdigest()
    string_to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{digest}"
    signature = sign(derive_signing_key(secret_key, amz_date[:8], region, service), string_to_sign)
    return f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={names}, Signature={signature}"


def _http_date(value: str | None) -> datetime:
    if not value:
        return datetime.now(UTC).replace(microsecond=0)
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return datetime.now(UTC).replace(microsecond=0)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _error_fields(body: bytes) -> tuple[str | None, str | None]:
    """(Code, Message) of an S3 error document, or Nones when the body is not one."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return None, None
    return root.findtext("Code"), root.findtext("Message")


class LeanBody:
    """A GET answer's body, read as botocore's StreamingBody is (`read(n)`, `close()`)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def read(self, n: int = -1) -> bytes:
        return await self._response.content.read(n)

    def close(self) -> None:
        if self._response.content.at_eof():
            self._response.release()  # read to its end: the connection goes back to the pool
        else:
            self._response.close()  # cut short: the connection cannot be reused


class LeanRequests:
    """Signed GetObject and streamed UploadPart requests, on an aiohttp session of their own."""

    def __init__(
        self,
        endpoint_url: str,
        *,
        region: str,
        path_style: bool,
        credentials: CredentialSource,
        pool_size: int,
        connect_timeout: float,
        read_timeout: float,
        verify: bool | str | None,
    ) -> None:
        parts = urlsplit(endpoint_url)
        self._scheme = parts.scheme
        self._host = parts.netloc
        self._base_path = parts.path.rstrip("/")
        self._region = region
        self._path_style = path_style
        self._credentials = credentials
        self._pool_size = pool_size
        self._timeout = aiohttp.ClientTimeout(sock_connect=connect_timeout, sock_read=read_timeout)
        self._verify = verify
        self._session: aiohttp.ClientSession | None = None
        # by host: its proxy's request arguments and the headers it wants (one scheme: the endpoint's)
        self._proxies: dict[str, tuple[dict[str, Any], dict[str, str]]] = {}

    def _ssl(self) -> ssl.SSLContext | bool:
        if self._scheme != "https":
            return False
        if self._verify is False:
            return False  # as botocore's verify=False: no certificate check
        if isinstance(self._verify, str):
            return ssl.create_default_context(cafile=self._verify)
        return ssl.create_default_context()

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._pool_size, ssl=self._ssl())
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, auto_decompress=False
            )

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _proxy(self, url: URL, headers: dict[str, str]) -> dict[str, Any]:
        """The proxy arguments of a request to url's host (none when it goes direct), from the environment
        the first time the host is asked about; the headers a proxy wants are added to `headers` (after
        signing: a proxy's header is not the store's to see, nor signed)."""
        host = url.host or ""
        found = self._proxies.get(host)
        if found is None:
            found = self._proxies[host] = env_proxy(url)
        arguments, extra = found
        headers.update(extra)
        return arguments

    def _target(self, bucket: str, key: str) -> tuple[str, str]:
        """(host, encoded path) of an object, path style or virtual-host style."""
        encoded_key = uri_encode(key.encode("utf-8", "surrogateescape"), keep_slash=True)
        # A bucket with dots cannot be a TLS host name's first label: botocore uses path style then too.
        if self._path_style or "." in bucket:
            return self._host, f"{self._base_path}/{bucket}/{encoded_key}"
        return f"{bucket}.{self._host}", f"{self._base_path}/{encoded_key}"

    async def _signed(
        self, method: str, bucket: str, key: str, params: Mapping[str, str], extra: Mapping[str, str]
    ) -> tuple[URL, dict[str, str]]:
        """The URL and headers of a SigV4-signed request (unsigned payload) for an object."""
        if self._session is None:
            raise RuntimeError("LeanRequests used before start()")
        host, path = self._target(bucket, key)
        query = canonical_query(params)
        access_key, secret_key, token = await self._credentials()
        amz_date = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        headers = {"host": host, "x-amz-content-sha256": UNSIGNED_PAYLOAD, "x-amz-date": amz_date, **extra}
        if token:
            headers["x-amz-security-token"] = token
        headers["authorization"] = authorization(
            method,
            path,
            headers,
            access_key=access_key,
            secret_key=secret_key,
            region=self._region,
            amz_date=amz_date,
            query=query,
        )
        target = f"{self._scheme}://{host}{path}" + (f"?{query}" if query else "")
        return URL(target, encoded=True), headers

    async def get_object(
        self, bucket: str, key: str, range_value: str | None = None, if_match: str | None = None
    ) -> dict[str, Any]:
        """One GetObject: the answer as botocore gives it, or the ClientError botocore would raise.

        Connection failures raise aiohttp's errors (retryable, see s3errors.CONNECTION_ERRORS).
        """
        extra = {"range": range_value} if range_value else {}
        if if_match is not None:
            extra["if-match"] = if_match
        url, headers = await self._signed("GET", bucket, key, {}, extra)
        assert self._session is not None
        response = await self._session.get(
            url, headers=headers, allow_redirects=False, **self._proxy(url, headers)
        )
        try:
            if response.status not in (200, 206):
                raise await _client_error(response, "GetObject")
            return _answer(response)
        except BaseException:
            response.close()
            raise

    async def upload_part(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_no: int,
        size: int,
        body: AsyncIterable[bytes | memoryview] | bytes | bytearray,
        content_md5: str | None = None,
    ) -> str:
        """One UploadPart (Content-Length `size`, unsigned payload): the part's ETag as the store answers
        it.

        A body in hand goes with its Content-MD5 (base64), which the store checks. A streamed body is
        sent as it is produced, without one (its bytes are not all known when the request starts): the
        caller checks the ETag the store answers against the MD5 of what it sent (s3multipart). A
        streamed body that ends short or long, or fails, cuts the request off before it is whole, so the
        store keeps nothing of it.
        """
        params = {"partNumber": str(part_no), "uploadId": upload_id}
        extra = {"content-length": str(size)}
        if content_md5 is not None:
            extra["content-md5"] = content_md5
        url, headers = await self._signed("PUT", bucket, key, params, extra)
        assert self._session is not None

        async def exactly(pieces: AsyncIterable[bytes | memoryview]) -> AsyncIterator[bytes | memoryview]:
            sent = 0
            async for piece in pieces:
                sent += len(piece)
                if sent > size:
                    raise ValueError(f"part body longer than its {size} bytes")
                yield piece
            if sent != size:
                raise ValueError(f"part body ended at {sent} of its {size} bytes")

        data: bytes | bytearray | AsyncIterator[bytes | memoryview]
        if isinstance(body, bytes | bytearray):
            if len(body) != size:
                raise ValueError(f"part body of {len(body)} bytes, not {size}")
            data = body
        else:
            data = exactly(body)
        async with self._session.put(
            url, headers=headers, data=data, allow_redirects=False, **self._proxy(url, headers)
        ) as response:
            if response.status != 200:
                raise await _client_error(response, "UploadPart")
            await response.read()
            return response.headers.get("ETag", "")


def env_proxy(url: URL) -> tuple[dict[str, Any], dict[str, str]]:
    """How a request to url goes as HTTP(S)_PROXY and NO_PROXY say (the standard library's reading of
    them, which botocore uses too): aiohttp's proxy arguments and the headers to add to the request; both
    empty when it goes direct.

    Credentials in the proxy's URL become a Basic Proxy-Authorization header, as aiohttp's own reading of
    the environment sends them. aiohttp 3.14 deprecates `proxy_auth` for `proxy_headers`, but sends
    `proxy_headers` only on the CONNECT of an https request; a plain http request through a proxy
    carries the header itself."""
    if url.host is None or urllib.request.proxy_bypass(url.host):
        return {}, {}
    named = urllib.request.getproxies().get(url.scheme)
    if not named:
        return {}, {}
    proxy = URL(named if "://" in named else f"http://{named}")
    if proxy.user is None:
        return {"proxy": proxy}, {}
    auth = aiohttp.BasicAuth.from_url(proxy)  # not BasicAuth(...): aiohttp 3.14 deprecates that
    assert auth is not None  # the URL has a user
    header = {"Proxy-Authorization": auth.encode()}
    if url.scheme == "https":
        return {"proxy": proxy.with_user(None), "proxy_headers": header}, {}
    return {"proxy": proxy.with_user(None)}, header


def _answer(response: aiohttp.ClientResponse) -> dict[str, Any]:
    h = response.headers
    metadata: dict[str, str] = {}
    for raw_name, raw_value in response.raw_headers:
        name = raw_name.decode("utf-8", "surrogateescape").lower()
        if name.startswith("x-amz-meta-"):
            metadata[name[len("x-amz-meta-") :]] = raw_value.decode("utf-8", "surrogateescape")
    answer: dict[str, Any] = {
        "Body": LeanBody(response),
        "ContentLength": int(h.get("Content-Length", "0")),
        "ETag": h.get("ETag", ""),
        "LastModified": _http_date(h.get("Last-Modified")),
        "Metadata": metadata,
    }
    if "Content-Range" in h:
        answer["ContentRange"] = h["Content-Range"]
    if "Content-Type" in h:
        answer["ContentType"] = h["Content-Type"]
    return answer


async def _client_error(response: aiohttp.ClientResponse, operation: str) -> botocore.exceptions.ClientError:
    """The ClientError botocore raises for an error answer: its code (or the bare status), message."""
    body = b""
    if response.request_info.method != "HEAD":
        try:
            body = await asyncio.wait_for(response.content.read(MAX_ERROR_BODY), timeout=30)
        except (aiohttp.ClientError, TimeoutError):
            body = b""
    code, message = _error_fields(body) if body else (None, None)
    error: dict[str, Any] = {"Code": code or str(response.status), "Message": message or ""}
    parsed = {"Error": error, "ResponseMetadata": {"HTTPStatusCode": response.status}}
    return botocore.exceptions.ClientError(parsed, operation)
