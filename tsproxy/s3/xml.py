"""S3's XML: response documents (bytes) and the few request bodies S3 takes, parsed safely.

Responses are written directly as text: S3's documents are flat and small, and writing them by hand
keeps control of what ElementTree would not do (escaping quotes in ETags the way S3 does, encoding
characters XML 1.0 cannot carry). Request bodies are untrusted: they are size-bounded, a DOCTYPE (the
door to entity expansion and external entities) is refused outright, and depth is bounded.

Namespace of every response but errors: http://s3.amazonaws.com/doc/2006-03-01/
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote
from xml.etree import ElementTree as ET
from xml.parsers import expat

from tsproxy import errors
from tsproxy.s3.limits import MAX_DELETE_KEYS, check_part_number
from tsproxy.s3.ranges import iso8601

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
DECLARATION = '<?xml version="1.0" encoding="UTF-8"?>\n'
MAX_BODY = 2 << 20  # CompleteMultipartUpload of 10,000 parts with checksums stays well under this
MAX_DEPTH = 8


# -- listing entries (plain values, no I/O) ---------------------------------------------------------


@dataclass(frozen=True)
class ObjectEntry:
    """One object in a listing. `etag` with or without quotes; it is written quoted."""

    key: str
    size: int
    etag: str
    last_modified: datetime
    storage_class: str = "STANDARD"


@dataclass(frozen=True)
class PartEntry:
    """One uploaded part in ListParts."""

    part_number: int
    etag: str
    size: int
    last_modified: datetime


@dataclass(frozen=True)
class UploadEntry:
    """One multipart upload in progress in ListMultipartUploads."""

    key: str
    upload_id: str
    initiated: datetime
    storage_class: str = "STANDARD"


# -- writing ------------------------------------------------------------------------------------------

# Characters XML 1.0 cannot carry even as references are written as references anyway, as S3 does;
# clients that must round-trip such keys ask for encoding-type=url.
_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&apos;", "\r": "&#13;"}
_NEEDS_ESCAPE = re.compile("[&<>\"'\r\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def _escape(text: str) -> str:
    if _NEEDS_ESCAPE.search(text) is None:  # the usual case: nothing to replace
        return text
    return _NEEDS_ESCAPE.sub(lambda m: _ESCAPES.get(m.group(), f"&#x{ord(m.group()):X};"), text)


def _el(name: str, value: object) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, datetime):
        text = iso8601(value)
    else:
        text = str(value)
    return f"<{name}>{_escape(text)}</{name}>"


def _doc(root: str, parts: Iterable[str], *, namespace: bool = True) -> bytes:
    ns = f' xmlns="{NS}"' if namespace else ""
    return (DECLARATION + f"<{root}{ns}>" + "".join(parts) + f"</{root}>").encode("utf-8", "surrogatepass")


def _quoted(etag: str) -> str:
    return etag if etag.startswith('"') else f'"{etag}"'


def _url(value: str, encoding_type: str | None) -> str:
    # quote() never leaves a '+', so either URL decoder (plain or form) recovers the key.
    return quote(value, safe="/") if encoding_type == "url" else value


def _owner(owner_id: str, name: str | None = None, tag: str = "Owner") -> str:
    return f"<{tag}>" + _el("ID", owner_id) + _el("DisplayName", name or owner_id) + f"</{tag}>"


def error_xml(err: errors.S3Error, resource: str, request_id: str) -> bytes:
    """S3's error document: Code, Message, the error's extra fields, Resource, RequestId (no namespace)."""
    parts = [_el("Code", err.code), _el("Message", err.message)]
    parts += [
        _el(name, value) for name, value in err.fields.items() if re.fullmatch(r"[A-Za-z][\w.-]*", name)
    ]
    parts += [_el("Resource", resource), _el("RequestId", request_id), _el("HostId", request_id)]
    return _doc("Error", parts, namespace=False)


def list_buckets_xml(buckets: Sequence[tuple[str, datetime]], owner_id: str, owner_name: str) -> bytes:
    """ListAllMyBucketsResult for (name, creation date) pairs."""
    items = [
        "<Bucket>" + _el("Name", name) + _el("CreationDate", created) + "</Bucket>"
        for name, created in buckets
    ]
    return _doc("ListAllMyBucketsResult", [_owner(owner_id, owner_name), "<Buckets>", *items, "</Buckets>"])


def _contents(o: ObjectEntry, encoding_type: str | None, owner_id: str | None) -> str:
    # Written in one piece: a listing page holds up to 1,000 of these (the same bytes as _el would give).
    etag = _escape(o.etag) if o.etag.startswith('"') else f"&quot;{_escape(o.etag)}&quot;"
    owner = _owner(owner_id) if owner_id is not None else ""
    return (
        f"<Contents><Key>{_escape(_url(o.key, encoding_type))}</Key>"
        f"<LastModified>{iso8601(o.last_modified)}</LastModified>"
        f"<ETag>{etag}</ETag><Size>{o.size}</Size>"
        f"<StorageClass>{_escape(o.storage_class)}</StorageClass>{owner}</Contents>"
    )


def _common_prefixes(prefixes: Iterable[str], encoding_type: str | None) -> list[str]:
    return [
        "<CommonPrefixes>" + _el("Prefix", _url(p, encoding_type)) + "</CommonPrefixes>" for p in prefixes
    ]


def list_objects_v2_xml(
    *,
    bucket: str,
    prefix: str,
    delimiter: str | None,
    max_keys: int,
    objects: Sequence[ObjectEntry],
    common_prefixes: Sequence[str],
    is_truncated: bool,
    continuation_token: str | None = None,
    next_continuation_token: str | None = None,
    start_after: str | None = None,
    encoding_type: str | None = None,
    fetch_owner: bool = False,
    owner_id: str = "",
) -> bytes:
    """ListBucketResult of ListObjectsV2. With encoding_type="url", keys and prefixes are URL-encoded."""
    parts = [_el("Name", bucket), _el("Prefix", _url(prefix, encoding_type))]
    if delimiter:
        parts.append(_el("Delimiter", _url(delimiter, encoding_type)))
    parts += [_el("MaxKeys", max_keys)]
    if encoding_type:
        parts.append(_el("EncodingType", encoding_type))
    parts += [_el("KeyCount", len(objects) + len(common_prefixes)), _el("IsTruncated", is_truncated)]
    if continuation_token is not None:
        parts.append(_el("ContinuationToken", continuation_token))
    if next_continuation_token is not None:
        parts.append(_el("NextContinuationToken", next_continuation_token))
    if start_after is not None:
        parts.append(_el("StartAfter", _url(start_after, encoding_type)))
    parts += [_contents(o, encoding_type, owner_id if fetch_owner else None) for o in objects]
    parts += _common_prefixes(common_prefixes, encoding_type)
    return _doc("ListBucketResult", parts)


def list_objects_v1_xml(
    *,
    bucket: str,
    prefix: str,
    delimiter: str | None,
    max_keys: int,
    marker: str | None,
    objects: Sequence[ObjectEntry],
    common_prefixes: Sequence[str],
    is_truncated: bool,
    next_marker: str | None = None,
    encoding_type: str | None = None,
    owner_id: str = "",
) -> bytes:
    """ListBucketResult of ListObjects (v1); NextMarker only when truncated and given."""
    parts = [
        _el("Name", bucket),
        _el("Prefix", _url(prefix, encoding_type)),
        _el("Marker", _url(marker or "", encoding_type)),
    ]
    if is_truncated and next_marker is not None:
        parts.append(_el("NextMarker", _url(next_marker, encoding_type)))
    parts.append(_el("MaxKeys", max_keys))
    if delimiter:
        parts.append(_el("Delimiter", _url(delimiter, encoding_type)))
    if encoding_type:
        parts.append(_el("EncodingType", encoding_type))
    parts.append(_el("IsTruncated", is_truncated))
    parts += [_contents(o, encoding_type, owner_id) for o in objects]
    parts += _common_prefixes(common_prefixes, encoding_type)
    return _doc("ListBucketResult", parts)


def list_object_versions_xml(
    *,
    bucket: str,
    prefix: str,
    delimiter: str | None,
    max_keys: int,
    key_marker: str | None,
    objects: Sequence[ObjectEntry],
    common_prefixes: Sequence[str],
    is_truncated: bool,
    next_key_marker: str | None = None,
    encoding_type: str | None = None,
    owner_id: str = "",
) -> bytes:
    """ListVersionsResult of an unversioned bucket: each object once, VersionId "null", IsLatest true."""
    parts = [
        _el("Name", bucket),
        _el("Prefix", _url(prefix, encoding_type)),
        _el("KeyMarker", _url(key_marker or "", encoding_type)),
        _el("VersionIdMarker", ""),
    ]
    if is_truncated and next_key_marker is not None:
        parts += [
            _el("NextKeyMarker", _url(next_key_marker, encoding_type)),
            _el("NextVersionIdMarker", "null"),
        ]
    parts.append(_el("MaxKeys", max_keys))
    if delimiter:
        parts.append(_el("Delimiter", _url(delimiter, encoding_type)))
    if encoding_type:
        parts.append(_el("EncodingType", encoding_type))
    parts.append(_el("IsTruncated", is_truncated))
    for o in objects:
        parts.append(
            "<Version>"
            + _el("Key", _url(o.key, encoding_type))
            + _el("VersionId", "null")
            + _el("IsLatest", True)
            + _el("LastModified", o.last_modified)
            + _el("ETag", _quoted(o.etag))
            + _el("Size", o.size)
            + _el("StorageClass", o.storage_class)
            + _owner(owner_id)
            + "</Version>"
        )
    parts += _common_prefixes(common_prefixes, encoding_type)
    return _doc("ListVersionsResult", parts)


def initiate_multipart_xml(bucket: str, key: str, upload_id: str) -> bytes:
    """InitiateMultipartUploadResult."""
    return _doc(
        "InitiateMultipartUploadResult", [_el("Bucket", bucket), _el("Key", key), _el("UploadId", upload_id)]
    )


def complete_multipart_xml(location: str, bucket: str, key: str, etag: str) -> bytes:
    """CompleteMultipartUploadResult."""
    parts = [_el("Location", location), _el("Bucket", bucket), _el("Key", key), _el("ETag", _quoted(etag))]
    return _doc("CompleteMultipartUploadResult", parts)


def copy_object_xml(etag: str, last_modified: datetime) -> bytes:
    """CopyObjectResult."""
    return _doc("CopyObjectResult", [_el("LastModified", last_modified), _el("ETag", _quoted(etag))])


def copy_part_xml(etag: str, last_modified: datetime) -> bytes:
    """CopyPartResult (UploadPartCopy)."""
    return _doc("CopyPartResult", [_el("LastModified", last_modified), _el("ETag", _quoted(etag))])


def delete_result_xml(deleted: Sequence[str], errors_: Sequence[tuple[str, str, str]], quiet: bool) -> bytes:
    """DeleteResult: Deleted keys (left out in quiet mode) and (key, code, message) errors."""
    parts = [] if quiet else ["<Deleted>" + _el("Key", key) + "</Deleted>" for key in deleted]
    parts += [
        "<Error>" + _el("Key", key) + _el("Code", code) + _el("Message", message) + "</Error>"
        for key, code, message in errors_
    ]
    return _doc("DeleteResult", parts)


def list_parts_xml(
    *,
    bucket: str,
    key: str,
    upload_id: str,
    part_number_marker: int,
    next_part_number_marker: int,
    max_parts: int,
    is_truncated: bool,
    parts: Sequence[PartEntry],
    owner_id: str = "",
    initiated: datetime | None = None,
    storage_class: str = "STANDARD",
) -> bytes:
    """ListPartsResult. (`initiated` is accepted for the caller's convenience; ListParts does not show it.)"""
    del initiated
    out = [
        _el("Bucket", bucket),
        _el("Key", key),
        _el("UploadId", upload_id),
        _owner(owner_id, tag="Initiator"),
        _owner(owner_id),
        _el("StorageClass", storage_class),
        _el("PartNumberMarker", part_number_marker),
        _el("NextPartNumberMarker", next_part_number_marker),
        _el("MaxParts", max_parts),
        _el("IsTruncated", is_truncated),
    ]
    for p in parts:
        out.append(
            "<Part>"
            + _el("PartNumber", p.part_number)
            + _el("LastModified", p.last_modified)
            + _el("ETag", _quoted(p.etag))
            + _el("Size", p.size)
            + "</Part>"
        )
    return _doc("ListPartsResult", out)


def list_multipart_uploads_xml(
    *,
    bucket: str,
    prefix: str,
    key_marker: str,
    max_uploads: int,
    is_truncated: bool,
    uploads: Sequence[UploadEntry],
    owner_id: str = "",
    upload_id_marker: str = "",
    delimiter: str | None = None,
    common_prefixes: Sequence[str] = (),
    encoding_type: str | None = None,
) -> bytes:
    """ListMultipartUploadsResult; the next markers are those of the last upload when truncated."""
    parts = [
        _el("Bucket", bucket),
        _el("KeyMarker", _url(key_marker, encoding_type)),
        _el("UploadIdMarker", upload_id_marker),
    ]
    if is_truncated and uploads:
        parts += [
            _el("NextKeyMarker", _url(uploads[-1].key, encoding_type)),
            _el("NextUploadIdMarker", uploads[-1].upload_id),
        ]
    parts.append(_el("Prefix", _url(prefix, encoding_type)))
    if delimiter:
        parts.append(_el("Delimiter", _url(delimiter, encoding_type)))
    if encoding_type:
        parts.append(_el("EncodingType", encoding_type))
    parts += [_el("MaxUploads", max_uploads), _el("IsTruncated", is_truncated)]
    for u in uploads:
        parts.append(
            "<Upload>"
            + _el("Key", _url(u.key, encoding_type))
            + _el("UploadId", u.upload_id)
            + _owner(owner_id, tag="Initiator")
            + _owner(owner_id)
            + _el("StorageClass", u.storage_class)
            + _el("Initiated", u.initiated)
            + "</Upload>"
        )
    parts += _common_prefixes(common_prefixes, encoding_type)
    return _doc("ListMultipartUploadsResult", parts)


def location_xml(region: str | None) -> bytes:
    """LocationConstraint; empty for us-east-1 (None), as S3 answers."""
    return (
        DECLARATION + f'<LocationConstraint xmlns="{NS}">{_escape(region or "")}</LocationConstraint>'
    ).encode()


def access_control_policy_xml(owner_id: str) -> bytes:
    """AccessControlPolicy of the canned `private` ACL: the owner, with FULL_CONTROL, and no one else."""
    grantee = (
        '<Grantee xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:type="CanonicalUser">'
        + _el("ID", owner_id)
        + _el("DisplayName", owner_id)
        + "</Grantee>"
    )
    grant = "<Grant>" + grantee + _el("Permission", "FULL_CONTROL") + "</Grant>"
    return _doc(
        "AccessControlPolicy", [_owner(owner_id), "<AccessControlList>", grant, "</AccessControlList>"]
    )


def versioning_xml() -> bytes:
    """VersioningConfiguration of a bucket that never had versioning: an empty element."""
    return (DECLARATION + f'<VersioningConfiguration xmlns="{NS}"/>').encode()


# -- parsing untrusted request bodies ---------------------------------------------------------------


class _Refused(Exception):
    """A construct we do not parse (DOCTYPE, entity declaration) or a document too deep."""


def parse_xml(body: bytes, *, max_size: int = MAX_BODY) -> ET.Element:
    """Parse an untrusted XML request body into elements with namespaces stripped from tag names.

    Raises MalformedXML for anything not well-formed, too large, too deep, or with a DOCTYPE.
    """
    if len(body) > max_size:
        raise errors.MalformedXML("The XML you provided was too large.")
    parser = expat.ParserCreate(namespace_separator=" ")
    builder = ET.TreeBuilder()
    depth = 0

    def refuse(*_args: object) -> int:
        raise _Refused()

    def start(name: str, _attrs: dict[str, str]) -> None:
        nonlocal depth
        depth += 1
        if depth > MAX_DEPTH:
            raise _Refused()
        builder.start(name.rsplit(" ", 1)[-1], {})

    def end(name: str) -> None:
        nonlocal depth
        depth -= 1
        builder.end(name.rsplit(" ", 1)[-1])

    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    parser.ExternalEntityRefHandler = refuse
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = builder.data
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    try:
        parser.Parse(body, True)
        root = builder.close()
    except (_Refused, expat.ExpatError, AssertionError, IndexError):
        raise errors.MalformedXML() from None
    return root


def _text(el: ET.Element, tag: str) -> str | None:
    child = el.find(tag)
    return None if child is None else (child.text or "")


def parse_complete_multipart(body: bytes) -> list[tuple[int, str]]:
    """The (part number, ETag without quotes) list of a CompleteMultipartUpload body, in order.

    Checksum elements of parts are allowed and ignored. MalformedXML for a bad or empty document,
    InvalidPartOrder unless part numbers strictly ascend, InvalidArgument for numbers outside 1..10000.
    """
    root = parse_xml(body)
    if root.tag != "CompleteMultipartUpload":
        raise errors.MalformedXML()
    parts: list[tuple[int, str]] = []
    for part in root:
        if part.tag != "Part":
            raise errors.MalformedXML()
        number_text, etag = _text(part, "PartNumber"), _text(part, "ETag")
        if number_text is None or etag is None or not number_text.strip().isdigit():
            raise errors.MalformedXML()
        number = int(number_text.strip())
        check_part_number(number)
        if parts and number <= parts[-1][0]:
            raise errors.InvalidPartOrder()
        parts.append((number, etag.strip().strip('"')))
    if not parts:
        raise errors.MalformedXML()
    return parts


def parse_delete(body: bytes) -> tuple[list[str], bool]:
    """The keys and the Quiet flag of a DeleteObjects body. MalformedXML if bad, empty or > 1000 keys."""
    root = parse_xml(body)
    if root.tag != "Delete":
        raise errors.MalformedXML()
    keys: list[str] = []
    quiet = False
    for child in root:
        if child.tag == "Quiet":
            value = (child.text or "").strip().lower()
            if value not in ("true", "false"):
                raise errors.MalformedXML()
            quiet = value == "true"
        elif child.tag == "Object":
            key = _text(child, "Key")
            if key is None:
                raise errors.MalformedXML()
            keys.append(key)
        else:
            raise errors.MalformedXML()
    if not keys or len(keys) > MAX_DELETE_KEYS:
        raise errors.MalformedXML()
    return keys, quiet


def parse_create_bucket(body: bytes) -> str | None:
    """The LocationConstraint of a CreateBucketConfiguration body (None when empty or absent)."""
    if not body.strip():
        return None
    root = parse_xml(body)
    if root.tag != "CreateBucketConfiguration":
        raise errors.MalformedXML()
    location = _text(root, "LocationConstraint")
    return location.strip() or None if location is not None else None


def parse_access_control_policy(body: bytes) -> list[tuple[str | None, str]]:
    """The grants of an AccessControlPolicy body: (grantee's canonical ID, or None for a grantee named
    otherwise (URI, e-mail address), permission). MalformedXML for a bad document."""
    root = parse_xml(body)
    if root.tag != "AccessControlPolicy":
        raise errors.MalformedXML()
    acl = root.find("AccessControlList")
    if acl is None:
        raise errors.MalformedXML()
    grants: list[tuple[str | None, str]] = []
    for grant in acl:
        grantee = grant.find("Grantee")
        permission = _text(grant, "Permission")
        if grant.tag != "Grant" or grantee is None or permission is None:
            raise errors.MalformedXML()
        grantee_id = _text(grantee, "ID")
        grants.append((grantee_id.strip() if grantee_id is not None else None, permission.strip()))
    return grants
