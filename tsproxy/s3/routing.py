"""Which S3 operation a request is: method, host, path, query and a few headers in; S3Request out.

The operations and the shapes of the requests that name them are rows of one table, the server's
(`server.routes.ROUTES`: operation, shape, handler, what it may do while draining); this module reads
the request (path-style or virtual-hosted, names checked) and finds its row, without I/O.

Buckets are named path-style (`/bucket/key`) or virtual-hosted (`bucket.<suffix>` in Host, for the
configured suffixes). S3 "subresources" (`?tagging`, `?lifecycle`, ...) that tsproxy does not serve are
501 NotImplemented, so a client learns at once rather than getting a misleading answer. `?acl` is served
for the one policy tsproxy has: private, the owner with full control.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import unquote_to_bytes

from tsproxy import errors
from tsproxy.s3.limits import MAX_KEY_BYTES
from tsproxy.s3.operations import Operation


class InvalidURI(errors.S3Error):
    """The path is not valid percent-encoded UTF-8."""

    code = "InvalidURI"
    status = 400
    default_message = "Couldn't parse the specified URI."


@dataclass(frozen=True)
class S3Request:
    """The S3 operation a request asks for, with its bucket and (decoded) key when it has them."""

    operation: Operation
    bucket: str | None
    key: str | None
    host_bucket: bool = False  # the Host header named the bucket (virtual-hosted style)


# Subresources S3 knows; those not routed below are answered 501.
SUBRESOURCES = frozenset(
    """abac accelerate acl analytics attributes cors delete encryption intelligent-tiering inventory
    legal-hold lifecycle location logging metadataConfiguration metadataTable metrics notification object-lock
    ownershipControls partNumber policy policyStatus publicAccessBlock renameObject replication requestPayment
    restore retention select session tagging torrent uploadId uploads versionId versioning versions
    website""".split()
)
# Parameters that shape an answer but are no subresource of their own.
_PLAIN = frozenset({"partNumber", "versionId"})

_STRICT_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_LEGACY_BUCKET = re.compile(r"[A-Za-z0-9._-]{3,255}")
_IP_ADDRESS = re.compile(r"\d{1,3}(\.\d{1,3}){3}")


def check_bucket_name(name: str, *, strict: bool) -> None:
    """Raise InvalidBucketName unless `name` is a valid bucket name.

    Strict: the rules for new buckets (3-63 of a-z 0-9 . -, letter or digit at both ends, no `..`, not an
    IP address, no reserved prefix or suffix). Otherwise the looser legacy rules, so that existing buckets
    with older names stay reachable.
    """
    if strict:
        ok = (
            _STRICT_BUCKET.fullmatch(name) is not None
            and ".." not in name
            and ".-" not in name
            and "-." not in name
            and _IP_ADDRESS.fullmatch(name) is None
            and not name.startswith(("xn--", "sthree-", "amzn-s3-demo-"))
            and not name.endswith(("-s3alias", "--ol-s3", "--x-s3", ".mrap"))
        )
    else:
        ok = _LEGACY_BUCKET.fullmatch(name) is not None
    if not ok:
        raise errors.InvalidBucketName(BucketName=name)


def _decode(raw: str) -> str:
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeError:  # bytes that are not UTF-8, or surrogates standing for them
        raise InvalidURI() from None


def _check_key(key: str) -> None:
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise errors.KeyTooLongError(
            Size=str(len(key.encode("utf-8", "surrogatepass"))), MaxSizeAllowed=str(MAX_KEY_BYTES)
        )


def _host_bucket(host: str, suffixes: Sequence[str]) -> str | None:
    name = host.strip().lower()
    if name.startswith("["):  # IPv6 literal, never virtual-hosted
        return None
    name = name.rsplit(":", 1)[0] if ":" in name else name
    name = name.rstrip(".")
    for suffix in suffixes:
        suffix = suffix.strip().lower().strip(".")
        if suffix and name.endswith("." + suffix):
            bucket = name[: -len(suffix) - 1]
            return bucket or None
    return None


Resource = Literal["service", "bucket", "object"]


@dataclass(frozen=True)
class Shape:
    """What a request must look like to name an operation: its method(s), what it addresses, its
    subresources exactly (once those it `ignores` are left out), and whether it carries
    `x-amz-copy-source` (None: either way) or a query parameter with a given value."""

    methods: frozenset[str]
    resource: Resource
    subresources: frozenset[str] = frozenset()
    ignores: frozenset[str] = frozenset()
    copy: bool | None = None
    query: tuple[str, str] | None = None

    def matches(
        self, method: str, resource: Resource, sub: set[str], copy: bool, query: Mapping[str, str]
    ) -> bool:
        return (
            method in self.methods
            and resource == self.resource
            and sub - self.ignores == self.subresources
            and (self.copy is None or self.copy == copy)
            and (self.query is None or query.get(self.query[0]) == self.query[1])
        )


def shape(methods: str, resource: Resource, *subresources: str, **more: Any) -> Shape:
    """A Shape, spelt short for a route table: shape("GET HEAD", "object", "uploadId", copy=False)."""
    return Shape(frozenset(methods.split()), resource, frozenset(subresources), **more)


class Routed(Protocol):
    """A row of a route table: the operation, and the shape of the requests that name it."""

    @property
    def operation(self) -> Operation: ...

    @property
    def shape(self) -> Shape: ...


def route(
    method: str,
    host: str,
    raw_path: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    virtual_host_suffixes: Sequence[str] = (),
    *,
    table: Sequence[Routed],
) -> S3Request:
    """Name the S3 operation of a request by the first row of `table` whose shape it has, or raise the
    S3 error for one tsproxy does not serve.

    `raw_path` is still percent-encoded; `query` maps decoded parameter names to values; `headers` is
    case-insensitive (or lower-case keys). Unsupported subresources -> NotImplemented (501); a method a
    resource does not take -> MethodNotAllowed; bad names -> InvalidBucketName, KeyTooLongError.
    """
    method = method.upper()
    path = raw_path.split("?", 1)[0] or "/"
    if not path.startswith("/"):
        raise InvalidURI()
    bucket = _host_bucket(host, virtual_host_suffixes)
    virtual = bucket is not None
    if bucket is not None:
        raw_key = path[1:]
    else:
        raw_bucket, _, raw_key = path[1:].partition("/")
        bucket = _decode(raw_bucket) or None
    key = _decode(raw_key) if raw_key else None

    resource: Resource = "service" if bucket is None else "bucket" if key is None else "object"
    if bucket is not None:
        strict = method == "PUT" and key is None and not (SUBRESOURCES & set(query))
        check_bucket_name(bucket, strict=strict)
    if key is not None:
        _check_key(key)
    sub = set(SUBRESOURCES & set(query)) - _PLAIN
    copy = any(name.lower() == "x-amz-copy-source" for name in headers)
    for row in table:
        if row.shape.matches(method, resource, sub, copy, query):
            return S3Request(row.operation, bucket, key, virtual)
    raise _unrouted(method, resource, sub)


def _unrouted(method: str, resource: Resource, sub: set[str]) -> errors.S3Error:
    """The error for a request no route takes: an unsupported subresource (501) before a method the
    resource does not take (405)."""
    if resource == "service":
        return errors.MethodNotAllowed(Method=method, ResourceType="SERVICE")
    if resource == "bucket":
        sub = sub - {"uploadId"}  # meaningless on a bucket; S3 ignores it
        if sub:
            return _unsupported(sub)
        if method == "POST":
            return errors.NotImplemented_("tsproxy does not implement browser-based POST uploads.")
        return errors.MethodNotAllowed(Method=method, ResourceType="BUCKET")
    extra = sub - {"uploadId"} - ({"uploads"} if method == "POST" else set())
    if extra:
        return _unsupported(extra)
    return errors.MethodNotAllowed(Method=method, ResourceType="OBJECT")


def _unsupported(subresources: set[str]) -> errors.S3Error:
    names = ", ".join(sorted(subresources))
    return errors.NotImplemented_(f"tsproxy does not implement the {names} subresource.", Subresource=names)


def parse_copy_source(value: str) -> tuple[str, str, str | None]:
    """Split `x-amz-copy-source` (``[/]bucket/key[?versionId=id]``, URL-encoded) into bucket, key, version.

    Raises InvalidArgument when it names no bucket and key, InvalidURI for bad encoding.
    """
    raw, _, params = value.strip().partition("?")
    version: str | None = None
    if params:
        name, _, version_raw = params.partition("=")
        if name != "versionId" or "&" in version_raw:
            raise _bad_copy_source()
        version = _decode(version_raw)
    raw_bucket, _, raw_key = raw.removeprefix("/").partition("/")
    bucket, key = _decode(raw_bucket), _decode(raw_key)
    if not bucket or not key:
        raise _bad_copy_source()
    check_bucket_name(bucket, strict=False)
    _check_key(key)
    return bucket, key, version


def _bad_copy_source() -> errors.S3Error:
    return errors.InvalidArgument(
        "Copy Source must mention the source bucket and key: sourcebucket/sourcekey",
        ArgumentName="x-amz-copy-source",
    )
