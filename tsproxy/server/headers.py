"""Object headers between S3 and the stored object: what is kept, what is answered."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping

from multidict import CIMultiDict

from tsproxy import errors
from tsproxy.s3 import ranges
from tsproxy.service import StoredObject

STORED_HEADERS = ("cache-control", "content-disposition", "content-encoding", "content-language", "expires")
RESPONSE_OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}


# What an HTTP header may not carry: CR and LF would end it (aiohttp refuses them), the other controls
# are not field content either. Tab is allowed.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def header_safe(value: str) -> str:
    """A stored value as a header can carry it: as it is, or, holding control characters, encoded as
    RFC 2047 (`=?UTF-8?B?...?=`), as S3 answers metadata it cannot send as it is."""
    if not _CONTROL.search(value):
        return value
    return "=?UTF-8?B?" + base64.b64encode(value.encode("utf-8", "surrogatepass")).decode() + "?="


def user_metadata(headers: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower.startswith("x-amz-meta-"):
            out[lower[len("x-amz-meta-") :]] = value
    return out


def stored_headers(headers: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for name in STORED_HEADERS:
        value = headers.get(name)
        if value is None:
            continue
        if name == "content-encoding":
            value = without_aws_chunked(value)
            if not value:
                continue
        out[name] = value
    return out


def without_aws_chunked(content_encoding: str) -> str:
    """A Content-Encoding as sent, less `aws-chunked`: that is the upload's framing, not an encoding of
    the object, and S3 drops it. The rest keeps its spelling (`deflate, gzip` stays `deflate, gzip`)."""
    items = content_encoding.split(",")
    kept = [item for item in items if item.strip().lower() != "aws-chunked"]
    if len(kept) == len(items):
        return content_encoding
    return ",".join(kept).strip()


def content_type(headers: Mapping[str, str]) -> str | None:
    return headers.get("Content-Type")


def object_headers(obj: StoredObject, query: Mapping[str, str]) -> CIMultiDict[str]:
    h: CIMultiDict[str] = CIMultiDict()
    h["ETag"] = f'"{obj.etag}"'
    h["Last-Modified"] = ranges.http_date(obj.last_modified)
    h["Accept-Ranges"] = "bytes"
    h["Content-Type"] = header_safe(obj.content_type or "binary/octet-stream")
    # What the backend holds is not trusted to be a header: names that are not tokens are left out,
    # values with control characters encoded (a CR or LF would make aiohttp refuse the whole answer).
    for name, value in obj.headers.items():
        if not name.startswith("x-amz-checksum-") and _TOKEN.fullmatch(name):
            h[name] = header_safe(value)
    for name, value in obj.metadata.items():
        if _TOKEN.fullmatch(name):
            h["x-amz-meta-" + name] = header_safe(value)
    for param, header in RESPONSE_OVERRIDES.items():
        if param in query:
            value = query[param]
            if _CONTROL.search(value):
                raise errors.InvalidArgument(
                    f"Header value for {param} contains a control character", ArgumentName=param
                )
            h[header] = value
    return h
