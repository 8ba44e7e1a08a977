"""The pure parts of the storage layer: listing rules, ranges, ETags, names, error mapping, backoff."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from typing import Any

import botocore.exceptions
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.store.store_helpers import key_st, keys_st, listing_cases, s3_listing, text_st, utf8
from tsproxy import errors
from tsproxy.store import listing, localnames, s3errors
from tsproxy.store.base import (
    StoreFault,
    check_part_list,
    multipart_etag,
    normalize_metadata,
    range_header,
    resolve_range,
    unquote_etag,
)
from tsproxy.store.retry import Backoff


def in_memory_walk(keys: set[str]) -> Any:
    ordered = sorted(keys, key=utf8)

    def walk(cursor: listing.Cursor) -> Iterator[tuple[str, str]]:
        for key in ordered:
            if cursor.admits(key):
                yield key, key

    return walk


# -- listing ------------------------------------------------------------------------------------------


def paged_listing(
    keys: set[str], prefix: str, delimiter: str | None, start_after: str | None, max_keys: int
) -> list[tuple[str, str]]:
    """All pages of `paginate` over an in-memory walk, checking each page's own promises."""
    walk = in_memory_walk(keys)
    entries: list[tuple[str, str]] = []
    token = None
    for _ in range(len(keys) + 2):
        page = listing.paginate(
            walk, prefix=prefix, delimiter=delimiter, start_after=start_after, token=token, max_keys=max_keys
        )
        assert len(page.items) + len(page.common_prefixes) <= max_keys
        merged = [("k", k) for k in page.items] + [("p", p) for p in page.common_prefixes]
        entries += sorted(merged, key=lambda e: utf8(e[1]))
        if not page.is_truncated:
            assert page.next_token is None
            return entries
        token = page.next_token
    pytest.fail("pagination did not end")


@settings(max_examples=300)
@given(
    case=listing_cases(keys_st),
    delimiter=st.sampled_from([None, "/", "/", "a", "//", "-."]),
    max_keys=st.integers(1, 6),
)
def test_paginate_matches_s3(
    case: tuple[set[str], str, str | None], delimiter: str | None, max_keys: int
) -> None:
    keys, prefix, start_after = case
    expected = s3_listing(keys, prefix, delimiter, start_after)
    assert paged_listing(keys, prefix, delimiter, start_after, max_keys) == expected
    assert paged_listing(keys, prefix, delimiter, start_after, 1000) == expected


@given(
    keys=keys_st,
    prefix=text_st,
    after=st.one_of(st.none(), key_st),
    skip=st.one_of(st.none(), key_st),
    sub=key_st,
)
def test_pruned_subtrees_hold_nothing_admitted(
    keys: set[str], prefix: str, after: str | None, skip: str | None, sub: str
) -> None:
    cursor = listing.Cursor(prefix=prefix, after=after, skip=skip)
    if not cursor.admits_subtree(sub):
        assert not any(cursor.admits(k) for k in keys if k.startswith(sub))
        assert not cursor.admits(sub + "x") and not cursor.admits(sub + "\U0001f600")


def test_max_keys_zero_and_bad_tokens() -> None:
    walk = in_memory_walk({"a", "b"})
    page = listing.paginate(walk, max_keys=0)
    assert page.items == [] and not page.is_truncated
    for bad in ("not base64!", "", listing.encode_token("x", False)[:-2] + "@@", "eA=="):
        with pytest.raises(errors.InvalidArgument):
            listing.paginate(walk, token=bad)
    with pytest.raises(errors.InvalidArgument):
        listing.paginate(walk, max_keys=-1)


def test_token_takes_precedence_over_start_after() -> None:
    walk = in_memory_walk({"a", "b", "c", "d"})
    first = listing.paginate(walk, max_keys=2)
    assert first.items == ["a", "b"] and first.next_token
    second = listing.paginate(walk, token=first.next_token, start_after="c", max_keys=2)
    assert second.items == ["c", "d"]


# -- local names --------------------------------------------------------------------------------------


@given(st.text(min_size=0, max_size=80))
def test_segment_names_round_trip_and_are_safe(segment: str) -> None:
    try:
        segment.encode("utf-8")
    except UnicodeEncodeError:
        return  # keys are checked to be UTF-8 before they get here
    for kind in (localnames.OBJECT, localnames.DIRECTORY):
        name = localnames.segment_name(segment, kind)
        assert name not in ("", ".", "..") and "/" not in name and "\x00" not in name
        assert not name.startswith(".") and len(name.encode()) <= 255
        parsed = localnames.parse_name(name)
        assert parsed is not None and parsed[0] == kind
        assert parsed[1] in (segment, None)


def test_long_segments_are_hashed() -> None:
    name = localnames.segment_name("x" * 500, localnames.DIRECTORY)
    assert name == "D" + hashlib.sha256(b"x" * 500).hexdigest()
    assert localnames.parse_name(name) == (localnames.DIRECTORY, None)


@given(st.sets(key_st, max_size=30))
def test_depth_first_walk_by_sort_key_is_s3_order(keys: set[str]) -> None:
    tree: dict[Any, Any] = {}
    for key in keys:
        node = tree
        *dirs, last = key.split("/")
        for d in dirs:
            node = node.setdefault(("d", d), {})
        node[("o", last)] = key

    def walk(node: dict[Any, Any]) -> Iterator[str]:
        for (kind, _segment), child in sorted(node.items(), key=lambda kv: localnames.sort_key(*kv[0])):
            if kind == "d":
                yield from walk(child)
            else:
                yield child

    assert list(walk(tree)) == sorted(keys, key=utf8)


def test_bucket_names() -> None:
    for good in ("abc", "my-bucket.1", "a" * 63, "t-0123456789abcdef"):
        assert localnames.valid_bucket_name(good)
    for bad in (
        "ab",
        "a" * 64,
        "Abc",
        "a..b",
        "a.-b",
        "-ab",
        "ab-",
        "192.168.1.1",
        "xn--abc",
        "a_b",
        "../x",
        "a/b",
    ):
        assert not localnames.valid_bucket_name(bad)


# -- ranges, ETags, parts ----------------------------------------------------------------------------


@given(
    size=st.integers(0, 2000), first=st.integers(-2500, 2500), last=st.one_of(st.none(), st.integers(0, 2500))
)
def test_resolve_range_serves_what_s3_serves(size: int, first: int, last: int | None) -> None:
    if first < 0 and last is not None:
        last = None
    if last is not None and first >= 0 and last < first:
        with pytest.raises(ValueError):
            resolve_range(size, first, last)
        return
    data = bytes(range(256)) * 8
    data = data[:size]
    if size == 0 or (first >= 0 and first >= size):
        with pytest.raises(errors.InvalidRange):
            resolve_range(size, first, last)
        return
    start, stop = resolve_range(size, first, last) or (0, size - 1)
    if first < 0:
        expected = data[first:] if -first <= size else data
    else:
        expected = data[first : None if last is None else last + 1]
    assert data[start : stop + 1] == expected and 0 <= start <= stop < size


def test_range_headers() -> None:
    assert range_header(None, None) is None
    assert range_header(0, 9) == "bytes=0-9"
    assert range_header(5, None) == "bytes=5-"
    assert range_header(-100, None) == "bytes=-100"
    with pytest.raises(ValueError):
        range_header(None, 5)
    with pytest.raises(ValueError):
        range_header(-5, 10)


def test_multipart_etag_is_md5_of_part_md5s() -> None:
    parts = [b"a" * 10, b"b" * 20]
    md5s = [hashlib.md5(p).hexdigest() for p in parts]
    expected = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + "-2"
    assert multipart_etag(md5s) == expected
    assert multipart_etag([f'"{m}"' for m in md5s]) == expected
    with pytest.raises(errors.InvalidPart):
        multipart_etag(["not-hex"])


def test_part_list_rules() -> None:
    check_part_list([(1, "a"), (3, "b")])
    with pytest.raises(errors.InvalidPartOrder):
        check_part_list([(2, "a"), (1, "b")])
    with pytest.raises(errors.InvalidPartOrder):
        check_part_list([(1, "a"), (1, "b")])
    with pytest.raises(errors.MalformedXML):
        check_part_list([])
    with pytest.raises(errors.InvalidArgument):
        check_part_list([(0, "a")])
    with pytest.raises(errors.InvalidArgument):
        check_part_list([(10_001, "a")])


def test_small_helpers() -> None:
    assert (
        unquote_etag('"abc"') == "abc" and unquote_etag('W/"abc"') == "abc" and unquote_etag("abc") == "abc"
    )
    assert normalize_metadata({"X-Amz-Meta-Foo": "1", "Bar": "2"}) == {"foo": "1", "bar": "2"}
    assert normalize_metadata(None) == {}


# -- S3 error mapping and retry policy ---------------------------------------------------------------


def client_error(code: str, status: int, message: str = "m") -> botocore.exceptions.ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return botocore.exceptions.ClientError(response, "Op")


@pytest.mark.parametrize(
    ("code", "status", "expected", "retryable"),
    [
        ("NoSuchKey", 404, errors.NoSuchKey, False),
        ("NoSuchBucket", 404, errors.NoSuchBucket, False),
        ("NoSuchUpload", 404, errors.NoSuchUpload, False),
        ("EntityTooSmall", 400, errors.EntityTooSmall, False),
        ("InvalidPart", 400, errors.InvalidPart, False),
        ("PreconditionFailed", 412, errors.PreconditionFailed, False),
        ("InvalidRange", 416, errors.InvalidRange, False),
        ("AccessDenied", 403, errors.AccessDenied, False),
        ("BucketNotEmpty", 409, errors.BucketNotEmpty, False),
        ("BucketAlreadyOwnedByYou", 409, errors.BucketAlreadyOwnedByYou, False),
        ("BucketAlreadyExists", 409, s3errors.BucketAlreadyExists, False),
        ("SlowDown", 503, errors.SlowDown, True),
        ("ServiceUnavailable", 503, errors.ServiceUnavailable, True),
        ("InternalError", 500, StoreFault, True),  # the store does not serve: its health counts it
        ("Throttling", 400, errors.SlowDown, True),
        ("404", 404, errors.NoSuchKey, False),  # HEAD: a status and no body
        ("403", 403, errors.AccessDenied, False),
        ("412", 412, errors.PreconditionFailed, False),
        ("503", 503, errors.ServiceUnavailable, True),
        ("500", 500, StoreFault, True),
        ("502", 502, StoreFault, True),
        ("504", 504, StoreFault, True),
        ("GatewayTimeout", 504, StoreFault, True),
        ("NotImplemented", 501, errors.NotImplemented_, False),  # an answer: the store lacks a feature
        ("SignatureDoesNotMatch", 403, s3errors.BackendRefused, False),  # tsproxy's keys, not the client's
        ("InvalidAccessKeyId", 403, s3errors.BackendRefused, False),
    ],
)
def test_client_errors_map_to_s3_errors(
    code: str, status: int, expected: type[errors.S3Error], retryable: bool
) -> None:
    error = client_error(code, status)
    mapped = s3errors.to_s3_error(error, Key="k")
    assert type(mapped) is expected
    assert mapped.status == (expected.status if expected is not s3errors.BackendError else status)
    assert s3errors.is_retryable(error) is retryable


def test_unknown_codes_keep_code_and_status() -> None:
    mapped = s3errors.to_s3_error(client_error("InvalidStorageClass", 400, "bad class"))
    assert isinstance(mapped, s3errors.BackendError)
    assert (mapped.code, mapped.status, mapped.message) == ("InvalidStorageClass", 400, "bad class")
    weird = s3errors.to_s3_error(client_error("Weird", 507))
    assert isinstance(weird, StoreFault) and (weird.status, weird.answer) == (500, "507 Weird")
    assert (
        type(s3errors.to_s3_error(client_error("404", 404), not_found=errors.NoSuchBucket))
        is errors.NoSuchBucket
    )


def test_connection_errors_are_retryable_and_map_to_service_unavailable() -> None:
    for error in (
        botocore.exceptions.EndpointConnectionError(endpoint_url="http://x"),
        botocore.exceptions.ConnectionClosedError(endpoint_url="http://x"),
        botocore.exceptions.ReadTimeoutError(endpoint_url="http://x"),
        ConnectionResetError(),
    ):
        assert s3errors.is_retryable(error)
        assert type(s3errors.to_s3_error(error)) is errors.ServiceUnavailable
    assert not s3errors.is_retryable(ValueError("bug"))
    assert type(s3errors.to_s3_error(ValueError("bug"))) is errors.InternalError


def test_backoff_is_bounded_full_jitter() -> None:
    backoff = Backoff(max_attempts=4, base=0.1, cap=0.5, rng=random.Random(1))
    for attempt, ceiling in ((1, 0.1), (2, 0.2), (3, 0.4), (4, 0.5), (50, 0.5)):
        delays = [backoff.delay(attempt) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.8  # jitter spreads over the whole window
    assert backoff.allows_another(3) and not backoff.allows_another(4)
    with pytest.raises(ValueError):
        Backoff(max_attempts=0)


def test_backoff_after_slowdown_waits_longer_and_never_nothing() -> None:
    backoff = Backoff(max_attempts=4, base=0.1, cap=2.0, rng=random.Random(2))
    for attempt, ceiling in ((1, 0.5), (2, 1.0), (3, 2.0), (9, 2.0)):
        delays = [backoff.delay(attempt, throttled=True) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), attempt
        assert max(delays) > ceiling * 0.9
    with pytest.raises(ValueError):
        Backoff(throttle_factor=0.5)


def test_throttling_answers_are_told_apart_from_other_retryable_ones() -> None:
    def client_error(code: str, status: int) -> botocore.exceptions.ClientError:
        answer: Any = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
        return botocore.exceptions.ClientError(answer, "GetObject")

    for code, status in (("SlowDown", 503), ("Throttling", 400), ("TooManyRequests", 429), ("429", 429)):
        assert s3errors.is_throttling(client_error(code, status)) and s3errors.is_retryable(
            client_error(code, status)
        )
    for code, status in (("InternalError", 500), ("ServiceUnavailable", 503), ("503", 503)):
        assert not s3errors.is_throttling(client_error(code, status))
    assert s3errors.is_throttling(errors.SlowDown())
    assert not s3errors.is_throttling(ConnectionResetError())
