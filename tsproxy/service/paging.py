"""Paging a listing that merges two backend ranges: keys stored as they are, and escaped keys. Pure.

The backend lists keys stored as they are in client order already. Escaped keys (see namespace) live
under one prefix of their own, in another order, so a page of them is merged with a page of the plain
range by client key. The continuation token says which kind of listing goes on:

- `p<backend token>`: there were no escaped keys when the listing began; it goes on with the backend's
  own token and never looks for escaped keys again (a listing is not a snapshot in S3 either);
- `m<base64url of a client key>`: a merged listing, going on after that key.

Order is S3's: by the UTF-8 bytes of the key.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Generic, TypeVar

from tsproxy import errors

T = TypeVar("T")

# Appended to a common prefix to make a bound past every key under it (no UTF-8 byte is above 0xF4).
PAST_PREFIX = "\U0010ffff"


def order(key: str) -> bytes:
    """The sort key S3 lists by."""
    return key.encode("utf-8", "surrogatepass")


def sorts_after(key: str, bound: str) -> bool:
    return order(key) > order(bound)


def later(a: str | None, b: str | None) -> str | None:
    """The later of two optional start-after bounds."""
    if a is None or b is None:
        return a if b is None else b
    return a if sorts_after(a, b) else b


@dataclass(frozen=True)
class Cursor:
    """Where a listing goes on: a backend token, a client key to go on after, and which kind it is."""

    backend_token: str | None = None
    after: str | None = None
    merged: bool | None = None  # None: a first page, which looks for escaped keys


def parse_token(token: str | None) -> Cursor:
    """The cursor a continuation token stands for; InvalidArgument for one tsproxy did not give out."""
    if token is None:
        return Cursor()
    kind, body = token[:1], token[1:]
    if kind == "p" and body:
        return Cursor(backend_token=body, merged=False)
    if kind == "m" and body:
        try:
            after = base64.urlsafe_b64decode(body.encode("ascii") + b"=" * (-len(body) % 4))
            return Cursor(after=after.decode("utf-8", "surrogatepass"), merged=True)
        except (binascii.Error, UnicodeError, ValueError):
            pass
    raise errors.InvalidArgument(
        "The continuation token provided is incorrect", ArgumentName="continuation-token"
    )


def plain_token(backend_token: str | None) -> str | None:
    return f"p{backend_token}" if backend_token else None


def merged_token(after: str) -> str:
    encoded = base64.urlsafe_b64encode(after.encode("utf-8", "surrogatepass")).rstrip(b"=")
    return "m" + encoded.decode("ascii")


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of entries (client key, item) and common prefixes, in client order.

    `horizon` is the last name the backend page reached when it is truncated: nothing past it is known
    to be complete yet.
    """

    objects: list[tuple[str, T]]
    prefixes: list[str]
    truncated: bool
    horizon: str | None = None


@dataclass(frozen=True)
class Merged(Generic[T]):
    objects: list[tuple[str, T]]
    prefixes: list[str]
    truncated: bool
    token: str | None


def merge(
    plain: Page[T], escaped: list[tuple[str, T]], prefix: str, delimiter: str | None, max_keys: int
) -> Merged[T]:
    """Merge a plain page with escaped entries (client key order, already past the cursor).

    Escaped entries are rolled up under `delimiter` as S3 would; entries past the plain page's horizon
    wait for the next page, so the two ranges interleave correctly.
    """
    items: dict[str, tuple[str, T] | None] = {}  # client key or prefix -> entry (None for a prefix)
    for key, item in plain.objects:
        items[key] = (key, item)
    for p in plain.prefixes:
        items[p] = None
    for key, item in escaped:
        cut = key.find(delimiter, len(prefix)) if delimiter else -1
        if cut >= 0:
            items.setdefault(key[: cut + len(delimiter or "")], None)
        else:
            items[key] = (key, item)
    names = sorted(items, key=order)
    if plain.truncated and plain.horizon is not None:
        names = [n for n in names if not sorts_after(n, plain.horizon)]
    more = plain.truncated or len(names) > max_keys
    names = names[:max_keys]
    objects = [entry for n in names if (entry := items[n]) is not None]
    prefixes = [n for n in names if items[n] is None]
    token = None
    if more:
        if names:
            last = names[-1]
            token = merged_token(last + PAST_PREFIX if items[last] is None else last)
        elif plain.horizon is not None:
            token = merged_token(plain.horizon)
    return Merged(objects, prefixes, more and token is not None, token)
