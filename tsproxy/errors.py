"""Typed errors shared by every layer.

Each S3 error carries the code and HTTP status that S3 itself gives, so one place (the server) turns any of
them into the XML error response. Format errors (tampering, unknown keys) are not S3 errors: the server
maps them to a 500 InternalError for the client and logs the cause, because the client did nothing wrong.
"""

from __future__ import annotations


class TsproxyError(Exception):
    """Base of every error tsproxy raises on purpose."""


class S3Error(TsproxyError):
    """An error with an S3 error code, HTTP status and message."""

    code: str = "InternalError"
    status: int = 500
    default_message: str = "We encountered an internal error. Please try again."

    def __init__(self, message: str | None = None, **fields: str) -> None:
        super().__init__(message or self.default_message)
        self.message = message or self.default_message
        # Extra XML elements S3 adds to some errors (BucketName, Key, UploadId, ArgumentName ...).
        self.fields = fields


def _s3_error(code: str, status: int, message: str) -> type[S3Error]:
    return type(code, (S3Error,), {"code": code, "status": status, "default_message": message})


# The S3 errors tsproxy can answer with; status and message as S3 documents them.
AccessDenied = _s3_error("AccessDenied", 403, "Access Denied")
AuthorizationHeaderMalformed = _s3_error(
    "AuthorizationHeaderMalformed", 400, "The authorization header is malformed."
)
AuthorizationQueryParametersError = _s3_error(
    "AuthorizationQueryParametersError", 400, "Error parsing the X-Amz-Credential parameter."
)
BadDigest = _s3_error("BadDigest", 400, "The Content-MD5 you specified did not match what we received.")
BucketAlreadyOwnedByYou = _s3_error(
    "BucketAlreadyOwnedByYou",
    409,
    "Your previous request to create the named bucket succeeded and you already own it.",
)
BucketNotEmpty = _s3_error("BucketNotEmpty", 409, "The bucket you tried to delete is not empty.")
EntityTooLarge = _s3_error(
    "EntityTooLarge", 400, "Your proposed upload exceeds the maximum allowed object size."
)
EntityTooSmall = _s3_error(
    "EntityTooSmall", 400, "Your proposed upload is smaller than the minimum allowed object size."
)
IncompleteBody = _s3_error(
    "IncompleteBody",
    400,
    "You did not provide the number of bytes specified by the Content-Length HTTP header.",
)
InternalError = _s3_error("InternalError", 500, "We encountered an internal error. Please try again.")
InvalidAccessKeyId = _s3_error(
    "InvalidAccessKeyId", 403, "The AWS Access Key Id you provided does not exist in our records."
)
InvalidArgument = _s3_error("InvalidArgument", 400, "Invalid Argument")
InvalidBucketName = _s3_error("InvalidBucketName", 400, "The specified bucket is not valid.")
InvalidDigest = _s3_error("InvalidDigest", 400, "The Content-MD5 you specified is not valid.")
InvalidPart = _s3_error(
    "InvalidPart",
    400,
    "One or more of the specified parts could not be found. The part might not have been uploaded, "
    "or the specified entity tag might not have matched the part's entity tag.",
)
InvalidPartOrder = _s3_error(
    "InvalidPartOrder",
    400,
    "The list of parts was not in ascending order. Parts must be ordered by part number.",
)
InvalidRange = _s3_error("InvalidRange", 416, "The requested range is not satisfiable")
InvalidRequest = _s3_error("InvalidRequest", 400, "Invalid Request")
KeyTooLongError = _s3_error("KeyTooLongError", 400, "Your key is too long")
MalformedXML = _s3_error(
    "MalformedXML",
    400,
    "The XML you provided was not well-formed or did not validate against our published schema",
)
MethodNotAllowed = _s3_error(
    "MethodNotAllowed", 405, "The specified method is not allowed against this resource."
)
MissingContentLength = _s3_error(
    "MissingContentLength", 411, "You must provide the Content-Length HTTP header."
)
NoSuchBucket = _s3_error("NoSuchBucket", 404, "The specified bucket does not exist")
NoSuchKey = _s3_error("NoSuchKey", 404, "The specified key does not exist.")
NoSuchUpload = _s3_error(
    "NoSuchUpload",
    404,
    "The specified upload does not exist. The upload ID may be invalid, or the upload may have been aborted "
    "or completed.",
)
NotImplemented_ = _s3_error(
    "NotImplemented", 501, "A header or operation you provided implies functionality that is not implemented."
)
PreconditionFailed = _s3_error(
    "PreconditionFailed", 412, "At least one of the pre-conditions you specified did not hold"
)
RequestTimeTooSkewed = _s3_error(
    "RequestTimeTooSkewed", 403, "The difference between the request time and the server's time is too large."
)
ServiceUnavailable = _s3_error("ServiceUnavailable", 503, "Please reduce your request rate.")
SignatureDoesNotMatch = _s3_error(
    "SignatureDoesNotMatch",
    403,
    "The request signature we calculated does not match the signature you provided. "
    "Check your key and signing method.",
)
SlowDown = _s3_error("SlowDown", 503, "Please reduce your request rate.")
XAmzContentSHA256Mismatch = _s3_error(
    "XAmzContentSHA256Mismatch",
    400,
    "The provided 'x-amz-content-sha256' header does not match what was computed.",
)
BadRequest = _s3_error("BadRequest", 400, "Bad Request")
InvalidChunkSizeError = _s3_error(
    "InvalidChunkSizeError", 403, "Only the last chunk is allowed to have a size less than 8192 bytes"
)
RequestHeaderSectionTooLarge = _s3_error(
    "RequestHeaderSectionTooLarge", 400, "Your request header section exceeds the maximum allowed size."
)
RequestTimeout = _s3_error(
    "RequestTimeout",
    400,
    "Your socket connection to the server was not read from or written to within the timeout period.",
)
InvalidChecksum = _s3_error(
    "InvalidRequest", 400, "Value for x-amz-checksum does not match the calculated checksum."
)


class FormatError(TsproxyError):
    """Stored data is not what the format says: tampered, truncated, or of an unknown version."""


class IntegrityError(FormatError):
    """A chunk, the manifest or the trailer failed authentication or a length/checksum check."""


class KeyNotFound(TsproxyError):
    """An object's DEK is wrapped by a KEK that is not on the key ring."""


class KeyRingError(TsproxyError):
    """The key ring file is missing, malformed, or an operation on it is not allowed."""


class ConfigError(TsproxyError):
    """Configuration is invalid; the message says what and where, in one line."""
