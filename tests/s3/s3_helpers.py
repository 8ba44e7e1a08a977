"""Requests as real clients make them, for driving the S3 protocol layer without a server.

`boto3_wire` runs a real boto3 call and captures the exact request it would send (method, raw path,
raw query, headers, body bytes) just before it leaves. `sign_with_botocore` and `presign_with_botocore`
use botocore's own signers on hand-made requests. `signed_chunked_body` builds a signed aws-chunked body
with an HMAC chain written here from the AWS documentation, independently of tsproxy's decoder.
"""

from __future__ import annotations

import hashlib
import hmac
import io
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import boto3
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from multidict import CIMultiDict

ACCESS_KEY = "AKTSPROXYTEST"
SECRET_KEY = "s3cr3t/with+odd=chars"
SECRETS = {ACCESS_KEY: SECRET_KEY}


def secret_for(access_key: str) -> str | None:
    return SECRETS.get(access_key)


@dataclass
class Wire:
    """A request as it would cross the wire."""

    method: str
    path: str
    query: str
    headers: CIMultiDict[str]
    body: bytes

    @property
    def signed_at(self) -> datetime:
        return datetime.strptime(self.headers["x-amz-date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _wire(method: str, url: str, headers: Iterable[tuple[Any, Any]], body: Any) -> Wire:
    parts = urlsplit(url)
    h: CIMultiDict[str] = CIMultiDict((_text(k), _text(v)) for k, v in headers)
    if "host" not in h:
        h["Host"] = parts.netloc
    if hasattr(body, "read"):
        body = body.read()
    return Wire(method, parts.path or "/", parts.query, h, bytes(body or b""))


class _Captured(Exception):
    pass


def boto3_client(endpoint: str = "https://s3.test", region: str = "us-east-1", **config: Any) -> Any:
    """A boto3 S3 client that never connects: pair it with `boto3_wire`."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(**{"s3": {"addressing_style": "path"}, "retries": {"max_attempts": 1}, **config}),
    )


def boto3_wire(client: Any, call: Callable[[Any], Any]) -> Wire:
    """Run `call(client)` and return the request boto3 was about to send."""
    captured: list[Wire] = []

    def hook(request: Any, **_: Any) -> None:
        captured.append(_wire(request.method, request.url, request.headers.items(), request.body))
        raise _Captured()

    client.meta.events.register("before-send.s3.*", hook)
    try:
        call(client)
    except _Captured:
        pass
    finally:
        client.meta.events.unregister("before-send.s3.*", hook)
    assert captured, "boto3 sent nothing"
    return captured[0]


class _FixedPayloadAuth(S3SigV4Auth):
    """botocore's S3 signer, told which x-amz-content-sha256 to sign (e.g. a STREAMING mode)."""

    def __init__(self, credentials: Credentials, region: str, payload: str) -> None:
        super().__init__(credentials, "s3", region)
        self._payload = payload

    def payload(self, request: Any) -> str:
        return self._payload


def sign_with_botocore(
    method: str,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    region: str = "us-east-1",
    payload: str | None = None,
    secret: str = SECRET_KEY,
    access_key: str = ACCESS_KEY,
) -> Wire:
    """Sign a request with botocore's S3SigV4Auth; `payload` overrides the x-amz-content-sha256 value."""
    request = AWSRequest(method=method, url=url, data=body, headers=headers or {})
    creds = Credentials(access_key, secret)
    auth = S3SigV4Auth(creds, "s3", region) if payload is None else _FixedPayloadAuth(creds, region, payload)
    auth.add_auth(request)
    return _wire(method, request.url, request.headers.items(), body)


def presign_with_botocore(
    method: str,
    url: str,
    *,
    expires: int = 3600,
    region: str = "us-east-1",
    headers: dict[str, str] | None = None,
) -> Wire:
    """A presigned URL made by botocore's S3SigV4QueryAuth, as the request that uses it."""
    request = AWSRequest(method=method, url=url, headers=headers or {})
    S3SigV4QueryAuth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", region, expires=expires).add_auth(request)
    return _wire(method, request.url, request.headers.items(), b"")


# -- an independent aws-chunked signer ----------------------------------------------------------------

EMPTY = hashlib.sha256(b"").hexdigest()


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str) -> bytes:
    return _hmac(_hmac(_hmac(_hmac(("AWS4" + secret).encode(), date), region), "s3"), "aws4_request")


@dataclass
class ChunkSigner:
    """The chunk-signature chain of the AWS docs: each signature covers its chunk and the one before."""

    key: bytes
    amz_date: str
    scope: str
    previous: str

    def chunk(self, data: bytes) -> str:
        sts = "\n".join(
            [
                "AWS4-HMAC-SHA256-PAYLOAD",
                self.amz_date,
                self.scope,
                self.previous,
                EMPTY,
                hashlib.sha256(data).hexdigest(),
            ]
        )
        self.previous = hmac.new(self.key, sts.encode(), hashlib.sha256).hexdigest()
        return self.previous

    def trailer(self, trailers: Sequence[tuple[str, str]]) -> str:
        canonical = "".join(f"{name}:{value}\n" for name, value in sorted(trailers))
        sts = "\n".join(
            [
                "AWS4-HMAC-SHA256-TRAILER",
                self.amz_date,
                self.scope,
                self.previous,
                hashlib.sha256(canonical.encode()).hexdigest(),
            ]
        )
        self.previous = hmac.new(self.key, sts.encode(), hashlib.sha256).hexdigest()
        return self.previous


def signed_chunked_body(
    signer: ChunkSigner, chunks: Sequence[bytes], trailers: Sequence[tuple[str, str]] | None = None
) -> bytes:
    """`chunks` framed and signed, then the empty final chunk, then (signed) trailers if given."""
    out = io.BytesIO()
    for data in [*chunks, b""]:
        out.write(b"%x;chunk-signature=%s\r\n" % (len(data), signer.chunk(data).encode()))
        if data:
            out.write(data + b"\r\n")
    if trailers is not None:
        for name, value in trailers:
            out.write(f"{name}:{value}\r\n".encode())
        out.write(f"x-amz-trailer-signature:{signer.trailer(trailers)}\r\n".encode())
    out.write(b"\r\n")
    return out.getvalue()


def unsigned_chunked_body(chunks: Sequence[bytes], trailers: Sequence[tuple[str, str]] = ()) -> bytes:
    """The unsigned framing boto3 uses with STREAMING-UNSIGNED-PAYLOAD-TRAILER."""
    out = io.BytesIO()
    for data in chunks:
        if data:
            out.write(b"%x\r\n%s\r\n" % (len(data), data))
    out.write(b"0\r\n")
    for name, value in trailers:
        out.write(f"{name}:{value}\r\n".encode())
    out.write(b"\r\n")
    return out.getvalue()
