"""S3 XML: every response read back by ElementTree and by a real boto3 client; request bodies as boto3
writes them; malformed and hostile documents."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.s3.s3_helpers import boto3_client, boto3_wire
from tsproxy import errors
from tsproxy.s3 import xml

NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
WHEN = datetime(2024, 5, 6, 7, 8, 9, 123_000, tzinfo=UTC)


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, *_: Any, **__: Any) -> Iterator[bytes]:
        yield self.body


def boto3_reads(body: bytes, call: Callable[[Any], Any], status: int = 200, **config: Any) -> Any:
    """What a real boto3 client makes of `body` as the answer to `call`."""
    client = boto3_client("https://s3.test", **config)

    def answer(request: Any, **_: Any) -> AWSResponse:
        return AWSResponse(request.url, status, {"Content-Type": "application/xml"}, _Raw(body))

    client.meta.events.register("before-send.s3.*", answer)
    return call(client)


def parse(body: bytes) -> ET.Element:
    assert body.startswith(b'<?xml version="1.0" encoding="UTF-8"?>')
    return ET.fromstring(body)


# -- errors ------------------------------------------------------------------------------------------


def test_error_document() -> None:
    err = errors.InvalidRange(RangeRequested="bytes=10-", ActualObjectSize="5")
    root = parse(xml.error_xml(err, "/bucket/key", "REQ123"))
    assert root.tag == "Error"  # S3's error documents have no namespace
    assert [(c.tag, c.text) for c in root] == [
        ("Code", "InvalidRange"),
        ("Message", "The requested range is not satisfiable"),
        ("RangeRequested", "bytes=10-"),
        ("ActualObjectSize", "5"),
        ("Resource", "/bucket/key"),
        ("RequestId", "REQ123"),
        ("HostId", "REQ123"),
    ]


def test_error_document_escapes_and_boto3_reads_it() -> None:
    err = errors.NoSuchKey(Key="a<b>&'\"")
    body = xml.error_xml(err, "/b/a<b>&'\"", "RID")
    assert parse(body).findtext("Key") == "a<b>&'\""
    with pytest.raises(ClientError) as exc:
        boto3_reads(body, lambda c: c.list_objects_v2(Bucket="b"), status=404)
    assert exc.value.response["Error"]["Code"] == "NoSuchKey"
    assert exc.value.response["Error"]["Message"] == "The specified key does not exist."


def test_error_fields_with_hyphens_are_elements() -> None:
    err = errors.AccessDenied(
        "Request has expired", **{"X-Amz-Expires": "60", "Expires": "2024-01-01T00:00:00Z"}
    )
    root = parse(xml.error_xml(err, "/", "R"))
    assert root.findtext("X-Amz-Expires") == "60" and root.findtext("Message") == "Request has expired"


# -- listings ------------------------------------------------------------------------------------------

AWKWARD = [
    "plain",
    "a b/c+d",
    "ü/ファイル",
    "amp&lt;<>\"'",
    "tab\there",
    "new\nline",
    "cr\rhere",
    "%41",
    "~!*()",
]


def entries(keys: list[str]) -> list[xml.ObjectEntry]:
    return [xml.ObjectEntry(k, i * 10, f"etag{i}", WHEN) for i, k in enumerate(keys)]


def test_list_buckets() -> None:
    body = xml.list_buckets_xml([("alpha", WHEN), ("beta", WHEN)], "owner-id", "owner")
    root = parse(body)
    assert root.tag == NS + "ListAllMyBucketsResult"
    got = boto3_reads(body, lambda c: c.list_buckets())
    assert [b["Name"] for b in got["Buckets"]] == ["alpha", "beta"]
    assert got["Buckets"][0]["CreationDate"] == WHEN
    assert got["Owner"] == {"ID": "owner-id", "DisplayName": "owner"}


@pytest.mark.parametrize("encoding", [None, "url"])
def test_list_objects_v2(encoding: str | None) -> None:
    body = xml.list_objects_v2_xml(
        bucket="bkt",
        prefix="",
        delimiter="/",
        max_keys=50,
        objects=entries(AWKWARD),
        common_prefixes=["dir one/"],
        is_truncated=True,
        continuation_token="tok+1/=",
        next_continuation_token="tok 2",
        start_after="a b",
        encoding_type=encoding,
        fetch_owner=True,
        owner_id="me",
    )
    root = parse(body)
    assert root.tag == NS + "ListBucketResult"
    assert root.findtext(NS + "KeyCount") == str(len(AWKWARD) + 1)
    assert root.findtext(NS + "IsTruncated") == "true"
    assert root.findtext(NS + "ContinuationToken") == "tok+1/="
    assert root.findtext(NS + "NextContinuationToken") == "tok 2"
    assert root.findtext(f"{NS}Contents/{NS}ETag") == '"etag0"'
    assert root.findtext(f"{NS}Contents/{NS}LastModified") == "2024-05-06T07:08:09.123Z"
    assert root.findtext(f"{NS}Contents/{NS}Owner/{NS}ID") == "me"
    # boto3 asks for url encoding itself and decodes what it gets; a plain answer it leaves as is. Either
    # way every key comes back exactly, line breaks and carriage returns included.
    got = boto3_reads(body, lambda c: c.list_objects_v2(Bucket="bkt", Delimiter="/"))
    assert [o["Key"] for o in got["Contents"]] == AWKWARD
    assert [p["Prefix"] for p in got["CommonPrefixes"]] == ["dir one/"]
    assert got["StartAfter"] == "a b" and got["KeyCount"] == len(AWKWARD) + 1
    assert got["Contents"][3]["Size"] == 30 and got["Contents"][3]["ETag"] == '"etag3"'


def test_list_objects_v2_minimal_and_empty() -> None:
    body = xml.list_objects_v2_xml(
        bucket="b",
        prefix="p/",
        delimiter=None,
        max_keys=0,
        objects=[],
        common_prefixes=[],
        is_truncated=False,
    )
    root = parse(body)
    assert root.find(NS + "Delimiter") is None and root.find(NS + "ContinuationToken") is None
    assert root.find(NS + "Contents") is None and root.findtext(NS + "KeyCount") == "0"
    got = boto3_reads(body, lambda c: c.list_objects_v2(Bucket="b"))
    assert got["KeyCount"] == 0 and "Contents" not in got and got["IsTruncated"] is False


@settings(max_examples=50, deadline=None)
@given(keys=st.lists(st.text(st.characters(codec="utf-8"), min_size=1, max_size=20), max_size=5))
def test_any_key_survives_url_encoding_through_boto3(keys: list[str]) -> None:
    body = xml.list_objects_v2_xml(
        bucket="b",
        prefix="",
        delimiter=None,
        max_keys=1000,
        objects=entries(keys),
        common_prefixes=[],
        is_truncated=False,
        encoding_type="url",
    )
    got = boto3_reads(body, lambda c: c.list_objects_v2(Bucket="b"))
    assert [o["Key"] for o in got.get("Contents", [])] == keys


def test_list_objects_v1() -> None:
    body = xml.list_objects_v1_xml(
        bucket="b",
        prefix="p",
        delimiter="/",
        max_keys=2,
        marker="m a",
        objects=entries(["p1", "p2 x"]),
        common_prefixes=["p/"],
        is_truncated=True,
        next_marker="p2 x",
        encoding_type="url",
        owner_id="me",
    )
    root = parse(body)
    assert root.findtext(NS + "NextMarker") == "p2%20x" and root.findtext(NS + "Marker") == "m%20a"
    got = boto3_reads(body, lambda c: c.list_objects(Bucket="b"))
    assert got["NextMarker"] == "p2 x" and got["Marker"] == "m a" and got["IsTruncated"] is True
    assert [o["Key"] for o in got["Contents"]] == ["p1", "p2 x"]
    assert got["Contents"][0]["Owner"]["ID"] == "me"
    not_truncated = xml.list_objects_v1_xml(
        bucket="b",
        prefix="",
        delimiter=None,
        max_keys=1,
        marker=None,
        objects=[],
        common_prefixes=[],
        is_truncated=False,
        next_marker="x",
    )
    assert parse(not_truncated).find(NS + "NextMarker") is None


def test_list_object_versions() -> None:
    body = xml.list_object_versions_xml(
        bucket="b",
        prefix="",
        delimiter=None,
        max_keys=10,
        key_marker=None,
        objects=entries(["a", "b c"]),
        common_prefixes=[],
        is_truncated=True,
        next_key_marker="b c",
        encoding_type="url",
        owner_id="me",
    )
    root = parse(body)
    assert root.tag == NS + "ListVersionsResult"
    got = boto3_reads(body, lambda c: c.list_object_versions(Bucket="b"))
    assert [(v["Key"], v["VersionId"], v["IsLatest"]) for v in got["Versions"]] == [
        ("a", "null", True),
        ("b c", "null", True),
    ]
    assert got["NextKeyMarker"] == "b c" and got["IsTruncated"] is True


# -- multipart, copy, delete, bucket answers ----------------------------------------------------------


def test_multipart_answers() -> None:
    got = boto3_reads(
        xml.initiate_multipart_xml("b", "k y", "up/1+"),
        lambda c: c.create_multipart_upload(Bucket="b", Key="k y"),
    )
    assert (got["Bucket"], got["Key"], got["UploadId"]) == ("b", "k y", "up/1+")
    body = xml.complete_multipart_xml("http://h/b/k", "b", "k", "abc-2")
    assert parse(body).findtext(NS + "ETag") == '"abc-2"'
    got = boto3_reads(
        body,
        lambda c: c.complete_multipart_upload(
            Bucket="b", Key="k", UploadId="u", MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": "e"}]}
        ),
    )
    assert got["ETag"] == '"abc-2"' and got["Location"] == "http://h/b/k"
    got = boto3_reads(
        xml.copy_part_xml('"already-quoted"', WHEN),
        lambda c: c.upload_part_copy(Bucket="b", Key="k", UploadId="u", PartNumber=1, CopySource="b/s"),
    )
    assert got["CopyPartResult"] == {"ETag": '"already-quoted"', "LastModified": WHEN}


def test_copy_object_answer() -> None:
    got = boto3_reads(
        xml.copy_object_xml("e1", WHEN), lambda c: c.copy_object(Bucket="b", Key="k", CopySource="b/s")
    )
    assert got["CopyObjectResult"] == {"ETag": '"e1"', "LastModified": WHEN}


def test_list_parts() -> None:
    parts = [xml.PartEntry(1, "e1", 5 << 20, WHEN), xml.PartEntry(3, "e3", 7, WHEN)]
    body = xml.list_parts_xml(
        bucket="b",
        key="k",
        upload_id="u",
        part_number_marker=0,
        next_part_number_marker=3,
        max_parts=2,
        is_truncated=True,
        parts=parts,
        owner_id="me",
        initiated=WHEN,
    )
    got = boto3_reads(body, lambda c: c.list_parts(Bucket="b", Key="k", UploadId="u"))
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in got["Parts"]] == [
        (1, '"e1"', 5 << 20),
        (3, '"e3"', 7),
    ]
    assert got["NextPartNumberMarker"] == 3 and got["IsTruncated"] is True and got["MaxParts"] == 2
    assert got["Initiator"]["ID"] == "me" and got["StorageClass"] == "STANDARD"


def test_list_multipart_uploads() -> None:
    uploads = [xml.UploadEntry("k 1", "u1", WHEN), xml.UploadEntry("k2", "u2", WHEN)]
    body = xml.list_multipart_uploads_xml(
        bucket="b", prefix="", key_marker="", max_uploads=2, is_truncated=True, uploads=uploads, owner_id="me"
    )
    got = boto3_reads(body, lambda c: c.list_multipart_uploads(Bucket="b"))
    assert [(u["Key"], u["UploadId"], u["Initiated"]) for u in got["Uploads"]] == [
        ("k 1", "u1", WHEN),
        ("k2", "u2", WHEN),
    ]
    assert (got["NextKeyMarker"], got["NextUploadIdMarker"]) == ("k2", "u2")


@pytest.mark.parametrize("quiet", [False, True])
def test_delete_result(quiet: bool) -> None:
    body = xml.delete_result_xml(["a", "b&c"], [("x", "AccessDenied", "Access Denied")], quiet)
    got = boto3_reads(body, lambda c: c.delete_objects(Bucket="b", Delete={"Objects": [{"Key": "a"}]}))
    assert [d["Key"] for d in got.get("Deleted", [])] == ([] if quiet else ["a", "b&c"])
    assert got["Errors"] == [{"Key": "x", "Code": "AccessDenied", "Message": "Access Denied"}]


def test_location_and_versioning() -> None:
    assert parse(xml.location_xml(None)).text is None
    assert (
        boto3_reads(xml.location_xml(None), lambda c: c.get_bucket_location(Bucket="b")).get(
            "LocationConstraint"
        )
        is None
    )
    got = boto3_reads(xml.location_xml("eu-west-1"), lambda c: c.get_bucket_location(Bucket="b"))
    assert got["LocationConstraint"] == "eu-west-1"
    root = parse(xml.versioning_xml())
    assert root.tag == NS + "VersioningConfiguration" and len(root) == 0
    assert "Status" not in boto3_reads(xml.versioning_xml(), lambda c: c.get_bucket_versioning(Bucket="b"))


def test_control_characters_are_escaped_as_references() -> None:
    body = xml.list_objects_v2_xml(
        bucket="b",
        prefix="",
        delimiter=None,
        max_keys=1,
        objects=entries(["a\x01b"]),
        common_prefixes=[],
        is_truncated=False,
    )
    assert b"a&#x1;b" in body  # as S3 does; clients that need such keys ask for encoding-type=url


# -- request bodies ------------------------------------------------------------------------------------


def wire_body(call: Callable[[Any], Any]) -> bytes:
    return boto3_wire(boto3_client("http://s3.test"), call).body


def test_complete_multipart_as_boto3_writes_it() -> None:
    parts = [{"PartNumber": n, "ETag": f'"etag{n}"', "ChecksumCRC32": "AAAAAA=="} for n in (1, 2, 10)]
    body = wire_body(
        lambda c: c.complete_multipart_upload(
            Bucket="b", Key="k", UploadId="u", MultipartUpload={"Parts": parts}
        )
    )
    assert xml.parse_complete_multipart(body) == [(1, "etag1"), (2, "etag2"), (10, "etag10")]


def _complete(*parts: tuple[str, str]) -> bytes:
    inner = "".join(f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>" for n, e in parts)
    return f"<CompleteMultipartUpload>{inner}</CompleteMultipartUpload>".encode()


def test_complete_multipart_errors() -> None:
    assert xml.parse_complete_multipart(_complete(("1", "&quot;a&quot;"), ("2", "b"))) == [(1, "a"), (2, "b")]
    with pytest.raises(errors.InvalidPartOrder):
        xml.parse_complete_multipart(_complete(("2", "a"), ("1", "b")))
    with pytest.raises(errors.InvalidPartOrder):
        xml.parse_complete_multipart(_complete(("1", "a"), ("1", "b")))
    for bad in ("0", "10001"):
        with pytest.raises(errors.InvalidArgument):
            xml.parse_complete_multipart(_complete((bad, "a")))
    for body in (
        _complete(),
        _complete(("x", "a")),
        _complete(("-1", "a")),
        b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber></Part></CompleteMultipartUpload>",
        b"<CompleteMultipartUpload><Other/></CompleteMultipartUpload>",
        b"<Delete><Object><Key>k</Key></Object></Delete>",
        b"<CompleteMultipartUpload>",
        b"",
        b"not xml at all",
    ):
        with pytest.raises(errors.MalformedXML):
            xml.parse_complete_multipart(body)
    ten_thousand = _complete(*[(str(n), "e") for n in range(1, 10001)])
    assert len(xml.parse_complete_multipart(ten_thousand)) == 10000


def test_delete_as_boto3_writes_it() -> None:
    keys = ["a", "b c", "<&>", "ü"]
    body = wire_body(
        lambda c: c.delete_objects(Bucket="b", Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True})
    )
    assert xml.parse_delete(body) == (keys, True)
    body = wire_body(
        lambda c: c.delete_objects(Bucket="b", Delete={"Objects": [{"Key": "k", "VersionId": "v"}]})
    )
    assert xml.parse_delete(body) == (["k"], False)


def test_delete_limits_and_errors() -> None:
    def doc(n: int, extra: str = "") -> bytes:
        return ("<Delete>" + extra + "<Object><Key>k</Key></Object>" * n + "</Delete>").encode()

    assert len(xml.parse_delete(doc(1000))[0]) == 1000
    for body in (
        doc(1001),
        doc(0),
        doc(1, "<Quiet>maybe</Quiet>"),
        doc(1, "<Other/>"),
        b"<Delete><Object><VersionId>v</VersionId></Object></Delete>",
        b"<Delete>",
    ):
        with pytest.raises(errors.MalformedXML):
            xml.parse_delete(body)


def test_create_bucket_configuration() -> None:
    body = wire_body(
        lambda c: c.create_bucket(Bucket="b", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    )
    assert xml.parse_create_bucket(body) == "eu-west-1"
    assert xml.parse_create_bucket(b"") is None
    assert xml.parse_create_bucket(b"  \n") is None
    assert xml.parse_create_bucket(b"<CreateBucketConfiguration/>") is None
    with pytest.raises(errors.MalformedXML):
        xml.parse_create_bucket(b"<Other/>")


# -- hostile documents -----------------------------------------------------------------------------

BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
]>
<Delete><Object><Key>&lol4;</Key></Object></Delete>"""

EXTERNAL = b"""<?xml version="1.0"?>
<!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]>
<Delete><Object><Key>&x;</Key></Object></Delete>"""


@pytest.mark.parametrize(
    "body",
    [
        BILLION_LAUGHS,
        EXTERNAL,
        b'<!DOCTYPE Delete SYSTEM "http://example.com/x.dtd"><Delete><Object><Key>k</Key></Object></Delete>',
        b"<!DOCTYPE Delete><Delete><Object><Key>k</Key></Object></Delete>",
        BILLION_LAUGHS.decode().replace('version="1.0"', 'version="1.0" encoding="UTF-16"').encode("utf-16"),
        b"<Delete>" + b"<Object>" * 50 + b"</Object>" * 50 + b"</Delete>",
        b"<Delete><Object><Key>&undefined;</Key></Object></Delete>",
        b"<Delete><Object><Key>k</Key></Object></Delete><Second/>",
        b"<Delete><Object><Key>\xff\xfe</Key></Object></Delete>",
    ],
)
def test_hostile_documents_are_malformed(body: bytes) -> None:
    with pytest.raises(errors.MalformedXML):
        xml.parse_delete(body)


def test_size_bound() -> None:
    with pytest.raises(errors.MalformedXML, match="too large"):
        xml.parse_xml(b" " * (xml.MAX_BODY + 1))


def test_namespaces_and_declarations_are_accepted() -> None:
    body = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<!-- c -->'
        b'<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        b"<Object><Key><![CDATA[a<b]]></Key></Object></Delete>"
    )
    assert xml.parse_delete(body) == (["a<b"], False)
