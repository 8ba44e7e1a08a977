"""The lean ListObjectsV2 parse gives what botocore's own parser gives, on the answers stores send."""

from __future__ import annotations

from typing import Any

import botocore.session
import pytest
from aiobotocore.parsers import AioRestXMLParser

from tsproxy.store.s3client import fast_timestamp
from tsproxy.store.s3listparse import LeanRestXMLParser

NS = "http://s3.amazonaws.com/doc/2006-03-01/"

PAGES = {
    "plain": f"""<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="{NS}"><Name>b</Name><Prefix>topic-1/</Prefix><MaxKeys>1000</MaxKeys>
<KeyCount>2</KeyCount><IsTruncated>true</IsTruncated><ContinuationToken>abc</ContinuationToken>
<NextContinuationToken>def=</NextContinuationToken><StartAfter>a</StartAfter>
<Contents><Key>topic-1/0001.log</Key><LastModified>2026-11-25T04:03:00.000Z</LastModified>
<ETag>&quot;0123456789abcdef0123456789abcdef&quot;</ETag><Size>1048576</Size>
<Owner><ID>o</ID><DisplayName>d</DisplayName></Owner><StorageClass>STANDARD</StorageClass>
<ChecksumAlgorithm>CRC32</ChecksumAlgorithm><ChecksumType>FULL_OBJECT</ChecksumType></Contents>
<Contents><Key>topic-1/a&amp;b &lt;c&gt;</Key><LastModified>2026-01-02T03:04:05Z</LastModified>
<ETag>"ff-2"</ETag><Size>0</Size><StorageClass>STANDARD</StorageClass></Contents>
</ListBucketResult>""",
    "prefixes": f"""<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="{NS}"><Name>b</Name><Prefix></Prefix><Delimiter>/</Delimiter>
<MaxKeys>2</MaxKeys><KeyCount>2</KeyCount><IsTruncated>false</IsTruncated>
<CommonPrefixes><Prefix>topic-1/</Prefix></CommonPrefixes>
<CommonPrefixes><Prefix>topic-2/</Prefix></CommonPrefixes></ListBucketResult>""",
    "empty": f"""<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="{NS}"><Name>b</Name><Prefix>none/</Prefix><KeyCount>0</KeyCount>
<MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated></ListBucketResult>""",
    "url-encoded, no namespace": """<ListBucketResult><Name>b</Name><Prefix>p%2F</Prefix>
<EncodingType>url</EncodingType><KeyCount>1</KeyCount><MaxKeys>1</MaxKeys>
<IsTruncated>false</IsTruncated><Contents><Key>p%2Fk%20x</Key>
<LastModified>2026-11-25T04:03:00.123456Z</LastModified><ETag>"e"</ETag><Size>7</Size></Contents>
</ListBucketResult>""",
}


def _shape() -> Any:
    model = botocore.session.get_session().get_service_model("s3")
    return model.operation_model("ListObjectsV2").output_shape


async def _parse(parser: Any, body: str) -> dict[str, Any]:
    response = {"body": body.encode(), "headers": {"x-amz-request-id": "r"}, "status_code": 200}
    parsed: dict[str, Any] = await parser.parse(response, _shape())
    return parsed


@pytest.mark.parametrize("page", PAGES)
async def test_the_lean_parse_equals_botocore_s(page: str) -> None:
    botocore_view = await _parse(AioRestXMLParser(timestamp_parser=fast_timestamp), PAGES[page])
    lean_view = await _parse(LeanRestXMLParser(timestamp_parser=fast_timestamp), PAGES[page])
    assert lean_view == botocore_view


async def test_errors_still_go_through_botocore() -> None:
    body = b"<Error><Code>NoSuchBucket</Code><Message>gone</Message></Error>"
    response = {"body": body, "headers": {}, "status_code": 404}
    parsed = await LeanRestXMLParser(timestamp_parser=fast_timestamp).parse(response, _shape())
    assert parsed["Error"]["Code"] == "NoSuchBucket"


def test_timestamps_without_a_zone_are_utc_and_others_fall_back() -> None:
    assert fast_timestamp("2026-11-25T04:03:00").utcoffset() is not None
    assert fast_timestamp("Wed, 25 Nov 2026 04:03:00 GMT") == fast_timestamp("2026-11-25T04:03:00Z")
