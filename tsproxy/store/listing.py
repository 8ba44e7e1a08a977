"""ListObjectsV2 semantics over any ordered stream of keys, without I/O.

A backend supplies a *walk*: a generator of `(key, item)` in S3 order (code-point order of the key,
which is the order of its UTF-8 bytes) restricted to a prefix. `paginate` applies delimiter grouping,
StartAfter, continuation tokens and MaxKeys exactly as S3 does. The walk may consult the shared
`Cursor` to prune whole subtrees that can no longer contribute, e.g. a directory whose keys all roll
up into a common prefix already returned.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from tsproxy import errors

T = TypeVar("T")


@dataclass
class Cursor:
    """Which keys the listing still wants; updated by `paginate` as it goes."""

    prefix: str = ""
    after: str | None = None  # only keys strictly greater
    skip: str | None = None  # no keys starting with this (a common prefix already returned)

    def admits(self, key: str) -> bool:
        """Whether `key` would be listed."""
        if not key.startswith(self.prefix):
            return False
        if self.after is not None and key <= self.after:
            return False
        return not (self.skip is not None and key.startswith(self.skip))

    def admits_subtree(self, sub: str) -> bool:
        """Whether any key starting with `sub` could still be listed (False: prune it)."""
        if not (sub.startswith(self.prefix) or self.prefix.startswith(sub)):
            return False
        if self.skip is not None and sub.startswith(self.skip):
            return False
        # Every key under `sub` sorts below `after` unless `after` itself lies under `sub`.
        return self.after is None or self.after.startswith(sub) or sub > self.after


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    common_prefixes: list[str]
    is_truncated: bool
    next_token: str | None


def encode_token(marker: str, is_prefix: bool) -> str:
    """An opaque continuation token: the last key (or common prefix) returned."""
    raw = (b"p" if is_prefix else b"k") + marker.encode("utf-8", "surrogatepass")
    return base64.urlsafe_b64encode(raw).decode("ascii")


def decode_token(token: str) -> tuple[str, bool]:
    """(marker, is_prefix) from a token made by `encode_token`; InvalidArgument for anything else."""
    try:
        raw = base64.urlsafe_b64decode(token.encode("ascii"))
        kind, marker = raw[:1], raw[1:].decode("utf-8", "surrogatepass")
    except (binascii.Error, UnicodeError, ValueError):
        raw, kind, marker = b"", b"", ""
    if kind not in (b"k", b"p") or not marker:
        raise errors.InvalidArgument(
            "The continuation token provided is incorrect", ArgumentName="continuation-token"
        )
    return marker, kind == b"p"


def paginate(
    walk: Callable[[Cursor], Iterator[tuple[str, T]]],
    *,
    prefix: str = "",
    delimiter: str | None = None,
    start_after: str | None = None,
    token: str | None = None,
    max_keys: int = 1000,
) -> Page[T]:
    """One page of a listing: the items of listed keys, the common prefixes, and where to go on.

    A continuation token takes precedence over `start_after`, as in S3.
    """
    if max_keys < 0:
        raise errors.InvalidArgument("max-keys cannot be negative", ArgumentName="max-keys")
    cursor = Cursor(prefix=prefix)
    if token is not None:
        marker, is_prefix = decode_token(token)
        cursor.after = marker
        cursor.skip = marker if is_prefix else None
    elif start_after:
        cursor.after = start_after
    items: list[T] = []
    prefixes: list[str] = []
    last: tuple[str, bool] | None = None
    truncated = False
    if max_keys == 0:
        return Page(items, prefixes, False, None)
    for key, item in walk(cursor):
        if not cursor.admits(key):
            continue
        if len(items) + len(prefixes) >= max_keys:
            truncated = True
            break
        at = key.find(delimiter, len(prefix)) if delimiter else -1
        if delimiter and at >= 0:
            common = key[: at + len(delimiter)]
            prefixes.append(common)
            last = (common, True)
            # Everything else under this common prefix is already accounted for.
            cursor.after, cursor.skip = common, common
            continue
        items.append(item)
        last = (key, False)
        cursor.after = key
    next_token = encode_token(*last) if truncated and last is not None else None
    return Page(items, prefixes, truncated, next_token)
