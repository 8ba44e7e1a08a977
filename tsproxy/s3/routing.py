"""Which S3 operation a request is: method, host, path, query and a few headers in; S3Request out.

Buckets are named path-style (`/bucket/key`) or virtual-hosted (`bucket.<suffix>` in Host, for the
configured suffixes). S3 "subresources" (`?tagging`, `?lifecycle`, ...) that tsproxy does not serve are
501 NotImplemented, so a client learns at once rather than getting a misleading answer. `?acl` is served
for the one policy tsproxy has: private, the owner with full control.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


def route(
    method: str,
    host: str,
    raw_path: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    virtual_host_suffixes: Sequence[str] = (),
) -> S3Request:
    """Name the S3 operation of a request, or raise the S3 error for one tsproxy does not serve.

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

    if bucket is None:
        if method in ("GET", "HEAD"):
            return S3Request(Operation.LIST_BUCKETS, None, None)
        raise errors.MethodNotAllowed(Method=method, ResourceType="SERVICE")
    check_bucket_name(bucket, strict=method == "PUT" and key is None and not (SUBRESOURCES & set(query)))
    subresources = set(SUBRESOURCES & set(query)) - _PLAIN
    if key is None:
        return S3Request(_bucket_operation(method, subresources, query), bucket, None, virtual)
    _check_key(key)
    return S3Request(_object_operation(method, subresources, query, headers), bucket, key, virtual)


_BUCKET_READS = {
    "acl": Operation.GET_BUCKET_ACL,
    "location": Operation.GET_BUCKET_LOCATION,
    "versioning": Operation.GET_BUCKET_VERSIONING,
    "versions": Operation.LIST_OBJECT_VERSIONS,
    "uploads": Operation.LIST_MULTIPART_UPLOADS,
}
_BUCKET_SIMPLE = {
    "HEAD": Operation.HEAD_BUCKET,
    "PUT": Operation.CREATE_BUCKET,
    "DELETE": Operation.DELETE_BUCKET,
}


def _unsupported(subresources: set[str]) -> errors.S3Error:
    names = ", ".join(sorted(subresources))
    return errors.NotImplemented_(f"tsproxy does not implement the {names} subresource.", Subresource=names)


def _bucket_operation(method: str, sub: set[str], query: Mapping[str, str]) -> Operation:
    sub = sub - {"uploadId"}  # meaningless on a bucket; S3 ignores it
    if method == "GET":
        if len(sub) == 1 and (name := next(iter(sub))) in _BUCKET_READS:
            return _BUCKET_READS[name]
        if sub:
            raise _unsupported(sub)
        return Operation.LIST_OBJECTS_V2 if query.get("list-type") == "2" else Operation.LIST_OBJECTS
    if method == "POST" and sub == {"delete"}:
        return Operation.DELETE_OBJECTS
    if method == "PUT" and sub == {"acl"}:
        return Operation.PUT_BUCKET_ACL
    if sub:
        raise _unsupported(sub)
    if method in _BUCKET_SIMPLE:
        return _BUCKET_SIMPLE[method]
    if method == "POST":
        raise errors.NotImplemented_("tsproxy does not implement browser-based POST uploads.")
    raise errors.MethodNotAllowed(Method=method, ResourceType="BUCKET")


def _object_operation(
    method: str, sub: set[str], query: Mapping[str, str], headers: Mapping[str, str]
) -> Operation:
    upload = "uploadId" in query
    copy = any(name.lower() == "x-amz-copy-source" for name in headers)
    if sub == {"acl"} and method in ("GET", "PUT"):
        return Operation.GET_OBJECT_ACL if method == "GET" else Operation.PUT_OBJECT_ACL
    allowed = {"uploadId"} | ({"uploads"} if method == "POST" else set())
    if sub - allowed:
        raise _unsupported(sub - allowed)
    if method == "GET":
        return Operation.LIST_PARTS if upload else Operation.GET_OBJECT
    if method == "HEAD":
        return Operation.HEAD_OBJECT
    if method == "PUT":
        if upload:
            return Operation.UPLOAD_PART_COPY if copy else Operation.UPLOAD_PART
        return Operation.COPY_OBJECT if copy else Operation.PUT_OBJECT
    if method == "DELETE":
        return Operation.ABORT_MULTIPART_UPLOAD if upload else Operation.DELETE_OBJECT
    if method == "POST":
        if upload:
            return Operation.COMPLETE_MULTIPART_UPLOAD
        if "uploads" in query:
            return Operation.CREATE_MULTIPART_UPLOAD
    raise errors.MethodNotAllowed(Method=method, ResourceType="OBJECT")


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
