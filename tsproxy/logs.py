"""JSON-lines logging: one object per line on stderr, a request id on every request line.

Secrets never reach a log line: the access log records the access key id, never the secret or the
signature, and `redact` strips credential-bearing query parameters from logged URLs however they are
spelled (percent-encoded, in any case, or inside another parameter's value).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any
from urllib.parse import unquote_plus

# Query parameters that carry a signature, a credential or a session token (SigV4 and SigV2), compared
# case-insensitively after percent-decoding.
_SECRET_PARAMS = frozenset(
    {
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
        "signature",
        "awsaccesskeyid",
        "authorization",
    }
)
# Any of them followed by '=' or ':' inside a decoded value (a URL or a header passed as a parameter).
_SECRET_INSIDE = re.compile(
    r"(?<![a-z0-9-])(x-amz-signature|x-amz-credential|x-amz-security-token|signature|credential"
    r"|awsaccesskeyid|authorization)\s*[=:]",
    re.IGNORECASE,
)


class JsonFormatter(logging.Formatter):
    """Render a record as one JSON object; `extra={"fields": {...}}` adds structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def setup(level: str = "info") -> None:
    """Send every tsproxy log line to stderr as JSON."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's own access log duplicates ours; botocore is chatty at debug.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("botocore").setLevel(logging.WARNING)
    logging.getLogger("aiobotocore").setLevel(logging.WARNING)


def redact(query: str) -> str:
    """The query string with the value of every secret-bearing parameter replaced by '***'.

    Names and values are percent-decoded (repeatedly, so a double encoding hides nothing) before they
    are compared, case-insensitively: `X-Amz-Signatur%65=...` is a signature as much as S3 reads it as
    one. A parameter whose decoded value holds such a name followed by '=' or ':' has its value
    replaced too. Other parameters are kept as they were sent.
    """
    if not query:
        return query
    parts = []
    for item in query.split("&"):
        decoded = _decode(item)
        name = decoded.partition("=")[0]
        if name.strip().lower() in _SECRET_PARAMS:
            parts.append(f"{name.strip()}=***")
        elif _SECRET_INSIDE.search(decoded):
            raw_name = item.split("=", 1)[0]
            safe_name = raw_name if not _SECRET_INSIDE.search(_decode(raw_name)) else "redacted"
            parts.append(f"{safe_name}=***")
        else:
            parts.append(item)
    return "&".join(parts)


def _decode(text: str) -> str:
    for _ in range(4):
        decoded = unquote_plus(text)
        if decoded == text:
            break
        text = decoded
    return text
