"""Listing handlers: ListObjectsV2, ListObjects (v1) and ListObjectVersions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tsproxy import errors
from tsproxy.s3 import xml
from tsproxy.s3.limits import MAX_LIST_KEYS
from tsproxy.server.exchange import OWNER_ID, Exchange, xml_response
from tsproxy.service import ListedPage


def max_keys(query: Mapping[str, str], name: str = "max-keys", default: int = MAX_LIST_KEYS) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise errors.InvalidArgument(
            "Provided max-keys not an integer or within integer range", ArgumentName=name
        ) from None
    if value < 0:
        raise errors.InvalidArgument(
            "Argument maxKeys must be an integer between 0 and 2147483647", ArgumentName=name
        )
    return min(value, MAX_LIST_KEYS)


def _encoding_type(query: Mapping[str, str]) -> str | None:
    enc = query.get("encoding-type")
    if enc not in (None, "url"):
        raise errors.InvalidArgument(
            "Invalid Encoding Method specified in Request", ArgumentName="encoding-type"
        )
    return enc


@dataclass(frozen=True)
class _Listing:
    """The parameters every listing shares, and the page they asked for."""

    prefix: str
    delimiter: str | None
    max_keys: int
    encoding: str | None
    page: ListedPage

    @property
    def objects(self) -> list[xml.ObjectEntry]:
        return [_entry(o) for o in self.page.objects]

    @property
    def next_marker(self) -> str | None:
        """Where a v1 or versions listing goes on: the last key or common prefix of a truncated page."""
        if not self.page.is_truncated:
            return None
        return max([o.key for o in self.page.objects] + self.page.common_prefixes, default=None)


async def _list(ex: Exchange, *, start_after: str | None, token: str | None = None) -> _Listing:
    q = ex.query
    limit = max_keys(q)
    prefix, delimiter, encoding = q.get("prefix", ""), q.get("delimiter") or None, _encoding_type(q)
    page = ListedPage([], [], False, None)
    if limit:
        page = await ex.service.list_objects(
            ex.bucket,
            prefix=prefix,
            delimiter=delimiter,
            start_after=start_after,
            token=token,
            max_keys=limit,
        )
    return _Listing(prefix, delimiter, limit, encoding, page)


async def list_objects_v2(ex: Exchange) -> web.StreamResponse:
    token, start_after = ex.query.get("continuation-token") or None, ex.query.get("start-after") or None
    ls = await _list(ex, start_after=start_after, token=token)
    return xml_response(
        xml.list_objects_v2_xml(
            bucket=ex.bucket,
            prefix=ls.prefix,
            delimiter=ls.delimiter,
            max_keys=ls.max_keys,
            objects=ls.objects,
            common_prefixes=ls.page.common_prefixes,
            is_truncated=ls.page.is_truncated,
            continuation_token=token,
            next_continuation_token=ls.page.next_token if ls.page.is_truncated else None,
            start_after=start_after,
            encoding_type=ls.encoding,
            fetch_owner=ex.query.get("fetch-owner") == "true",
            owner_id=OWNER_ID,
        )
    )


async def list_objects_v1(ex: Exchange) -> web.StreamResponse:
    marker = ex.query.get("marker") or None
    ls = await _list(ex, start_after=marker)
    return xml_response(
        xml.list_objects_v1_xml(
            bucket=ex.bucket,
            prefix=ls.prefix,
            delimiter=ls.delimiter,
            max_keys=ls.max_keys,
            marker=marker,
            objects=ls.objects,
            common_prefixes=ls.page.common_prefixes,
            is_truncated=ls.page.is_truncated,
            next_marker=ls.next_marker,
            encoding_type=ls.encoding,
            owner_id=OWNER_ID,
        )
    )


async def list_object_versions(ex: Exchange) -> web.StreamResponse:
    # Buckets behind tsproxy are unversioned: every current object is version "null".
    marker = ex.query.get("key-marker") or None
    ls = await _list(ex, start_after=marker)
    return xml_response(
        xml.list_object_versions_xml(
            bucket=ex.bucket,
            prefix=ls.prefix,
            delimiter=ls.delimiter,
            max_keys=ls.max_keys,
            key_marker=marker,
            objects=ls.objects,
            common_prefixes=ls.page.common_prefixes,
            is_truncated=ls.page.is_truncated,
            next_key_marker=ls.next_marker,
            encoding_type=ls.encoding,
            owner_id=OWNER_ID,
        )
    )


def _entry(o: Any) -> xml.ObjectEntry:
    return xml.ObjectEntry(key=o.key, size=o.size, etag=o.etag, last_modified=o.last_modified)
