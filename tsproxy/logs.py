"""JSON-lines logging: one object per line on stderr, a request id on every request line.

Secrets never reach a log line: the access log records the access key id, never the secret or the
signature, and `redact` strips credential-bearing query parameters from logged URLs.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_REDACTED_QUERY = ("X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token", "Signature")


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
    """Replace the values of signature and credential query parameters with '***'."""
    if not query:
        return query
    parts = []
    for item in query.split("&"):
        name = item.split("=", 1)[0]
        parts.append(f"{name}=***" if name in _REDACTED_QUERY else item)
    return "&".join(parts)
