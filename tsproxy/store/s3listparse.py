"""A lean parse of ListObjectsV2 answers for the S3 backend's botocore client.

botocore parses a response XML by walking its model shape by shape; for a 1,000-key listing page that
walk was the largest share of tsproxy's CPU time in a long listing. A listing's XML is flat and simple,
so this parser reads it with one ElementTree pass into the same dictionary botocore would build
(members it does not model are kept as text, which no caller reads). Every other operation, and any
listing answer that is not a 200, goes through botocore's own parser.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from xml.etree import ElementTree

from aiobotocore.parsers import PROTOCOL_PARSERS, AioResponseParserFactory, AioRestXMLParser

_INTEGERS = frozenset({"MaxKeys", "KeyCount", "Size"})
_LISTED = frozenset({"Contents", "CommonPrefixes"})


def _name(tag: str) -> str:
    return tag.rpartition("}")[2]


def parse_list_objects_v2(body: bytes, timestamp: Callable[[str], Any]) -> dict[str, Any]:
    """The members of a ListObjectsV2 answer's body, shaped as botocore shapes them."""
    root = ElementTree.fromstring(body)
    parsed: dict[str, Any] = {}
    for child in root:
        name = _name(child.tag)
        if name in _LISTED:
            parsed.setdefault(name, []).append(_entry(child, timestamp))
        else:
            parsed[name] = _scalar(name, child.text or "", timestamp)
    return parsed


def _entry(element: ElementTree.Element, timestamp: Callable[[str], Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    for field in element:
        name = _name(field.tag)
        if len(field):  # Owner, RestoreStatus: a nested structure of texts
            entry[name] = {_name(sub.tag): sub.text or "" for sub in field}
        elif name == "ChecksumAlgorithm":
            entry.setdefault(name, []).append(field.text or "")
        else:
            entry[name] = _scalar(name, field.text or "", timestamp)
    return entry


def _scalar(name: str, text: str, timestamp: Callable[[str], Any]) -> Any:
    if name in _INTEGERS:
        return int(text)
    if name == "IsTruncated":
        return text.strip().lower() == "true"
    if name == "LastModified":
        return timestamp(text)
    return text


class LeanRestXMLParser(AioRestXMLParser):
    """aiobotocore's rest-xml parser, with ListObjectsV2 bodies read by `parse_list_objects_v2`."""

    def _parse_payload(
        self, response: dict[str, Any], shape: Any, member_shapes: Any, final_parsed: dict[str, Any]
    ) -> None:
        if shape is not None and shape.name == "ListObjectsV2Output" and response.get("body"):
            final_parsed.update(parse_list_objects_v2(response["body"], self._timestamp_parser))
            return
        super()._parse_payload(response, shape, member_shapes, final_parsed)


class LeanParserFactory(AioResponseParserFactory):
    """The session's parser factory: `LeanRestXMLParser` for S3's protocol, aiobotocore's for others."""

    def create_parser(self, protocol_name: str) -> Any:
        parser_cls = LeanRestXMLParser if protocol_name == "rest-xml" else PROTOCOL_PARSERS[protocol_name]
        return parser_cls(**self._defaults)
