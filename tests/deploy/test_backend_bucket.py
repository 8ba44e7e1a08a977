"""With `backend_bucket`, a client bucket exists once it was created through tsproxy: the step that
deploy/kubernetes/README.md gives (and the TsproxyUploadsFailing runbook points to), run as written
with the aws cli against a tsproxy on SeaweedFS."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from tests.deploy.deploy_tools import DEPLOY, REPO, find_tool, serving
from tests.support.as_user import ENTRY_POINT
from tests.support.ports import free_port

README = DEPLOY / "kubernetes" / "README.md"
CLIENT_KEY, CLIENT_SECRET = "broker", "broker-secret-key"


def _documented_mb() -> tuple[str, list[str]]:
    """The README's `aws ... s3 mb` line (its port, its words) and the bucket it creates."""
    (line,) = [x for x in README.read_text().splitlines() if x.startswith("aws ") and " s3 mb " in x]
    words = line.split()
    return line, words


def _aws(args: list[str], port: int) -> subprocess.CompletedProcess[str]:
    aws = find_tool("aws") or str(REPO / ".tools" / "awscli" / "bin" / "aws")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=CLIENT_KEY, AWS_SECRET_ACCESS_KEY=CLIENT_SECRET)
    return subprocess.run([aws, *args], env=env, capture_output=True, text=True, timeout=120, check=False)


def test_the_documented_bucket_creation_is_what_uploads_need(
    tmp_path: Path, seaweed: Any, seaweed_bucket: str
) -> None:
    line, words = _documented_mb()
    bucket = words[-1].removeprefix("s3://")
    assert bucket == "kafka-tiered-storage"  # the StatefulSet's KAFKA_RSM_CONFIG_STORAGE_S3_BUCKET_NAME
    documented_port = int(re.search(r"http://127\.0\.0\.1:(\d+)", line).group(1))  # type: ignore[union-attr]
    port, metrics_port = free_port(), free_port()
    env = {
        "TSPROXY_ACCESS_KEY": CLIENT_KEY,
        "TSPROXY_SECRET_KEY": CLIENT_SECRET,
        "TSPROXY_BACKEND": seaweed.endpoint,
        "TSPROXY_BACKEND_ACCESS_KEY": seaweed.access_key,
        "TSPROXY_BACKEND_SECRET_KEY": seaweed.secret_key,
        "TSPROXY_BACKEND_BUCKET": seaweed_bucket,
        "TSPROXY_BACKEND_PREFIX": "prod-cluster-1/",
    }
    subprocess.run([str(ENTRY_POINT), "keys", "init", "--key-ring", str(tmp_path / "ring.json")], check=True)
    argv = [str(ENTRY_POINT), "serve", "--listen", f"127.0.0.1:{port}", "--metrics-listen",
            f"127.0.0.1:{metrics_port}", "--key-ring", "ring.json"]  # fmt: skip
    (tmp_path / "segment").write_bytes(os.urandom(9 << 20))  # multipart, as a broker uploads a segment
    endpoint = ["--endpoint-url", f"http://127.0.0.1:{port}", "--region", "us-east-1"]
    upload = [*endpoint, "s3", "cp", str(tmp_path / "segment"), f"s3://{bucket}/topic-0/00000.log"]
    with serving(argv, tmp_path, metrics_port, env):
        before = _aws(upload, port)
        assert before.returncode != 0 and "NoSuchBucket" in before.stderr, before.stderr
        # The README's command as written; only its port is this test's tsproxy's (the README's is
        # the local end of `kubectl port-forward`).
        made = _aws(line.replace(f":{documented_port}", f":{port}").split()[1:], port)
        assert made.returncode == 0, made.stderr
        after = _aws(upload, port)
        assert after.returncode == 0, after.stderr
    listed = seaweed.boto3_client().list_objects_v2(Bucket=seaweed_bucket, Prefix=f"prod-cluster-1/{bucket}/")
    assert any(o["Key"].endswith("topic-0/00000.log") for o in listed.get("Contents", []))
