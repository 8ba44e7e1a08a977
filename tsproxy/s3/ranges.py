"""Range requests, conditional requests and S3's date formats, as S3 does them.

Range (RFC 9110 section 14, as S3 applies it): one byte range, `bytes=a-b`, `bytes=a-` or `bytes=-n`.
S3 serves no multipart/byteranges: a header naming several ranges is ignored and the whole object sent
(200), as is a header that does not parse (other unit, `b < a`, junk). A range that parses but lies
wholly outside the object is 416 InvalidRange; a last byte past the end is clipped.

Preconditions (RFC 9110 section 13.2.2 order, which is what S3 documents): If-Match, else
If-Unmodified-Since -> 412; then If-None-Match, else If-Modified-Since -> 304 on GET/HEAD, 412 on other
methods (so `x-amz-copy-source-if-*` and conditional writes share the same rules).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import format_datetime, parsedate_to_datetime

from tsproxy import errors

_SPEC = re.compile(r"([0-9]*)-([0-9]*)")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The inclusive byte span (first, last) a Range header asks for in an object of `size` bytes.

    None when there is no header or S3 would ignore it (the whole object is then served with 200).
    Raises InvalidRange (416) when the range cannot be satisfied.
    """
    if header is None:
        return None
    unit, eq, spec = header.strip().partition("=")
    if not eq or unit.strip().lower() != "bytes":
        return None
    spec = spec.strip()
    match = _SPEC.fullmatch(spec)
    if match is None or spec == "-":
        return None  # several ranges, or not a byte-range-spec at all
    first_s, last_s = match.groups()
    try:
        first = int(first_s) if first_s else None
        last = int(last_s) if last_s else None
    except ValueError:  # more digits than int() will take
        return None
    if first is None:
        assert last is not None
        if last == 0 or size == 0:
            raise _unsatisfiable(header, size)
        return max(0, size - last), size - 1
    if last is not None and last < first:
        return None
    if first >= size:
        raise _unsatisfiable(header, size)
    return first, size - 1 if last is None else min(last, size - 1)


# What `span_from_start` says of `bytes=0-`: to the object's end, whatever its size.
TO_THE_END = 1 << 62


def span_from_start(header: str | None) -> int | None:
    """How many bytes from an object's first a Range header asks for, known before the object's size
    is: `b + 1` for `bytes=0-b`, TO_THE_END for `bytes=0-`, None for every other header (or none).
    For reading ahead only: `parse_range` says what is served."""
    if header is None:
        return None
    unit, eq, spec = header.strip().partition("=")
    match = _SPEC.fullmatch(spec.strip()) if eq and unit.strip().lower() == "bytes" else None
    if match is None or match.group(1) == "" or len(match.group(1)) > 18 or len(match.group(2)) > 18:
        return None
    first_s, last_s = match.groups()
    if int(first_s) != 0:
        return None
    return TO_THE_END if not last_s else int(last_s) + 1


def _unsatisfiable(header: str, size: int) -> errors.S3Error:
    return errors.InvalidRange(RangeRequested=header.strip(), ActualObjectSize=str(size))


def content_range(first: int, last: int, size: int) -> str:
    """The Content-Range value of a 206 response."""
    return f"bytes {first}-{last}/{size}"


def unsatisfied_range(size: int) -> str:
    """The Content-Range value that goes with a 416 response."""
    return f"bytes */{size}"


# -- conditional requests --------------------------------------------------------------------------


def _etags(value: str) -> list[str]:
    tags = []
    for item in value.split(","):
        tag = item.strip()
        if tag.startswith("W/"):
            tag = tag[2:]
        tags.append(tag.strip('"'))
    return [t for t in tags if t]


def _matches(value: str, etag: str) -> bool:
    tags = _etags(value)
    return "*" in tags or etag.strip('"') in tags


def _http_time(value: str) -> datetime | None:
    try:
        parsed = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _seconds(dt: datetime) -> datetime:
    # HTTP dates carry whole seconds; compare at that precision or every object looks modified.
    dt = dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)
    return dt.replace(microsecond=0)


def check_preconditions(
    headers: Mapping[str, str],
    etag: str,
    last_modified: datetime,
    *,
    method: str,
    now: datetime | None = None,
) -> int | None:
    """Evaluate If-Match, If-None-Match, If-Modified-Since and If-Unmodified-Since against an object.

    Returns 304 when a GET or HEAD should answer Not Modified, None when the request proceeds; raises
    PreconditionFailed (412) otherwise. `headers` may be any mapping; names are matched case-insensitively.
    Unparseable dates are ignored, as is an If-Modified-Since later than `now` (when given).
    """
    h = {name.lower(): value for name, value in headers.items()}
    modified = _seconds(last_modified)
    reading = method.upper() in ("GET", "HEAD")

    if_match = h.get("if-match")
    if if_match is not None:
        if not _matches(if_match, etag):
            raise errors.PreconditionFailed(Condition="If-Match")
    elif "if-unmodified-since" in h:
        since = _http_time(h["if-unmodified-since"])
        if since is not None and modified > since:
            raise errors.PreconditionFailed(Condition="If-Unmodified-Since")

    if_none_match = h.get("if-none-match")
    if if_none_match is not None:
        if _matches(if_none_match, etag):
            if reading:
                return 304
            raise errors.PreconditionFailed(Condition="If-None-Match")
    elif "if-modified-since" in h:
        since = _http_time(h["if-modified-since"])
        if since is not None and (now is None or since <= now) and modified <= since:
            if reading:
                return 304
            raise errors.PreconditionFailed(Condition="If-Modified-Since")
    return None


# -- S3's date formats -------------------------------------------------------------------------------


def http_date(dt: datetime) -> str:
    """RFC 7231 IMF-fixdate, as in Last-Modified: ``Wed, 21 Oct 2015 07:28:00 GMT``."""
    return format_datetime(_seconds(dt), usegmt=True)


def iso8601(dt: datetime) -> str:
    """The timestamp form of S3's XML: ``2015-10-21T07:28:00.000Z`` (UTC, milliseconds)."""
    if dt.tzinfo is not UTC:
        dt = dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)
    return dt.isoformat(timespec="milliseconds")[:-6] + "Z"  # "+00:00" -> "Z"
