"""Who sent a request: picks the signature scheme (SigV4 or SigV2) and verifies it, sans-IO."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from tsproxy.s3 import sigv2, sigv4
from tsproxy.s3.sigv4 import AuthResult


def authenticate(
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    secret_for: Callable[[str], str | None],
    now: datetime,
    *,
    host_bucket: str | None = None,
    allow_anonymous: bool = False,
    max_skew: timedelta = timedelta(minutes=15),
    region: str | None = None,
) -> AuthResult:
    """Verify a request's signature, whichever scheme signed it; raise the S3 error S3 would give.

    `host_bucket` is the bucket named by the Host header (virtual-hosted style), which SigV2 signs;
    `region` is the endpoint's region, which a SigV4 credential scope must name.
    """
    if sigv2.is_v2(headers, raw_query):
        return sigv2.verify(
            method, raw_path, raw_query, headers, secret_for, now, host_bucket=host_bucket, max_skew=max_skew
        )
    return sigv4.verify(
        method,
        raw_path,
        raw_query,
        headers,
        secret_for,
        now,
        allow_anonymous=allow_anonymous,
        max_skew=max_skew,
        region=region,
    )
