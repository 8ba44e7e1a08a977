"""Through the real `tsproxy serve`: a SigV4 scope naming another region is refused as S3 refuses it
(header and presigned URL), and the access log can be switched off and shows the Range asked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
import urllib3
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config as BotoConfig
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.server.harness import free_port
from tsproxy.config import DEV_ACCESS_KEY, DEV_SECRET_KEY

http = urllib3.PoolManager(retries=False)


@dataclass
class Serving:
    proc: subprocess.Popen[str]
    endpoint: str
    log_path: Path

    def client(self, region: str = "eu-west-1") -> Any:
        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=region,
            aws_access_key_id=DEV_ACCESS_KEY, aws_secret_access_key=DEV_SECRET_KEY,
            config=BotoConfig(
                s3={"addressing_style": "path"}, retries={"max_attempts": 1}, signature_version="s3v4"
            ),
        )  # fmt: skip

    def access_lines(self) -> list[dict[str, Any]]:
        lines = [json.loads(x) for x in self.log_path.read_text().splitlines() if x.startswith("{")]
        return [x for x in lines if x["logger"] == "tsproxy.access"]


def _serve(tmp: Path, *args: str, env: dict[str, str] | None = None) -> Serving:
    port = free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TSPROXY_")}
    environment.update(env or {})
    log_path = tmp / f"stderr-{port}.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tsproxy.cli", "serve", "--listen", f"127.0.0.1:{port}",
             "--metrics-listen", "off", "--backend-check", "0", *args],
            cwd=tmp, env=environment, stdout=subprocess.PIPE, stderr=log_file, text=True,
        )  # fmt: skip
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline())["msg"] == "tsproxy serving S3"
    return Serving(proc, f"http://127.0.0.1:{port}", log_path)


@pytest.fixture
def eu(tmp_path: Path) -> Iterator[Serving]:
    s = _serve(tmp_path, "--region", "eu-west-1")
    yield s
    s.proc.kill()
    s.proc.wait()


def _region_error(body: bytes) -> tuple[str, str, str | None]:
    root = ET.fromstring(body)
    return root.findtext("Code") or "", root.findtext("Message") or "", root.findtext("Region")


def test_a_scope_in_another_region_is_refused_in_the_header(eu: Serving) -> None:
    eu.client().create_bucket(Bucket="regional")
    url = f"{eu.endpoint}/regional/k"
    req = AWSRequest(method="PUT", url=url, data=b"x")
    S3SigV4Auth(Credentials(DEV_ACCESS_KEY, DEV_SECRET_KEY), "s3", "us-east-1").add_auth(req)
    resp = http.request("PUT", url, body=b"x", headers=dict(req.headers.items()))
    assert resp.status == 400
    assert _region_error(resp.data) == (
        "AuthorizationHeaderMalformed",
        "The authorization header is malformed; the region 'us-east-1' is wrong; expecting 'eu-west-1'",
        "eu-west-1",
    )
    assert eu.client().list_objects_v2(Bucket="regional").get("KeyCount") == 0  # nothing was written
    # SDKs read <Region> and sign again for it, as they do against S3: boto3 gets there on its own.
    eu.client(region="us-east-1").put_object(Bucket="regional", Key="k", Body=b"x")
    deadline = time.monotonic() + 30  # the line follows the response: wait for it, do not race it
    while [x["status"] for x in eu.access_lines() if x["operation"] == "PutObject"][-1:] != [200]:
        assert time.monotonic() < deadline, "no access line for the signed-again PUT"
        time.sleep(0.05)
    statuses = [x["status"] for x in eu.access_lines() if x["operation"] == "PutObject"]
    assert statuses[-2:] == [400, 200]


def test_a_scope_in_another_region_is_refused_in_a_presigned_url(eu: Serving) -> None:
    eu.client().create_bucket(Bucket="regional")
    eu.client().put_object(Bucket="regional", Key="k", Body=b"right region")
    good = eu.client().generate_presigned_url("get_object", Params={"Bucket": "regional", "Key": "k"})
    assert http.request("GET", good).data == b"right region"
    url = eu.client(region="us-east-1").generate_presigned_url(
        "get_object", Params={"Bucket": "regional", "Key": "k"}
    )
    assert "X-Amz-Credential=" in url and "%2Fus-east-1%2F" in url
    resp = http.request("GET", url)
    assert resp.status == 400
    assert _region_error(resp.data) == (
        "AuthorizationQueryParametersError",
        "Error parsing the X-Amz-Credential parameter; "
        "the region 'us-east-1' is wrong; expecting 'eu-west-1'",
        "eu-west-1",
    )


def test_access_lines_show_the_range(eu: Serving) -> None:
    s3 = eu.client()
    s3.create_bucket(Bucket="ranged")
    s3.put_object(Bucket="ranged", Key="k", Body=b"0123456789")
    assert s3.get_object(Bucket="ranged", Key="k", Range="bytes=2-5")["Body"].read() == b"2345"
    deadline = time.monotonic() + 30
    while not [x for x in eu.access_lines() if x["operation"] == "GetObject"]:
        assert time.monotonic() < deadline, "no access line for the GET"
        time.sleep(0.05)
    (get,) = [x for x in eu.access_lines() if x["operation"] == "GetObject"]
    assert (get["status"], get["range"], get["bytes_out"]) == (206, "bytes=2-5", 4)
    (put,) = [x for x in eu.access_lines() if x["operation"] == "PutObject"]
    assert "range" not in put


@pytest.mark.parametrize("switch", ["flag", "env", "toml"])
def test_access_log_can_be_switched_off(tmp_path: Path, switch: str) -> None:
    args: list[str] = []
    env: dict[str, str] = {}
    if switch == "flag":
        args = ["--access-log", "off"]
    elif switch == "env":
        env = {"TSPROXY_ACCESS_LOG": "off"}
    else:
        (tmp_path / "t.toml").write_text("access_log = false\n")
        args = ["--config", "t.toml"]
    s = _serve(tmp_path, *args, env=env)
    try:
        s3 = s.client(region="us-east-1")
        s3.create_bucket(Bucket="quiet")
        s3.put_object(Bucket="quiet", Key="k", Body=b"x")
        s3.head_object(Bucket="quiet", Key="k")
        with pytest.raises(ClientError):  # an error would be logged too, were the log on
            s3.get_object(Bucket="quiet", Key="absent")
    finally:
        s.proc.terminate()
        s.proc.wait(30)
    lines = [json.loads(x) for x in s.log_path.read_text().splitlines() if x.startswith("{")]
    assert lines, "the log itself is still on"
    assert not [x for x in lines if x["logger"] == "tsproxy.access"]
