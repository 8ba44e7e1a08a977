"""Range parsing against a model (Python slicing), S3's edge cases, conditional requests, date formats."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from tsproxy import errors
from tsproxy.s3 import ranges
from tsproxy.s3.ranges import (
    check_preconditions,
    content_range,
    http_date,
    iso8601,
    parse_range,
    unsatisfied_range,
)

# -- Range -------------------------------------------------------------------------------------------


def model(kind: str, a: int, b: int, data: bytes) -> bytes | None:
    """What the client should receive, by Python slicing; None when S3 answers 416."""
    size = len(data)
    if kind == "closed":
        return data[a : b + 1] if a < size else None
    if kind == "open":
        return data[a:] if a < size else None
    return data[-a:] if a > 0 and size > 0 else None  # suffix: the last a bytes


@given(
    size=st.integers(0, 300),
    kind=st.sampled_from(["closed", "open", "suffix"]),
    a=st.integers(0, 400),
    length=st.integers(0, 400),
)
def test_single_ranges_match_the_slicing_model(size: int, kind: str, a: int, length: int) -> None:
    data = bytes(i % 256 for i in range(size))
    b = a + length
    header = {"closed": f"bytes={a}-{b}", "open": f"bytes={a}-", "suffix": f"bytes=-{a}"}[kind]
    expected = model(kind, a, b, data)
    if expected is None:
        with pytest.raises(errors.InvalidRange) as exc:
            parse_range(header, size)
        assert exc.value.status == 416 and exc.value.fields["ActualObjectSize"] == str(size)
        return
    span = parse_range(header, size)
    assert span is not None
    first, last = span
    assert 0 <= first <= last < size
    assert data[first : last + 1] == expected


@given(header=st.text(max_size=30), size=st.integers(0, 100))
def test_any_header_gives_a_valid_span_none_or_416(header: str, size: int) -> None:
    try:
        span = parse_range(header, size)
    except errors.InvalidRange:
        return
    if span is not None:
        assert 0 <= span[0] <= span[1] < size


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        (None, 10, None),
        ("", 10, None),
        ("bytes=0-0", 10, (0, 0)),
        ("bytes=9-9", 10, (9, 9)),
        ("bytes=0-", 10, (0, 9)),
        ("bytes=3-100", 10, (3, 9)),  # last byte past the end is clipped
        ("bytes=-3", 10, (7, 9)),
        ("bytes=-100", 10, (0, 9)),  # longer suffix than the object: all of it
        ("bytes=007-008", 10, (7, 8)),
        ("  bytes=1-2  ", 10, (1, 2)),
        ("Bytes=1-2", 10, (1, 2)),
        ("bytes=0-1,3-4", 10, None),  # several ranges: S3 sends the whole object
        ("bytes=0-1, 3-4", 10, None),
        ("bytes=5-3", 10, None),  # last < first: not a valid range, ignored
        ("items=0-1", 10, None),
        ("bytes=a-b", 10, None),
        ("bytes=-", 10, None),
        ("bytes=", 10, None),
        ("bytes 0-1", 10, None),
        ("bytes=1 -2", 10, None),
        ("bytes=٣-٤", 10, None),  # non-ASCII digits are not digits here
        ("bytes=0-" + "9" * 5000, 10, None),  # beyond what int() parses: ignored, not a crash
    ],
)
def test_range_edge_cases(header: str | None, size: int, expected: tuple[int, int] | None) -> None:
    assert parse_range(header, size) == expected


@pytest.mark.parametrize(
    ("header", "size"),
    [
        ("bytes=10-", 10),
        ("bytes=10-20", 10),
        ("bytes=-0", 10),
        ("bytes=0-0", 0),
        ("bytes=-5", 0),
        ("bytes=0-", 0),
    ],
)
def test_unsatisfiable_ranges(header: str, size: int) -> None:
    with pytest.raises(errors.InvalidRange) as exc:
        parse_range(header, size)
    assert (exc.value.code, exc.value.status) == ("InvalidRange", 416)
    assert exc.value.fields["RangeRequested"] == header


def test_content_range_values() -> None:
    assert content_range(0, 9, 10) == "bytes 0-9/10"
    assert content_range(5, 5, 1000) == "bytes 5-5/1000"
    assert unsatisfied_range(10) == "bytes */10"


# -- conditional requests -------------------------------------------------------------------------------

ETAG = "d41d8cd98f00b204e9800998ecf8427e"
MODIFIED = datetime(2024, 3, 1, 12, 0, 0, 500_000, tzinfo=UTC)  # sub-second part as stores keep it
AT = "Fri, 01 Mar 2024 12:00:00 GMT"
BEFORE = "Fri, 01 Mar 2024 11:59:59 GMT"
AFTER = "Fri, 01 Mar 2024 12:00:01 GMT"


def pre(headers: dict[str, str], method: str = "GET", now: datetime | None = None) -> int | str | None:
    try:
        return check_preconditions(CIMultiDict(headers), ETAG, MODIFIED, method=method, now=now)
    except errors.PreconditionFailed as e:
        assert e.status == 412
        return "412"


@pytest.mark.parametrize(
    ("headers", "get", "put"),
    [
        ({}, None, None),
        ({"If-Match": f'"{ETAG}"'}, None, None),
        ({"If-Match": ETAG}, None, None),
        ({"If-Match": '"other"'}, "412", "412"),
        ({"If-Match": f'"other", "{ETAG}"'}, None, None),
        ({"If-Match": "*"}, None, None),
        ({"If-None-Match": f'"{ETAG}"'}, 304, "412"),
        ({"If-None-Match": f'W/"{ETAG}"'}, 304, "412"),
        ({"If-None-Match": "*"}, 304, "412"),
        ({"If-None-Match": '"other"'}, None, None),
        ({"If-Modified-Since": AT}, 304, "412"),
        ({"If-Modified-Since": AFTER}, 304, "412"),
        ({"If-Modified-Since": BEFORE}, None, None),
        ({"If-Modified-Since": "garbage"}, None, None),
        ({"If-Unmodified-Since": AT}, None, None),
        ({"If-Unmodified-Since": BEFORE}, "412", "412"),
        ({"If-Unmodified-Since": "garbage"}, None, None),
        # S3: If-Match true and If-Unmodified-Since false -> 200.
        ({"If-Match": ETAG, "If-Unmodified-Since": BEFORE}, None, None),
        # S3: If-None-Match false and If-Modified-Since true -> 304.
        ({"If-None-Match": ETAG, "If-Modified-Since": BEFORE}, 304, "412"),
        # If-None-Match decides alone when present: a different ETag proceeds whatever the date says.
        ({"If-None-Match": '"other"', "If-Modified-Since": AFTER}, None, None),
        # 412 outranks 304.
        ({"If-Match": '"other"', "If-None-Match": ETAG}, "412", "412"),
        ({"if-none-match": ETAG}, 304, "412"),
    ],
)
def test_preconditions(headers: dict[str, str], get: int | str | None, put: int | str | None) -> None:
    assert pre(headers, "GET") == get
    assert pre(headers, "HEAD") == get
    assert pre(headers, "PUT") == put


def test_if_modified_since_in_the_future_is_ignored() -> None:
    future = "Sat, 01 Mar 2025 00:00:00 GMT"
    assert pre({"If-Modified-Since": future}) == 304
    assert pre({"If-Modified-Since": future}, now=datetime(2024, 6, 1, tzinfo=UTC)) is None


def test_preconditions_accept_plain_dicts_and_quoted_etags() -> None:
    assert check_preconditions({"IF-NONE-MATCH": ETAG}, f'"{ETAG}"', MODIFIED, method="get") == 304


# -- dates --------------------------------------------------------------------------------------------


def test_http_date() -> None:
    assert http_date(datetime(2015, 10, 21, 7, 28, 0, 999_999, tzinfo=UTC)) == "Wed, 21 Oct 2015 07:28:00 GMT"
    plus2 = timezone(timedelta(hours=2))
    assert http_date(datetime(2015, 10, 21, 9, 28, tzinfo=plus2)) == "Wed, 21 Oct 2015 07:28:00 GMT"
    assert http_date(datetime(2015, 10, 21, 7, 28)) == "Wed, 21 Oct 2015 07:28:00 GMT"


def test_iso8601() -> None:
    assert iso8601(datetime(2009, 10, 12, 17, 50, 30, 123_456, tzinfo=UTC)) == "2009-10-12T17:50:30.123Z"
    assert iso8601(datetime(2009, 10, 12, 17, 50, 30)) == "2009-10-12T17:50:30.000Z"
    minus5 = timezone(timedelta(hours=-5))
    assert iso8601(datetime(2009, 10, 12, 12, 50, 30, tzinfo=minus5)) == "2009-10-12T17:50:30.000Z"


@given(st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9999, 1, 1), timezones=st.just(UTC)))
def test_http_date_round_trips_through_the_precondition_parser(dt: datetime) -> None:
    # An If-Modified-Since equal to the Last-Modified we sent means "not modified".
    header = {"If-Modified-Since": http_date(dt)}
    assert check_preconditions(header, ETAG, dt, method="GET") == 304
    later = {"If-Modified-Since": http_date(dt - timedelta(seconds=1))}
    assert check_preconditions(later, ETAG, dt, method="GET") is None


@pytest.mark.parametrize(
    ("header", "span"),
    [
        ("bytes=0-1048575", 1 << 20),
        ("bytes=0-0", 1),
        (" Bytes = 0- ", ranges.TO_THE_END),
        ("bytes=0000-9", 10),
        ("bytes=1-9", None),  # not from the first byte
        ("bytes=-100", None),  # a suffix: where it starts depends on the size
        ("bytes=0-5,7-9", None),  # several ranges: S3 serves the whole object
        ("items=0-9", None),
        ("bytes=0-" + "9" * 40, None),  # more digits than any object has bytes
        (None, None),
    ],
)
def test_span_from_start_is_known_before_the_size(header: str | None, span: int | None) -> None:
    assert ranges.span_from_start(header) == span
    if span is not None and span != ranges.TO_THE_END:
        assert ranges.parse_range(header, 1 << 40) == (0, span - 1)  # what is served agrees
