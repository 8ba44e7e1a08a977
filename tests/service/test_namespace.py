"""The key mapping, pure: injective, reversible, never inside the reserved namespace, fold-proof."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tsproxy import errors
from tsproxy.service import paging
from tsproxy.service.namespace import (
    ESCAPED,
    INTERNAL,
    RESERVED_START,
    Namespace,
    backend_name,
    client_name,
    prefix_reachable,
    shares_reserved_start,
    stored_as_is,
)

# Keys built from the pieces that trip backends up: slashes, dots, percent signs, the reserved names.
PIECES = [
    "/",
    "//",
    ".",
    "..",
    "%",
    "%2F",
    "%25",
    "%5C",
    ".tsproxy",
    ".tsproxy/",
    ".tsproxy~",
    "a",
    "é",
    "mpu",
    "~",
]
PIECES += ["\\", "\x00", "\\.."]
keys = st.lists(st.sampled_from(PIECES) | st.text(min_size=1, max_size=3), min_size=1, max_size=8).map(
    "".join
)


def _folded(name: str) -> str:
    """What a backend that folds backslashes and slashes and resolves dot segments might make of a key."""
    parts: list[str] = []
    for segment in re.sub("/+", "/", name.replace("\\", "/")).lstrip("/").split("/"):
        if segment == "..":
            if parts:
                parts.pop()
        elif segment != ".":
            parts.append(segment)
    return "/".join(parts)


@given(keys)
def test_every_key_maps_back_and_never_into_the_reserved_namespace(key: str) -> None:
    name = backend_name(key)
    assert client_name(name) == key
    assert not name.startswith(INTERNAL)
    # Nothing a backend folds: the name is its own folded form (apart from a trailing slash).
    assert _folded(name) == name.rstrip("/") or name.endswith("/")


@given(keys, keys)
def test_distinct_keys_stay_distinct_even_where_the_backend_folds(a: str, b: str) -> None:
    if a != b:
        assert backend_name(a) != backend_name(b)
        assert _folded(backend_name(a)) != _folded(backend_name(b)) or a.endswith("/") or b.endswith("/")


def test_the_three_keys_s3_keeps_apart() -> None:
    names = {backend_name(k) for k in ("/a", "a", "a//b", "a/b")}
    assert len(names) == 4
    assert backend_name("a") == "a" and backend_name("a/b") == "a/b"
    assert backend_name("/a") == ESCAPED + "%2Fa"
    assert backend_name("a//b") == ESCAPED + "a/%2Fb"
    assert backend_name("a/../b") == ESCAPED + "a/%2E%2E/b"


def test_backslashes_and_nul_are_escaped_and_nothing_else_moves() -> None:
    assert backend_name("\\.tsproxy/mpu/x/state") == ESCAPED + "%5C.tsproxy/mpu/x/state"
    assert backend_name("\\report.csv") == ESCAPED + "%5Creport.csv"
    assert backend_name("a\x00b") == ESCAPED + "a%00b"
    assert backend_name("/a\\b") == ESCAPED + "%2Fa%5Cb"
    # Keys stored as they are before keep their names; so do names escaped before.
    for key in ("a%5Cb", "topic/0/x.log", "a\tb", "é/ü", "a..b", "%"):
        assert backend_name(key) == key
    assert backend_name("/a%") == ESCAPED + "%2Fa%25"
    # An escaped name with `\\` left in it (as releases before wrote one) stands for no client key.
    assert client_name(ESCAPED + "%2Fa\\b") is None


def test_internal_state_and_unreachable_names_have_no_client_key() -> None:
    ns = Namespace("shared", "p/")
    assert ns.client_key("bkt", ns.internal("bkt", "mpu/1/state").key) is None
    assert ns.client_key("bkt", "p/bkt/" + ESCAPED + "%2") is None  # not an output of the mapping
    assert ns.client_key("bkt", "p/bkt//raw") is None  # written past tsproxy, unreachable through it
    assert ns.client_key("bkt", ns.object("bkt", ".tsproxy/mpu/1/state").key) == ".tsproxy/mpu/1/state"
    assert stored_as_is("topic-0/00000000000000000000-abc.log")


@given(keys, st.integers(0, 40))
def test_a_prefix_is_hidden_only_when_no_key_stored_as_it_is_lies_under_it(key: str, cut: int) -> None:
    """Every start of a key stored as it is may be shown as a common prefix; a prefix refused holds
    only escaped or reserved keys, whatever follows it."""
    start = key[: min(cut, len(key))]
    if stored_as_is(key):
        assert prefix_reachable(start) or not start
    if start and not prefix_reachable(start):
        assert not stored_as_is(key)


def test_prefixes_a_delimiter_cuts_from_the_reserved_name() -> None:
    starts = [RESERVED_START[:n] for n in range(1, 9)]
    assert [p for p in starts if shares_reserved_start(p)] == starts[:-1]  # all but `.tsproxy` itself
    assert not shares_reserved_start("") and not shares_reserved_start(".tsproxy")
    assert not shares_reserved_start("a.") and not shares_reserved_start(".tx")
    # `.` and `..` as the last, unfinished segment grow into keys (`.a`, `..b`); as a whole one, never.
    assert prefix_reachable(".") and prefix_reachable("a/..") and prefix_reachable("a/.")
    assert not prefix_reachable("./") and not prefix_reachable("a/../") and not prefix_reachable(".tsproxy")
    assert not prefix_reachable("/a") and not prefix_reachable("a//") and not prefix_reachable("a\\")


@given(
    st.lists(keys, min_size=1, max_size=40, unique=True),
    st.integers(1, 7),
    st.sampled_from(["", "a", "/"]),
    st.booleans(),
)
def test_merged_paging_lists_every_key_once(
    all_keys: list[str], page_size: int, prefix: str, backend_sorts: bool
) -> None:
    """Plain keys come from the backend's range (in its own order, by its tokens), escaped ones from
    elsewhere; merged pages list every key exactly once and end, whatever order the backend keeps."""
    wanted = [k for k in all_keys if k.startswith(prefix)]
    plain_all = [k for k in wanted if stored_as_is(k)]
    if backend_sorts:
        plain_all.sort(key=paging.order)
    escaped_all = sorted((k for k in wanted if not stored_as_is(k)), key=paging.order)
    seen: list[str] = []
    token: str | None = None
    for _ in range(500):
        cursor = paging.parse_token(token)
        plain = None
        if not cursor.plain_done:
            start = int(cursor.backend_token or 0)
            chunk = plain_all[start : start + page_size]
            truncated = start + page_size < len(plain_all)
            horizon = max(chunk, key=paging.order) if truncated and chunk else None
            next_token = str(start + page_size) if truncated else None
            plain = paging.Page([(k, k) for k in chunk], [], truncated, horizon, next_token)
        after = cursor.after
        escaped = [(k, k) for k in escaped_all if after is None or paging.sorts_after(k, after)]
        merged = paging.merge(plain, escaped, prefix, None, page_size, after)
        assert len(merged.objects) <= page_size
        page_keys = [k for k, _ in merged.objects]
        assert page_keys == sorted(page_keys, key=paging.order)
        seen += [k for k, _ in merged.objects]
        if not merged.truncated:
            break
        token = merged.token
    else:
        raise AssertionError("the listing never ended")
    assert sorted(seen, key=paging.order) == sorted(wanted, key=paging.order)
    assert len(seen) == len(set(seen))


def test_a_mapped_namespace_has_room_only_for_names_createbucket_takes() -> None:
    """`.tsproxy` would be the prefix of tsproxy's own objects; other refused names were never created."""
    ns = Namespace("shared", "p/")
    for name in (".tsproxy", "UPPER", "a_b", "...", "ab", "a..b", "192.168.0.1"):
        assert not ns.addressable(name)
        with pytest.raises(errors.NoSuchBucket):
            ns.root(name)
        with pytest.raises(errors.NoSuchBucket):
            ns.object(name, "k")
        with pytest.raises(errors.NoSuchBucket):
            ns.internal(name, "x")
    assert ns.addressable("tiered-storage") and ns.root("tiered-storage").key == "p/tiered-storage/"
    assert Namespace().addressable("UPPER") and Namespace().root("a_b").bucket == "a_b"  # the backend's
