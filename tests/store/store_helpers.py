"""Shared by the storage tests: a reference model of S3 listings and strategies for listing cases."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def utf8(key: str) -> bytes:
    return key.encode("utf-8")


def s3_listing(
    keys: set[str], prefix: str, delimiter: str | None, start_after: str | None
) -> list[tuple[str, str]]:
    """What S3 lists, all pages together: ("k", key) and ("p", common prefix), in order.

    Keys in UTF-8 byte order that start with `prefix` and sort after `start_after`; with a delimiter,
    keys with the delimiter after the prefix roll up into one common prefix each, placed where the
    first of them would be.
    """
    entries: list[tuple[str, str]] = []
    for key in sorted(keys, key=utf8):
        if not key.startswith(prefix) or (start_after and utf8(key) <= utf8(start_after)):
            continue
        at = key.find(delimiter, len(prefix)) if delimiter else -1
        if delimiter and at >= 0:
            common = key[: at + len(delimiter)]
            if ("p", common) not in entries:
                entries.append(("p", common))
        else:
            entries.append(("k", key))
    return entries


ALPHABET = ["a", "b", "/", ".", "%", "-", "é", "\U0001f600"]
# Keys made of a few shared path segments, so that listings have directories, groups and siblings
# that sort between a name and its "/" ("a-b" between "a" and "a/b"), or of loose characters.
SEGMENTS = ["a", "b", "", ".", "a-b", "é", "\U0001f600", "%"]
key_st = st.one_of(
    st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=4).map("/".join).filter(bool),
    st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=6).map("".join),
)
keys_st = st.sets(key_st, max_size=25)
text_st = st.lists(st.sampled_from(ALPHABET), max_size=3).map("".join)


@st.composite
def listing_cases(draw: Any, keys: st.SearchStrategy[set[str]] = keys_st) -> tuple[set[str], str, str | None]:
    """Keys, a prefix that usually selects some of them, and a start-after that usually lands among them."""
    chosen = draw(keys)
    candidates = sorted(chosen)
    if candidates and draw(st.booleans()):
        key = draw(st.sampled_from(candidates))
        prefix = key[: draw(st.integers(0, len(key)))]
    else:
        prefix = draw(st.sampled_from(["", "", "a", "a/", "b/", "é"]))
    if candidates and draw(st.booleans()):
        start_after: str | None = draw(st.sampled_from(candidates))
    else:
        start_after = draw(st.one_of(st.none(), text_st.filter(bool)))
    return chosen, prefix, start_after
