"""Access control lists: every bucket and object is private, and that is the only ACL tsproxy has.

GetBucketAcl and GetObjectAcl answer the canned `private` policy (the owner with FULL_CONTROL). Setting
`private` (PutBucketAcl, PutObjectAcl, or `x-amz-acl` on a write) is accepted, as it changes nothing;
any other canned ACL or grant would open access that tsproxy does not enforce, so it is NotImplemented
rather than silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from tsproxy import errors
from tsproxy.s3 import xml
from tsproxy.server.exchange import OWNER_ID, Exchange, xml_response

# `bucket-owner-full-control` grants the bucket's owner full control of an object: with one owner of
# everything that is `private` again, and writers shared between accounts send it.
_OBJECT_CANNED = frozenset({"private", "bucket-owner-full-control"})
_BUCKET_CANNED = frozenset({"private"})


def check_acl_headers(headers: Mapping[str, str], *, bucket: bool) -> None:
    """Refuse (NotImplemented) an `x-amz-acl` other than private, and any `x-amz-grant-*` header."""
    canned = headers.get("x-amz-acl")
    if canned is not None and canned.strip().lower() not in (_BUCKET_CANNED if bucket else _OBJECT_CANNED):
        raise errors.NotImplemented_(
            f"tsproxy keeps everything private; the canned ACL {canned.strip()!r} is not implemented.",
            Header="x-amz-acl",
        )
    grants = sorted(name.lower() for name in headers if name.lower().startswith("x-amz-grant-"))
    if grants:
        raise errors.NotImplemented_(
            "tsproxy keeps everything private; grants are not implemented.", Header=grants[0]
        )


async def _check_policy(ex: Exchange, *, bucket: bool) -> None:
    check_acl_headers(ex.request.headers, bucket=bucket)
    body = await ex.small_body()
    if not body.strip():
        return
    grants = xml.parse_access_control_policy(body)
    if not grants or any(grantee != OWNER_ID or perm != "FULL_CONTROL" for grantee, perm in grants):
        raise errors.NotImplemented_(
            "tsproxy keeps everything private; only the owner's FULL_CONTROL grant is implemented."
        )


async def get_bucket_acl(ex: Exchange) -> web.StreamResponse:
    await ex.service.head_bucket(ex.bucket)
    return xml_response(xml.access_control_policy_xml(OWNER_ID))


async def put_bucket_acl(ex: Exchange) -> web.StreamResponse:
    await ex.service.head_bucket(ex.bucket)
    await _check_policy(ex, bucket=True)
    return web.Response(status=200)


async def get_object_acl(ex: Exchange) -> web.StreamResponse:
    await ex.service.resolve(ex.bucket, ex.key)
    return xml_response(xml.access_control_policy_xml(OWNER_ID))


async def put_object_acl(ex: Exchange) -> web.StreamResponse:
    await ex.service.resolve(ex.bucket, ex.key)
    await _check_policy(ex, bucket=False)
    return web.Response(status=200)
