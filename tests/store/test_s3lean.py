"""The lean GetObject path: its SigV4 signature, checked against AWS's published example and against
botocore's own signer, and its answers over a real SeaweedFS read the same as botocore's."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import botocore.auth
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from yarl import URL

from tests.support.faulty_proxy import FaultyProxy
from tests.support.tunnel import ConnectProxy, TlsFront, certificate_for
from tsproxy import errors
from tsproxy.s3.sigv4 import uri_encode
from tsproxy.store.s3 import S3Backend
from tsproxy.store.s3lean import authorization, env_proxy

EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_signature_of_aws_published_get_object_example() -> None:
    # "Example: GET Object" of AWS's Signature Version 4 documentation for S3 (header form).
    headers = {
        "Host": "examplebucket.s3.amazonaws.com",
        "Range": "bytes=0-9",
        "x-amz-content-sha256": EMPTY_SHA256,
        "x-amz-date": "20130524T000000Z",
    }
    got = authorization(
        "GET",
        "/test.txt",
        headers,
        access_key="AKIAIOSFODNN7EXAMPLE",
        secret_key="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        region="us-east-1",
        amz_date="20130524T000000Z",
        payload_hash=EMPTY_SHA256,
    )
    assert got == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )


@pytest.mark.parametrize(
    "key", ["plain.log", "a b/c+d=e&f", "ü/日本/~x*'()!", "dir//double/", "%41 literal", "-_.~"]
)
def test_signature_equals_botocores_for_awkward_keys_and_a_session_token(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    amz_date = "20261125T101500Z"
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: datetime(2026, 11, 25, 10, 15, 0))
    path = "/bucket/" + uri_encode(key.encode(), keep_slash=True)
    headers = {
        "host": "127.0.0.1:8333",
        "x-amz-content-sha256": EMPTY_SHA256,  # what botocore signs for a GET's empty body
        "x-amz-date": amz_date,
        "range": "bytes=5-1048580",
        "if-match": '"0123456789abcdef0123456789abcdef"',
        "x-amz-security-token": "FwoGZXIvYXdzE//token==",
    }
    ours = authorization(
        "GET",
        path,
        headers,
        access_key="AKID",
        secret_key="secret/key+1",
        region="eu-west-3",
        amz_date=amz_date,
        payload_hash=EMPTY_SHA256,
    )
    request = AWSRequest(method="GET", url="http://127.0.0.1:8333" + path, headers=dict(headers))
    signer = S3SigV4Auth(Credentials("AKID", "secret/key+1", "FwoGZXIvYXdzE//token=="), "s3", "eu-west-3")
    signer.add_auth(request)
    assert ours == request.headers["Authorization"]


def test_answers_match_botocores_over_seaweedfs(seaweed: Any) -> None:
    bucket = f"lean-{uuid.uuid4().hex[:10]}"
    direct = seaweed.boto3_client()
    direct.create_bucket(Bucket=bucket)
    data = os.urandom(3 << 20)
    key = "topic-0/ü sp+ace/00000000000000000000.log"
    direct.put_object(Bucket=bucket, Key=key, Body=data, Metadata={"origin": "broker-1"}, ContentType="x/y")
    options = seaweed.backend_options()

    async def run() -> None:
        lean = S3Backend(**options)
        botocore_path = S3Backend(**options, lean_gets=False)
        await lean.start()
        await botocore_path.start()
        try:
            assert lean.lean is not None and botocore_path.lean is None
            for first, last in [(0, 99), (1 << 20, (2 << 20) + 17), (None, None), (len(data) - 5, None)]:
                a_info, a = await lean.get_bytes(bucket, key, first, last)
                b_info, b = await botocore_path.get_bytes(bucket, key, first, last)
                assert a == b
                assert a_info == b_info
            info, _ = await lean.get_bytes(bucket, key, 0, 0)
            assert info.metadata == {"origin": "broker-1"} and info.content_type == "x/y"
            assert info.last_modified.tzinfo is not None
            assert info.last_modified <= datetime.now(UTC)
            with pytest.raises(errors.NoSuchKey):
                await lean.get_bytes(bucket, key + ".missing")
            with pytest.raises(errors.PreconditionFailed):
                await lean.get_bytes(bucket, key, 0, 9, if_match="0" * 32)
            with pytest.raises(errors.NoSuchBucket):
                await lean.get_bytes(bucket + "-gone", key)
            # A body abandoned half way drops its connection; the next GET still works.
            reader = await lean.get(bucket, key)
            async for _ in reader:
                break
            await reader.close()
            assert (await lean.get_bytes(bucket, key, 10, 19))[1] == data[10:20]
        finally:
            await lean.close()
            await botocore_path.close()

    asyncio.run(run())


def test_a_part_sent_as_it_is_produced_is_checked_by_its_etag(seaweed: Any) -> None:
    """Sent without a Content-MD5 (the digest comes at the end), a part's ETag must be the MD5 the writer
    computed; when it is not, the part is sent again with that Content-MD5, so a wrong digest is refused
    by the store (and bytes damaged on the way are replaced by a checked copy), never accepted. A body
    that fails stores nothing."""
    bucket = f"lean-{uuid.uuid4().hex[:10]}"
    seaweed.boto3_client().create_bucket(Bucket=bucket)
    data = os.urandom(6 << 20)
    digest = hashlib.md5(data).digest()

    async def pieces(fail_at: int | None = None) -> AsyncIterator[bytes]:
        for pos in range(0, len(data), 1 << 20):
            if fail_at is not None and pos >= fail_at:
                raise ConnectionResetError("the client went away")
            yield data[pos : pos + (1 << 20)]
            await asyncio.sleep(0)

    async def run() -> None:
        backend = S3Backend(**seaweed.backend_options())
        await backend.start()
        try:
            upload = await backend.create_multipart(bucket, "seg")
            etag = await backend.upload_part(
                bucket, "seg", upload, 1, pieces(), len(data), content_md5=lambda: digest
            )
            assert etag == digest.hex() and backend.etags_are_md5
            wrong = hashlib.md5(b"something else").digest()
            with pytest.raises(errors.BadDigest):
                await backend.upload_part(
                    bucket, "seg", upload, 2, pieces(), len(data), content_md5=lambda: wrong
                )
            with pytest.raises(ConnectionResetError):
                await backend.upload_part(
                    bucket, "seg", upload, 3, pieces(fail_at=3 << 20), len(data), content_md5=lambda: digest
                )
            # (Part 2's unchecked first sending may stay behind in the backend upload: never acknowledged,
            # a completion leaves it out.) The body that failed left nothing.
            listed = await backend.list_parts(bucket, "seg", upload)
            assert 3 not in {no for no, _ in listed}, listed
            assert backend.etags_are_md5
        finally:
            await backend.close()

    asyncio.run(run())


def test_a_gathered_part_goes_lean_with_its_content_md5(
    seaweed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part in hand (a compressed part, sealed whole) goes through the lean client, not botocore, with
    its Content-MD5: the store checks it, so a wrong digest is refused and nothing is kept. Without the
    lean client, botocore sends it the same way."""
    bucket = f"lean-{uuid.uuid4().hex[:10]}"
    seaweed.boto3_client().create_bucket(Bucket=bucket)
    data = os.urandom(6 << 20)
    digest = hashlib.md5(data).digest()
    wrong = hashlib.md5(b"something else").digest()

    async def run(lean: bool) -> None:
        backend = S3Backend(**seaweed.backend_options(), lean_gets=lean)
        await backend.start()
        try:
            if lean:

                async def botocore_upload_part(**_: Any) -> Any:
                    raise AssertionError("a gathered part went through botocore")

                monkeypatch.setattr(backend.client, "upload_part", botocore_upload_part)
            upload = await backend.create_multipart(bucket, f"seg-{lean}")
            assert await backend.upload_part(bucket, f"seg-{lean}", upload, 1, data, content_md5=digest) == (
                digest.hex()
            )
            with pytest.raises(errors.BadDigest):
                await backend.upload_part(bucket, f"seg-{lean}", upload, 2, data, content_md5=wrong)
            listed = await backend.list_parts(bucket, f"seg-{lean}", upload)
            assert [no for no, _ in listed] == [1], listed
            await backend.abort_multipart(bucket, f"seg-{lean}", upload)
        finally:
            await backend.close()

    asyncio.run(run(lean=True))
    monkeypatch.undo()
    asyncio.run(run(lean=False))


def test_a_part_whose_connection_is_lost_while_sending_is_sent_again_whole(seaweed: Any) -> None:
    """The store's connection lost half way through a part sent as it is produced: the part's producer
    is not cut off with it (its end is what gives the digest), the rest of the part is still taken from
    it exactly once, and the part is sent again, whole, with its Content-MD5."""
    bucket = f"lean-{uuid.uuid4().hex[:10]}"
    seaweed.boto3_client().create_bucket(Bucket=bucket)
    data = os.urandom(6 << 20)
    produced: list[int] = []
    ended: list[bytes] = []

    async def pieces() -> AsyncIterator[bytes]:
        for pos in range(0, len(data), 256 << 10):
            await asyncio.sleep(0.002)  # produced over time, as received from a client
            produced.append(pos)
            yield data[pos : pos + (256 << 10)]
        ended.append(hashlib.md5(data).digest())  # known only once the producer has run to its end

    async def run(endpoint: str) -> tuple[str, list[tuple[int, str]], bytes]:
        backend = S3Backend(**seaweed.backend_options(endpoint))
        await backend.start()
        try:
            upload = await backend.create_multipart(bucket, "seg")
            etag = await backend.upload_part(
                bucket, "seg", upload, 1, pieces(), len(data), content_md5=lambda: ended[0]
            )
            listed = await backend.list_parts(bucket, "seg", upload)
            await backend.complete_multipart(bucket, "seg", upload, [(1, etag)])
            return etag, listed, (await backend.get_bytes(bucket, "seg"))[1]
        finally:
            await backend.close()

    with FaultyProxy.threaded(seaweed.endpoint) as proxy:
        proxy.inject("cut_request", method="PUT", path=r"uploadId=", truncate_at=2 << 20)
        etag, listed, stored = asyncio.run(run(proxy.endpoint))
        assert proxy.count(fault="cut_request") == 1
        puts = [s for s in proxy.seen if s.method == "PUT"]
    assert etag == hashlib.md5(data).hexdigest()
    assert produced == list(range(0, len(data), 256 << 10))  # each piece taken once
    assert len(puts) == 2 and "content-md5" in puts[1].headers and "content-md5" not in puts[0].headers
    assert [no for no, _ in listed] == [1]
    assert stored == data


def _no_proxy_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


async def _streamed_part_then_get(options: dict[str, Any], bucket: str, data: bytes) -> tuple[str, bytes]:
    """Over an S3Backend made with `options`: `data` uploaded as the one part of a multipart upload,
    streamed by the lean path, completed, then read back from its byte 10 by a lean GET. The part's
    ETag and the bytes read."""
    backend = S3Backend(**options)
    await backend.start()
    try:
        assert backend.lean is not None
        upload = await backend.create_multipart(bucket, "seg")
        md5 = hashlib.md5(data).digest()

        async def pieces() -> AsyncIterator[bytes]:
            yield data

        etag = await backend.upload_part(
            bucket, "seg", upload, 1, pieces(), len(data), content_md5=lambda: md5
        )
        await backend.complete_multipart(bucket, "seg", upload, [(1, etag)])
        return etag, (await backend.get_bytes(bucket, "seg", 10, len(data) - 1))[1]
    finally:
        await backend.close()


def test_gets_and_streamed_parts_go_through_the_proxy_the_environment_names(
    seaweed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY (with credentials in its URL) carries the lean path's requests, whatever the backend's
    host name resolves to; NO_PROXY exempts a host, whose requests go direct."""
    bucket = f"lean-{uuid.uuid4().hex[:10]}"
    seaweed.boto3_client().create_bucket(Bucket=bucket)
    data = os.urandom(1 << 20)
    port = seaweed.endpoint.rsplit(":", 1)[1]
    # No resolver knows this name: only the proxy, which sends everything to SeaweedFS, can reach it.
    behind = f"http://store-behind-the-proxy.invalid:{port}"

    def run(endpoint: str) -> bytes:
        return asyncio.run(_streamed_part_then_get(seaweed.backend_options(endpoint), bucket, data))[1]

    _no_proxy_settings(monkeypatch)
    with FaultyProxy.threaded(seaweed.endpoint) as proxy:
        named = proxy.endpoint.replace("http://", "http://relay:pass%20word@")
        monkeypatch.setenv("http_proxy", named)
        assert run(behind) == data[10:]
        lean = [s for s in proxy.seen if s.path.startswith(f"/{bucket}/seg?partNumber") or s.method == "GET"]
        assert {s.method for s in lean} >= {"PUT", "GET"}
        assert all(s.headers.get("host") == behind.removeprefix("http://") for s in proxy.seen)
        auth = base64.b64encode(b"relay:pass word").decode()
        assert {s.headers.get("proxy-authorization") for s in lean} == {f"Basic {auth}"}

        before = len(proxy.seen)
        monkeypatch.setenv("no_proxy", "127.0.0.1")
        assert run(seaweed.endpoint) == data[10:]
        assert len(proxy.seen) == before


def test_proxy_credentials_go_where_each_scheme_sends_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain http request through a proxy carries Proxy-Authorization itself; an https request gives
    it to aiohttp for the CONNECT only, so the store behind the tunnel never sees it. No deprecated
    `proxy_auth` either way."""
    _no_proxy_settings(monkeypatch)
    monkeypatch.setenv("http_proxy", "http://relay:secret@proxy.example:3128")
    monkeypatch.setenv("https_proxy", "http://relay:secret@proxy.example:3128")
    auth = "Basic " + base64.b64encode(b"relay:secret").decode()
    plain, plain_headers = env_proxy(URL("http://store.example:8333/b/k"))
    assert plain == {"proxy": URL("http://proxy.example:3128")}
    assert plain_headers == {"Proxy-Authorization": auth}
    tls, tls_headers = env_proxy(URL("https://store.example/b/k"))
    assert tls == {"proxy": URL("http://proxy.example:3128"), "proxy_headers": {"Proxy-Authorization": auth}}
    assert tls_headers == {}
    monkeypatch.setenv("no_proxy", "store.example")
    assert env_proxy(URL("https://store.example/b/k")) == ({}, {})


def test_an_https_store_is_reached_through_a_connect_tunnel_with_the_proxys_credentials(
    seaweed: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """HTTPS_PROXY with credentials in its URL, end to end: every request to an https store (botocore's
    and the lean path's) goes through a CONNECT tunnel that the proxy grants only with those
    credentials, the store's certificate is checked against the CA `verify` names, and the credentials
    never reach the store inside the tunnel. The store is SeaweedFS behind a TLS front."""
    bucket = f"lean-{uuid.uuid4().hex[:10]}"
    seaweed.boto3_client().create_bucket(Bucket=bucket)
    data = os.urandom(1 << 20)
    name = "store-behind-the-proxy.invalid"  # resolves nowhere: only the tunnel reaches it
    certificate = certificate_for(name, tmp_path / "tls")
    auth = "Basic " + base64.b64encode(b"relay:pass word").decode()

    def run(endpoint: str) -> bytes:
        options = seaweed.backend_options(endpoint, verify=str(certificate.ca), max_attempts=1)
        etag, got = asyncio.run(_streamed_part_then_get(options, bucket, data))
        assert etag == hashlib.md5(data).hexdigest()
        return got

    _no_proxy_settings(monkeypatch)
    with (
        TlsFront(seaweed.endpoint.removeprefix("http://"), certificate) as front,
        ConnectProxy(f"127.0.0.1:{front.port}", auth) as proxy,
    ):
        endpoint = f"https://{name}:{front.port}"
        monkeypatch.setenv("https_proxy", f"http://relay:pass%20word@127.0.0.1:{proxy.port}")
        assert run(endpoint) == data[10:]
        assert proxy.connects and proxy.refused == 0
        assert {c["request"] for c in proxy.connects} == {f"CONNECT {name}:{front.port} HTTP/1.1"}
        sent = b"".join(front.received)
        assert f"PUT /{bucket}/seg?partNumber=1&uploadId=".encode() in sent  # the lean path's part
        assert f"GET /{bucket}/seg HTTP/1.1".encode() in sent  # and its GET
        assert b"POST" in sent  # botocore's create and complete
        assert b"proxy-authorization" not in sent.lower() and b"relay" not in sent

        # The wrong credentials: the proxy refuses the tunnel and the store sees nothing.
        monkeypatch.setenv("https_proxy", f"http://relay:wrong@127.0.0.1:{proxy.port}")
        before = len(front.received)
        with pytest.raises(errors.S3Error):
            run(endpoint)
        assert proxy.refused >= 1 and len(front.received) == before
