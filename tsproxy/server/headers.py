"""Object headers between S3 and the stored object: what is kept, what is answered."""

from __future__ import annotations

from collections.abc import Mapping

from multidict import CIMultiDict

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
    h["Content-Type"] = obj.content_type or "binary/octet-stream"
    for name, value in obj.headers.items():
        if not name.startswith("x-amz-checksum-"):
            h[name] = value
    for name, value in obj.metadata.items():
        h["x-amz-meta-" + name] = value
    for param, header in RESPONSE_OVERRIDES.items():
        if param in query:
            h[header] = query[param]
    return h
