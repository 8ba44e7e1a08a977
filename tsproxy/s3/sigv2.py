"""AWS Signature Version 2 verification for S3, sans-IO.

Older SDKs sign with it, and aws cli v1 presigns with it by default; MinIO and Ceph RGW accept it, so
tsproxy does too. Two forms:

- header: ``Authorization: AWS <access key>:<signature>``, dated by ``Date`` or ``x-amz-date``;
- presigned URL: ``?AWSAccessKeyId=<key>&Expires=<unix seconds>&Signature=<signature>``.

The signature is base64(HMAC-SHA1(secret, string to sign)), where the string to sign is

    METHOD \\n Content-MD5 \\n Content-Type \\n DATE \\n x-amz-* headers \\n... RESOURCE

DATE is the ``Date`` header (empty when ``x-amz-date`` is sent: that one is signed among the x-amz-*
headers), or the ``Expires`` value of a presigned URL. The x-amz-* headers are lower-cased, sorted, their
repeated values joined with commas, one ``name:value`` line each. RESOURCE is ``/<bucket>`` when the bucket
is named in the Host header, then the path as sent, then the subresources and response overrides of the
query, decoded and sorted by name. The body is not signed (a Content-MD5 header, when sent, is checked
against the body elsewhere).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from urllib.parse import quote, unquote

from tsproxy import errors
from tsproxy.s3.sigv4 import (
    SIGNED_STREAMING,
    UNSIGNED_PAYLOAD,
    AuthResult,
    check_one_mechanism,
    headers_by_name,
    payload_mode,
    query_pairs,
)

SCHEME = "AWS"
PRESIGN_PARAMS = ("AWSAccessKeyId", "Expires", "Signature")

# Query parameters that are part of the signed resource (the others are not signed at all).
SIGNED_SUBRESOURCES = frozenset(
    """accelerate acl analytics cors defaultObjectAcl delete encryption intelligent-tiering inventory
    legal-hold lifecycle location logging metrics notification object-lock partNumber policy
    publicAccessBlock replication requestPayment response-cache-control response-content-disposition
    response-content-encoding response-content-language response-content-type response-expires
    restore retention select select-type storageClass tagging torrent uploadId uploads versionId
    versioning versions website""".split()
)

_EXPIRES = re.compile(r"[0-9]{1,12}")


def is_v2(headers: Mapping[str, str], raw_query: str) -> bool:
    """True when the request is signed (or presigned) with SigV2 rather than SigV4."""
    authorization = headers_by_name(headers).get("authorization", [None])[0]
    if authorization is not None:
        return authorization.strip().partition(" ")[0] == SCHEME
    return any(unquote(k) == "AWSAccessKeyId" for k, _ in query_pairs(raw_query))


def sign(secret: str, string_to_sign: str) -> str:
    """base64(HMAC-SHA1(secret, string to sign)), as the client puts it in the request."""
    digest = hmac.new(secret.encode(), string_to_sign.encode("utf-8", "surrogateescape"), hashlib.sha1)
    return base64.b64encode(digest.digest()).decode()


def string_to_sign(
    method: str,
    raw_path: str,
    pairs: list[tuple[str, str]],
    h: Mapping[str, list[str]],
    date: str,
    host_bucket: str | None,
) -> str:
    """The SigV2 string to sign of a request whose path is taken exactly as `raw_path` spells it."""

    def first(name: str) -> str:
        return h.get(name, [""])[0].strip()

    amz = "".join(
        f"{name}:{','.join(v.strip() for v in values)}\n"
        for name, values in sorted(h.items())
        if name.startswith("x-amz-")
    )
    resource = (f"/{host_bucket}" if host_bucket else "") + raw_path
    signed = sorted(
        (unquote(k), unquote(v) if v else None)
        for k, v in (pair for pair in pairs if unquote(pair[0]) in SIGNED_SUBRESOURCES)
    )
    if signed:
        resource += "?" + "&".join(k if v is None else f"{k}={v}" for k, v in signed)
    return "\n".join((method.upper(), first("content-md5"), first("content-type"), date, amz + resource))


def _canonical_paths(raw_path: str, host_bucket: str | None) -> list[str]:
    """The path as sent, then in S3's own encoding: clients differ in which characters they escape.

    A request for a bucket itself signs `/<bucket>/` (botocore signs it so for `/bucket` as well).
    """
    canonical = quote(unquote(raw_path, errors="surrogateescape"), safe="/~", errors="surrogateescape")
    paths = [raw_path, canonical]
    if host_bucket is None and raw_path.count("/") == 1 and len(raw_path) > 1:
        paths.append(raw_path + "/")
    return list(dict.fromkeys(paths))


def _matches(expected: str, provided: str) -> bool:
    return hmac.compare_digest(expected.encode(), provided.encode("utf-8", "replace"))


def verify(
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    secret_for: Callable[[str], str | None],
    now: datetime,
    *,
    host_bucket: str | None = None,
    max_skew: timedelta = timedelta(minutes=15),
) -> AuthResult:
    """Check a SigV2 signature (header or presigned URL); raise the S3 error S3 would give.

    `host_bucket` is the bucket when the Host header names it (virtual-hosted style), else None.
    """
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    h = headers_by_name(headers)
    pairs = query_pairs(raw_query)
    authorization = h.get("authorization", [None])[0]
    check_one_mechanism(authorization, (unquote(k) for k, _ in pairs))
    if authorization is not None:
        access_key, provided, date = _from_header(authorization, h, now, max_skew)
        unsigned = pairs
    else:
        access_key, provided, date = _from_query(pairs, now)
        unsigned = [(k, v) for k, v in pairs if unquote(k) not in PRESIGN_PARAMS]
    secret = secret_for(access_key)
    if secret is None:
        raise errors.InvalidAccessKeyId(AWSAccessKeyId=access_key)
    first = ""
    for path in _canonical_paths(raw_path, host_bucket):
        text = string_to_sign(method, path, unsigned, h, date, host_bucket)
        first = first or text
        expected = sign(secret, text)
        # A presigned signature's `+` reaches us as a space when the client left it unescaped.
        if _matches(expected, provided) or _matches(expected, provided.replace(" ", "+")):
            break
    else:
        raise errors.SignatureDoesNotMatch(
            AWSAccessKeyId=access_key,
            StringToSign=first,
            SignatureProvided=provided,
            StringToSignBytes=" ".join(f"{b:02x}" for b in first.encode()),
        )
    mode, digest = payload_mode(h.get("x-amz-content-sha256", [UNSIGNED_PAYLOAD])[0].strip())
    if mode in SIGNED_STREAMING:
        raise errors.InvalidRequest("Signed aws-chunked payloads need a SigV4 signature.")
    return AuthResult(access_key=access_key, payload_mode=mode, payload_sha256=digest)


def _from_header(
    authorization: str, h: Mapping[str, list[str]], now: datetime, max_skew: timedelta
) -> tuple[str, str, str]:
    """Access key, signature and the DATE line of a header-signed request; checks the clock skew."""
    _, _, credential = authorization.strip().partition(" ")
    access_key, colon, provided = credential.strip().rpartition(":")
    if not colon or not access_key or not provided:
        raise errors.AccessDenied("AWS authorization header is invalid. Expected AwsAccessKeyId:signature")
    raw = (h.get("x-amz-date") or h.get("date") or [""])[0].strip()
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError, OverflowError):
        raise errors.AccessDenied("AWS authentication requires a valid Date or x-amz-date header") from None
    when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    if abs(now - when) > max_skew:
        raise errors.RequestTimeTooSkewed(
            RequestTime=raw,
            ServerTime=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            MaxAllowedSkewMilliseconds=str(int(max_skew.total_seconds() * 1000)),
        )
    # With x-amz-date the Date line is empty: the date is signed among the x-amz-* headers instead.
    date = "" if "x-amz-date" in h else h["date"][0].strip()
    return access_key, provided, date


def _from_query(pairs: list[tuple[str, str]], now: datetime) -> tuple[str, str, str]:
    """Access key, signature and the DATE line (Expires) of a presigned URL; checks it has not expired."""
    q = {unquote(k): unquote(v) for k, v in pairs}
    if any(p not in q for p in PRESIGN_PARAMS):
        raise errors.AccessDenied(
            "Query-string authentication requires the Signature, Expires and AWSAccessKeyId parameters"
        )
    expires = q["Expires"]
    if not _EXPIRES.fullmatch(expires):
        raise errors.AccessDenied("Invalid date (should be seconds since epoch)", Expires=expires)
    # Compared as numbers: a far-future Expires (up to 12 digits) is past the last year a datetime holds.
    if now.timestamp() > int(expires):
        raise errors.AccessDenied(
            "Request has expired",
            Expires=datetime.fromtimestamp(int(expires), UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            ServerTime=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
    return q["AWSAccessKeyId"], q["Signature"], expires
