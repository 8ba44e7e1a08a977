"""What an S3-compatible backend's failures mean to tsproxy: which S3 error, and whether to retry.

Errors that concern the object or bucket (NoSuchKey, PreconditionFailed, EntityTooSmall …) pass
through as the same typed error, so the server answers its own client as the backend answered it.
Errors that concern tsproxy's own credentials, signature or clock become `BackendRefused`, a 503 that
names the object store: the client did nothing wrong, and an AccessDenied would make it doubt its own
keys. Connection failures, 5xx answers and throttling are retryable; a 5xx that outlasts the retries
(but for 503 and 501, which have their own types) is a `StoreFault`, which the store's health counts.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import botocore.exceptions

from tsproxy import errors
from tsproxy.errors import S3Error
from tsproxy.store.base import StoreFault


class BucketAlreadyExists(S3Error):
    code = "BucketAlreadyExists"
    status = 409
    default_message = (
        "The requested bucket name is not available. "
        "The bucket namespace is shared by all users of the system."
    )


class BackendRefused(errors.ServiceUnavailable):  # type: ignore[misc,valid-type]
    """The object store refused tsproxy's own credentials, signature or clock (a 503 to clients)."""

    def __init__(self, code: str) -> None:
        what = "credentials" if code in CREDENTIAL_CODES else "request"
        super().__init__(f"The object store behind tsproxy refused tsproxy's {what} ({code}).")
        self.backend_code = code


class BackendError(S3Error):
    """A backend error code tsproxy has no type for; keeps the backend's code and status."""

    def __init__(self, code: str, status: int, message: str | None = None, **fields: str) -> None:
        super().__init__(message or f"The storage backend answered {code}.", **fields)
        self.code = code
        self.status = status


_PASSED_THROUGH: tuple[type[S3Error], ...] = (
    errors.AccessDenied,
    errors.BadDigest,
    errors.BucketAlreadyOwnedByYou,
    BucketAlreadyExists,
    errors.BucketNotEmpty,
    errors.EntityTooLarge,
    errors.EntityTooSmall,
    errors.IncompleteBody,
    errors.InternalError,
    errors.InvalidArgument,
    errors.InvalidBucketName,
    errors.InvalidDigest,
    errors.InvalidPart,
    errors.InvalidPartOrder,
    errors.InvalidRange,
    errors.InvalidRequest,
    errors.KeyTooLongError,
    errors.MalformedXML,
    errors.MethodNotAllowed,
    errors.MissingContentLength,
    errors.NoSuchBucket,
    errors.NoSuchKey,
    errors.NoSuchUpload,
    errors.NotImplemented_,
    errors.PreconditionFailed,
    errors.RequestTimeout,
    errors.ServiceUnavailable,
    errors.SlowDown,
)
BY_CODE: dict[str, type[S3Error]] = {cls.code: cls for cls in _PASSED_THROUGH}
# Codes some stores use for throttling, all answered as SlowDown.
for _code in ("Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests"):
    BY_CODE[_code] = errors.SlowDown
# The backend refusing tsproxy's own signature or clock is a configuration fault, not the client's.
CONFIG_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "RequestTimeTooSkewed",
        "AuthorizationHeaderMalformed",
        "XAmzContentSHA256Mismatch",
        "InvalidToken",
        "ExpiredToken",
        "PermanentRedirect",
        "301",
    }
)
CREDENTIAL_CODES = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "AccessDenied", "403"}
)
# HEAD answers carry no body, so only the status says what happened.
BY_STATUS: dict[int, type[S3Error]] = {
    403: errors.AccessDenied,
    412: errors.PreconditionFailed,
    416: errors.InvalidRange,
    500: errors.InternalError,
    503: errors.ServiceUnavailable,
}
RETRYABLE_CODES = frozenset(
    {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "OperationAborted", "Throttling"}
    | {"ThrottlingException", "RequestLimitExceeded", "TooManyRequests"}
)
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    botocore.exceptions.HTTPClientError,  # connection refused/closed, read/connect timeouts, proxies
    botocore.exceptions.ResponseStreamingError,
    botocore.exceptions.IncompleteReadError,
    botocore.exceptions.EndpointConnectionError,
    aiohttp.ClientError,
    asyncio.TimeoutError,
    ConnectionError,
)


def _status(error: botocore.exceptions.ClientError) -> int:
    meta: dict[str, Any] = error.response.get("ResponseMetadata", {})
    try:
        return int(meta.get("HTTPStatusCode", 0))
    except (TypeError, ValueError):
        return 0


def error_code(error: BaseException) -> str | None:
    """The backend's error code of a ClientError (possibly a bare status like "404"), else None."""
    if isinstance(error, botocore.exceptions.ClientError):
        return str(error.response.get("Error", {}).get("Code", "")) or str(_status(error))
    return None


def is_throttling(error: BaseException) -> bool:
    """The store asked for fewer requests (SlowDown, 429 and the like): retry, but later."""
    if isinstance(error, botocore.exceptions.ClientError):
        return BY_CODE.get(error_code(error) or "") is errors.SlowDown or _status(error) == 429
    return isinstance(error, errors.SlowDown)


def is_retryable(error: BaseException) -> bool:
    """Worth another attempt: a dropped or timed-out connection, throttling, or a 5xx answer."""
    if isinstance(error, botocore.exceptions.ClientError):
        return error_code(error) in RETRYABLE_CODES or _status(error) in RETRYABLE_STATUS
    return isinstance(error, CONNECTION_ERRORS)


def to_s3_error(
    error: BaseException, *, not_found: type[S3Error] = errors.NoSuchKey, **fields: str
) -> S3Error:
    """The S3 error to raise for a backend failure (after any retries).

    `not_found` is what a bare 404 means for the operation (a HEAD of an object or a bucket).
    `fields` (Key, BucketName …) are added to errors that come without them.
    """
    if isinstance(error, S3Error):
        return error
    if isinstance(error, botocore.exceptions.ClientError):
        code = error_code(error) or "InternalError"
        status = _status(error)
        message = error.response.get("Error", {}).get("Message") or None
        if code in CONFIG_CODES:
            return BackendRefused(code)
        cls = BY_CODE.get(code)
        if cls is None and code.isascii() and code.isdigit():
            cls = not_found if status == 404 else BY_STATUS.get(status)
        if cls is errors.InternalError:
            return StoreFault(status, code, message if message and not code.isdigit() else None, **fields)
        if cls is not None:
            return cls(message if message and not code.isdigit() else None, **fields)
        if status >= 500:  # 502 Bad Gateway, 504 Gateway Timeout and codes of the store's own
            return StoreFault(status, code)
        if status == 0:
            return errors.InternalError(f"The storage backend answered {code}.")
        return BackendError(code, status, message, **fields)
    if isinstance(error, CONNECTION_ERRORS):
        return errors.ServiceUnavailable("The storage backend could not be reached.")
    if isinstance(error, botocore.exceptions.SSLError):  # TLS mismatch or an untrusted certificate
        return errors.ServiceUnavailable("The storage backend could not be reached over TLS.")
    return errors.InternalError(f"Unexpected storage backend failure: {type(error).__name__}.")
