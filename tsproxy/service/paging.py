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
import json
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
    """Where a listing goes on.

    `backend_token` continues the plain range in the backend's own order (its continuation token);
    `after` is the last escaped key (or rolled-up prefix) already answered; `plain_done` says the plain
    range has been listed to its end; `merged` is None on a first page, which looks for escaped keys.
    """

    backend_token: str | None = None
    after: str | None = None
    merged: bool | None = None
    plain_done: bool = False


def parse_token(token: str | None) -> Cursor:
    """The cursor a continuation token stands for; InvalidArgument for one tsproxy did not give out."""
    if token is None:
        return Cursor()
    kind, body = token[:1], token[1:]
    if kind == "p" and body:
        return Cursor(backend_token=body, merged=False)
    if kind == "m" and body:
        try:
            raw = base64.urlsafe_b64decode(body.encode("ascii") + b"=" * (-len(body) % 4))
            backend_token, after, plain_done = json.loads(raw.decode("utf-8", "surrogatepass"))
            if isinstance(backend_token, str | None) and isinstance(after, str | None):
                return Cursor(backend_token or None, after, True, bool(plain_done))
        except (binascii.Error, UnicodeError, ValueError, TypeError):
            pass
    raise errors.InvalidArgument(
        "The continuation token provided is incorrect", ArgumentName="continuation-token"
    )


def plain_token(backend_token: str | None) -> str | None:
    return f"p{backend_token}" if backend_token else None


def merged_token(backend_token: str | None, after: str | None, plain_done: bool) -> str:
    raw = json.dumps([backend_token, after, plain_done]).encode("utf-8", "surrogatepass")
    return "m" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


@dataclass(frozen=True)
class Page(Generic[T]):
    """One backend page of the plain range: entries (client key, item) and common prefixes.

    `horizon` is the last name the page reached when it is truncated (None when it is the range's end);
    `next_token` continues it.
    """

    objects: list[tuple[str, T]]
    prefixes: list[str]
    truncated: bool
    horizon: str | None = None
    next_token: str | None = None


@dataclass(frozen=True)
class Merged(Generic[T]):
    objects: list[tuple[str, T]]
    prefixes: list[str]
    truncated: bool
    token: str | None


def merge(
    plain: Page[T] | None,
    escaped: list[tuple[str, T]],
    prefix: str,
    delimiter: str | None,
    max_keys: int,
    after: str | None = None,
) -> Merged[T]:
    """One merged page: every plain entry of the backend page, and the escaped entries (client order,
    already past the cursor) that sort up to the plain page's horizon, as room allows.

    `plain` is None once the plain range is done. The plain range always advances by the backend's own
    token, so a listing ends whatever order the backend lists in; within a page entries are in S3's order,
    and across pages too where the backend lists in S3's order.
    """
    items: dict[str, tuple[str, T] | None] = {}  # client key or prefix -> entry (None for a prefix)
    if plain is not None:
        for key, item in plain.objects:
            items[key] = (key, item)
        for p in plain.prefixes:
            items[p] = None
    room = max_keys - len(items)
    horizon = plain.horizon if plain is not None and plain.truncated else None
    taken = 0
    last_escaped: str | None = None
    for key, item in escaped:
        if room <= 0 or (horizon is not None and sorts_after(key, horizon)):
            break
        cut = key.find(delimiter, len(prefix)) if delimiter else -1
        if cut >= 0:
            name = key[: cut + len(delimiter or "")]
            if last_escaped is not None and last_escaped == name + PAST_PREFIX:
                taken += 1
                continue  # rolled up already
            if name not in items:
                items[name] = None
                room -= 1
            last_escaped = name + PAST_PREFIX
        else:
            items[key] = (key, item)
            room -= 1
            last_escaped = key
        taken += 1
    cursor = last_escaped if last_escaped is not None else after
    rest_escaped = [k for k, _ in escaped[taken:] if cursor is None or sorts_after(k, cursor)]
    plain_more = plain is not None and plain.truncated
    names = sorted(items, key=order)
    objects = [entry for n in names if (entry := items[n]) is not None]
    prefixes = [n for n in names if items[n] is None]
    more = plain_more or bool(rest_escaped)
    token = None
    if more:
        token = merged_token(
            plain.next_token if plain_more and plain is not None else None, cursor, not plain_more
        )
    return Merged(objects, prefixes, more, token)
