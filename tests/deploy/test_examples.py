"""Client configuration examples: each points at the local tsproxy, path-style, with the right credential
settings, and the pyarrow and aws cli ones read objects through a running tsproxy.
"""

from __future__ import annotations

import ast
import configparser
import importlib.util
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import boto3
import pytest
from botocore.config import Config as BotoConfig
from deploy_tools import DEPLOY, REPO, find_tool, serving

from tests.support.ports import free_port
from tsproxy import config

EXAMPLES = DEPLOY / "examples"
DEFAULTS = config.Config()
ENDPOINT = f"http://localhost:{DEFAULTS.listen[1]}"
ENV_KEYS = ("${env:TSPROXY_ACCESS_KEY}", "${env:TSPROXY_SECRET_KEY}")
ENV_PROVIDER = "org.apache.kafka.common.config.provider.EnvVarConfigProvider"


def properties(name: str) -> dict[str, str]:
    """A Java properties file as written here (key=value lines, # comments, no continuations)."""
    out = {}
    for line in (EXAMPLES / name).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")):
            key, sep, value = line.partition("=")
            assert sep, f"{name}: not key=value: {line!r}"
            assert key.strip() not in out, f"{name}: {key} set twice"
            out[key.strip()] = value.strip()
    return out


def _uses_env_provider(props: dict[str, str]) -> None:
    """${env:...} references resolve only with Kafka's environment config provider declared."""
    assert props["config.providers"] == "env"
    assert props["config.providers.env.class"] == ENV_PROVIDER


def test_every_example_is_tested() -> None:
    tested = {
        "broker-aiven-rsm.properties", "broker-confluent-tiered.properties", "connect-s3-sink.properties",
        "spark_through_tsproxy.py", "aws-cli-profile.ini", "README.md",
    }  # fmt: skip
    assert {p.name for p in EXAMPLES.iterdir()} == tested


def test_aiven_rsm_broker() -> None:
    p = properties("broker-aiven-rsm.properties")
    assert p["remote.log.storage.system.enable"] == "true"
    assert p["remote.log.storage.manager.class.name"] == "io.aiven.kafka.tieredstorage.RemoteStorageManager"
    assert p["rsm.config.storage.backend.class"] == "io.aiven.kafka.tieredstorage.storage.s3.S3Storage"
    assert p["rsm.config.storage.s3.endpoint.url"] == ENDPOINT
    assert p["rsm.config.storage.s3.path.style.access.enabled"] == "true"
    assert p["rsm.config.storage.s3.region"] == DEFAULTS.region
    keys = (p["rsm.config.storage.aws.access.key.id"], p["rsm.config.storage.aws.secret.access.key"])
    assert keys == ENV_KEYS
    _uses_env_provider(p)
    # tsproxy transforms; the plugin must not, and its chunk is tsproxy's chunk.
    assert p["rsm.config.compression.enabled"] == "false"
    assert p["rsm.config.encryption.enabled"] == "false"
    assert int(p["rsm.config.chunk.size"]) == DEFAULTS.chunk_size
    assert 5 << 20 <= int(p["rsm.config.storage.s3.multipart.upload.part.size"]) <= 5 << 30
    assert not any(k.startswith("rsm.config.fetch.chunk.cache") for k in p)


def test_confluent_tiered_storage_broker() -> None:
    p = properties("broker-confluent-tiered.properties")
    assert p["confluent.tier.feature"] == "true" and p["confluent.tier.backend"] == "S3"
    assert p["confluent.tier.s3.aws.endpoint.override"] == ENDPOINT
    assert p["confluent.tier.s3.force.path.style.access"] == "true"
    assert p["confluent.tier.s3.region"] == DEFAULTS.region
    keys = (p["confluent.tier.s3.aws.access.key.id"], p["confluent.tier.s3.aws.secret.access.key"])
    assert keys == ENV_KEYS
    _uses_env_provider(p)


def test_connect_s3_sink() -> None:
    p = properties("connect-s3-sink.properties")
    assert p["connector.class"] == "io.confluent.connect.s3.S3SinkConnector"
    assert p["store.url"] == ENDPOINT
    assert p["s3.path.style.access.enabled"] == "true"
    assert p["s3.region"] == DEFAULTS.region
    assert (p["aws.access.key.id"], p["aws.secret.access.key"]) == ENV_KEYS
    assert 5 << 20 <= int(p["s3.part.size"])
    # The provider is declared in the worker's properties, which the file tells.
    assert ENV_PROVIDER in (EXAMPLES / "connect-s3-sink.properties").read_text(encoding="utf-8")


def _aws_profile() -> tuple[configparser.SectionProxy, configparser.SectionProxy]:
    parser = configparser.ConfigParser(comment_prefixes=("#",))
    parser.read(EXAMPLES / "aws-cli-profile.ini", encoding="utf-8")
    return parser["profile tsproxy"], parser["tsproxy"]


def test_aws_cli_profile() -> None:
    profile, credentials = _aws_profile()
    assert profile["endpoint_url"] == ENDPOINT
    assert profile["region"] == DEFAULTS.region
    assert "addressing_style = path" in profile["s3"]
    # The development credentials tsproxy prints at `make run`.
    assert credentials["aws_access_key_id"] == config.DEV_ACCESS_KEY
    assert credentials["aws_secret_access_key"] == config.DEV_SECRET_KEY


def _spark_example() -> ModuleType:
    pytest.importorskip("pyspark", reason="pyspark is in the spark extra")
    path = EXAMPLES / "spark_through_tsproxy.py"
    spec = importlib.util.spec_from_file_location("spark_through_tsproxy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spark_example_defaults_to_the_local_tsproxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TSPROXY_ENDPOINT", raising=False)
    monkeypatch.setenv("TSPROXY_ACCESS_KEY", "ak")
    monkeypatch.setenv("TSPROXY_SECRET_KEY", "sk")
    example = _spark_example()
    assert example.ENDPOINT == ENDPOINT
    settings = example.tsproxy_filesystem().__reduce__()[1][0]
    assert (settings["scheme"], settings["endpoint_override"]) == ("http", f"localhost:{DEFAULTS.listen[1]}")
    assert settings["force_virtual_addressing"] is False  # path style
    assert (settings["access_key"], settings["secret_key"]) == ("ak", "sk")


def test_spark_data_source_options_are_ones_the_source_knows() -> None:
    """The `tiered-kafka` options in the example pass the source's own option parser."""
    options_module = pytest.importorskip("tsproxy.spark.options", reason="no Spark source in this tree")
    tree = ast.parse((EXAMPLES / "spark_through_tsproxy.py").read_text(encoding="utf-8"))
    options: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "option":
            key = node.args[0]
            assert isinstance(key, ast.Constant) and isinstance(key.value, str)
            value = node.args[1]
            options[key.value] = str(value.value) if isinstance(value, ast.Constant) else "placeholder"
    assert options["pathStyle"] == "true" and "endpoint" in options
    assert {"accessKey", "secretKey"} <= set(options)
    options["endpoint"] = ENDPOINT
    parsed = options_module.parse_read_options(options)
    assert parsed.store.endpoint == ENDPOINT and parsed.store.path_style


# -- through a running tsproxy ------------------------------------------------------------------------------


@pytest.fixture
def dev_tsproxy(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`tsproxy serve` with its development defaults (dev credentials, local directory) on a free port."""
    tsproxy = find_tool("tsproxy")
    if tsproxy is None:
        pytest.skip("the tsproxy command is not installed in this environment (pip install -e .)")
    port, metrics_port = free_port(), free_port()
    listen, metrics = f"127.0.0.1:{port}", f"127.0.0.1:{metrics_port}"
    argv = [tsproxy, "serve", "--listen", listen, "--metrics-listen", metrics]
    with serving(argv, tmp_path, metrics_port):
        yield f"http://127.0.0.1:{port}", tmp_path


def _put(endpoint: str, bucket: str, objects: dict[str, bytes]) -> None:
    s3 = boto3.client(
        "s3", endpoint_url=endpoint, region_name=DEFAULTS.region,
        aws_access_key_id=config.DEV_ACCESS_KEY, aws_secret_access_key=config.DEV_SECRET_KEY,
        config=BotoConfig(s3={"addressing_style": "path"}),
    )  # fmt: skip
    s3.create_bucket(Bucket=bucket)
    for key, body in objects.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)


def test_pyarrow_example_reads_connect_output_through_tsproxy(
    dev_tsproxy: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, _ = dev_tsproxy
    records = b"".join(b'{"id": %d, "name": "r%d"}\n' % (i, i) for i in range(100))
    _put(endpoint, "kafka-archive", {"topics/events/partition=0/events+0+0000000000.json": records})
    monkeypatch.setenv("TSPROXY_ENDPOINT", endpoint)
    monkeypatch.setenv("TSPROXY_ACCESS_KEY", config.DEV_ACCESS_KEY)
    monkeypatch.setenv("TSPROXY_SECRET_KEY", config.DEV_SECRET_KEY)
    example = _spark_example()
    import pyarrow.dataset as ds

    table = ds.dataset("kafka-archive/topics/events", filesystem=example.tsproxy_filesystem(), format="json")
    assert sorted(table.to_table().column("id").to_pylist()) == list(range(100))


def test_aws_cli_profile_lists_and_reads_through_tsproxy(dev_tsproxy: tuple[str, Path]) -> None:
    bundled = REPO / ".tools" / "awscli" / "bin" / "aws"
    aws = find_tool("aws") or (str(bundled) if bundled.exists() else None)
    if aws is None:
        pytest.skip("aws cli is not installed (`make test` installs it in .tools/awscli)")
    endpoint, tmp = dev_tsproxy
    _put(endpoint, "demo", {"hello.txt": b"hello through tsproxy\n"})
    # The snippet as a user would split it, with this test's port in place of 9000.
    text = (EXAMPLES / "aws-cli-profile.ini").read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    split = next(i for i, line in enumerate(lines) if line.startswith("# ~/.aws/credentials"))
    config_part, credentials_part = "".join(lines[:split]), "".join(lines[split:])
    (tmp / "aws-config").write_text(config_part.replace(ENDPOINT, endpoint.replace("127.0.0.1", "localhost")))
    (tmp / "aws-credentials").write_text(credentials_part)
    env = {
        "AWS_CONFIG_FILE": str(tmp / "aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "aws-credentials"),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp),
    }
    run = subprocess.run(
        [aws, "--profile", "tsproxy", "s3", "cp", "s3://demo/hello.txt", "-"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout == "hello through tsproxy\n"
