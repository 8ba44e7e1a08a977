"""Bucket handlers: list, create, head, delete, location, versioning."""

from __future__ import annotations

from aiohttp import web

from tsproxy.s3 import xml
from tsproxy.server.exchange import OWNER_ID, Exchange, xml_response

# -- buckets -----------------------------------------------------------------------------------------


async def list_buckets(ex: Exchange) -> web.StreamResponse:
    buckets = await ex.service.list_buckets()
    return xml_response(xml.list_buckets_xml(buckets, OWNER_ID, OWNER_ID))


async def create_bucket(ex: Exchange) -> web.StreamResponse:
    body = await ex.small_body()
    if body:
        xml.parse_create_bucket(body)
    await ex.service.create_bucket(ex.bucket)
    return web.Response(status=200, headers={"Location": "/" + ex.bucket})


async def head_bucket(ex: Exchange) -> web.StreamResponse:
    await ex.service.head_bucket(ex.bucket)
    return web.Response(status=200, headers={"x-amz-bucket-region": ex.region})


async def delete_bucket(ex: Exchange) -> web.StreamResponse:
    await ex.service.delete_bucket(ex.bucket)
    return web.Response(status=204)


async def get_bucket_location(ex: Exchange) -> web.StreamResponse:
    await ex.service.head_bucket(ex.bucket)
    return xml_response(xml.location_xml(None if ex.region == "us-east-1" else ex.region))


async def get_bucket_versioning(ex: Exchange) -> web.StreamResponse:
    await ex.service.head_bucket(ex.bucket)
    return xml_response(xml.versioning_xml())
