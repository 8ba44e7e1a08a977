"""The key mapping, pure: injective, reversible, never inside the reserved namespace, fold-proof."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from tsproxy.service import paging
from tsproxy.service.namespace import ESCAPED, INTERNAL, Namespace, backend_name, client_name, stored_as_is

# Keys built from the pieces that trip backends up: slashes, dots, percent signs, the reserved names.
PIECES = ["/", "//", ".", "..", "%", "%2F", "%25", ".tsproxy", ".tsproxy/", ".tsproxy~", "a", "é", "mpu", "~"]
keys = st.lists(st.sampled_from(PIECES) | st.text(min_size=1, max_size=3), min_size=1, max_size=8).map(
    "".join
)


def _folded(name: str) -> str:
    """What a backend that folds slashes and resolves dot segments might make of a key."""
    parts: list[str] = []
    for segment in re.sub("/+", "/", name).lstrip("/").split("/"):
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


def test_internal_state_and_unreachable_names_have_no_client_key() -> None:
    ns = Namespace("shared", "p/")
    assert ns.client_key("b", ns.internal("b", "mpu/1/state").key) is None
    assert ns.client_key("b", "p/b/" + ESCAPED + "%2") is None  # not an output of the mapping
    assert ns.client_key("b", "p/b//raw") is None  # written past tsproxy, unreachable through it
    assert ns.client_key("b", ns.object("b", ".tsproxy/mpu/1/state").key) == ".tsproxy/mpu/1/state"
    assert stored_as_is("topic-0/00000000000000000000-abc.log")


@given(
    st.lists(keys, min_size=1, max_size=40, unique=True), st.integers(1, 7), st.sampled_from(["", "a", "/"])
)
def test_merged_paging_lists_every_key_once_in_order(
    all_keys: list[str], page_size: int, prefix: str
) -> None:
    """Plain keys come from a sorted backend range, escaped ones from elsewhere; pages merge them."""
    wanted = sorted((k for k in all_keys if k.startswith(prefix)), key=paging.order)
    plain_all = sorted((k for k in wanted if stored_as_is(k)), key=paging.order)
    escaped_all = [k for k in wanted if not stored_as_is(k)]
    seen: list[str] = []
    token: str | None = None
    for _ in range(200):
        cursor = paging.parse_token(token)
        after = cursor.after
        rest = [k for k in plain_all if after is None or paging.sorts_after(k, after)]
        plain = paging.Page([(k, k) for k in rest[:page_size]], [], len(rest) > page_size, None)
        plain = paging.Page(
            plain.objects, [], plain.truncated, rest[page_size - 1] if plain.truncated else None
        )
        escaped = sorted(
            ((k, k) for k in escaped_all if after is None or paging.sorts_after(k, after)),
            key=lambda kv: paging.order(kv[0]),
        )
        merged = paging.merge(plain, escaped, prefix, None, page_size)
        seen += [k for k, _ in merged.objects]
        if not merged.truncated:
            break
        token = merged.token
    assert seen == wanted
