"""The dashboard and the alert rules against a real Prometheus scraping a real `tsproxy serve`.

One module-wide run: `tsproxy serve` on the local backend, Prometheus scraping its /metrics every second
with deploy/prometheus/alerts.yml loaded, a short boto3 workload spread over about ten seconds (so that
every rate() has several samples), then a wait until Prometheus has scraped the workload's last request.
The tests then ask Prometheus, through its HTTP API, what an operator's Grafana would ask it.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError
from deploy_tools import DEPLOY, find_tool, serving
from prom_support import Prometheus, QueryResult, require_prometheus
from prometheus_client.parser import text_string_to_metric_families
from test_dashboard import DASHBOARD, dashboard_queries

from tests.support.ports import free_port
from tsproxy.format import KeyRing

pytestmark = pytest.mark.slow

ALERTS = DEPLOY / "prometheus" / "alerts.yml"
JOB = "tsproxy"
ACCESS_KEY, SECRET_KEY = "live-access", "live-secret-key-0123456789"
CHUNK = 256 << 10
MIB = 1 << 20

# Workload pacing: ROUNDS rounds, PAUSE seconds apart, so rates see many 1 s scrapes of it.
ROUNDS, PAUSE = 10, 1.0

# Panels (title, legend) that must show more than zero after the workload: each is something it did.
POSITIVE = [
    ("Instances up", "up"),
    ("Active keys in use", "active keys"),
    ("Client requests/s", "requests/s"),
    ("Stored / original bytes (lifetime)", "stored/original"),
    ("Cache fill", "fill"),
    ("Error ratio", "4xx"),
    ("Latency percentiles (all operations)", "p50"),
    ("Latency percentiles (all operations)", "p99"),
    ("Client vs backend bytes", "client → tsproxy"),
    ("Client vs backend bytes", "tsproxy → client"),
    ("Client vs backend bytes", "tsproxy → backend"),
    ("Client vs backend bytes", "backend → tsproxy"),
    ("Compression ratio (stored / original)", "stored/original"),
    ("Cache hit ratio", "chunks"),
    ("Cache hit ratio", "bytes"),
    ("Cache fill", "size"),
    ("Cache fill", "limit"),
    ("Prefetch usefulness", "used / issued"),
    ("Backend requests per client request", "ratio"),
    ("Backend latency percentiles", "p50"),
]
# Panels that must read exactly zero: a healthy workload has no server errors and no bad data.
ZERO = [
    ("Client error ratio (5xx)", "5xx ratio"),
    ("Integrity errors (dashboard range)", "integrity errors"),
    ("Error ratio", "5xx"),
    ("Evictions and corruption", "corrupt/s"),
    ("Integrity errors", "integrity errors/s"),
]
# Panels split by a label: these label values must each be above zero.
BY_LABEL = {
    ("Requests by operation", "{{operation}}"): (
        "operation",
        {
            "CreateBucket",
            "PutObject",
            "CreateMultipartUpload",
            "UploadPart",
            "CompleteMultipartUpload",
            "GetObject",
            "HeadObject",
            "ListObjectsV2",
        },
    ),
    ("Errors by status", "{{status}}"): ("status", {"404"}),
    ("Transform CPU", "{{direction}}"): ("direction", {"store", "read"}),
    ("Prefetch chunks", "{{state}}"): ("state", {"issued", "used"}),
}


@dataclass(frozen=True)
class LiveRun:
    """A Prometheus that has scraped the whole workload, and tsproxy's metrics listener (still serving)."""

    prometheus: Prometheus
    metrics_url: str


def _panel_targets(path: Path = DASHBOARD) -> list[tuple[str, str]]:
    """(panel title, legend) of every target, in the order dashboard_queries() gives their expressions."""
    out: list[tuple[str, str]] = []
    for panel in json.loads(path.read_text(encoding="utf-8"))["panels"]:
        for p in [panel, *panel.get("panels", [])]:
            out.extend((p["title"], t.get("legendFormat", "")) for t in p.get("targets", []))
    return out


def _counted_requests(metrics_url: str) -> float:
    """Client requests tsproxy has counted so far, read straight from its /metrics."""
    with urllib.request.urlopen(metrics_url + "/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "tsproxy_requests_total"
    )


def _payload(size: int, seed: int) -> bytes:
    """Compressible text, then as many random bytes: chunks of both kinds go through the transform."""
    text = b"".join(b"offset=%010d key=k%05d value=v\n" % (i, (i + seed) % 997) for i in range(size // 64))
    noise = random.Random(seed).randbytes(size // 2)
    return (text[: size - len(noise)] + noise).ljust(size, b"\0")


def _run_workload(s3: Any, bucket: str) -> None:
    """Uploads (single and multipart), forward ranged reads, repeated reads, a 404 and listings."""
    s3.create_bucket(Bucket=bucket)
    segment = _payload(6 * MIB, 1)
    upload = s3.create_multipart_upload(Bucket=bucket, Key="segment.log")["UploadId"]
    parts = []
    for number, start in enumerate((0, 5 * MIB), start=1):
        body = segment[start : start + 5 * MIB]
        etag = s3.upload_part(Bucket=bucket, Key="segment.log", UploadId=upload, PartNumber=number, Body=body)
        parts.append({"PartNumber": number, "ETag": etag["ETag"]})
    s3.complete_multipart_upload(
        Bucket=bucket, Key="segment.log", UploadId=upload, MultipartUpload={"Parts": parts}
    )
    for round_ in range(ROUNDS):
        started = time.monotonic()
        small = _payload(300 << 10, round_ + 2)
        s3.put_object(Bucket=bucket, Key=f"index-{round_}.idx", Body=small)
        # The same range twice: the second read is served from the chunk cache.
        for _ in range(2):
            got = s3.get_object(Bucket=bucket, Key=f"index-{round_}.idx", Range="bytes=1000-99999")
            assert got["Body"].read() == small[1000:100000]
        # A reader moving forward through the segment, one chunk at a time, as Kafka's plugin reads.
        first = round_ * CHUNK
        got = s3.get_object(Bucket=bucket, Key="segment.log", Range=f"bytes={first}-{first + CHUNK - 1}")
        assert got["Body"].read() == segment[first : first + CHUNK]
        assert s3.head_object(Bucket=bucket, Key="segment.log")["ContentLength"] == len(segment)
        try:
            s3.get_object(Bucket=bucket, Key=f"missing-{round_}")
            raise AssertionError("a missing key was served")
        except ClientError as e:
            assert e.response["Error"]["Code"] == "NoSuchKey"
        listed = s3.list_objects_v2(Bucket=bucket)["KeyCount"]
        assert listed == round_ + 2
        time.sleep(max(0.0, PAUSE - (time.monotonic() - started)))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    binary = require_prometheus()
    tsproxy = find_tool("tsproxy")
    if tsproxy is None:
        pytest.skip("the tsproxy command is not installed in this environment (pip install -e .)")
    tmp = tmp_path_factory.mktemp("prometheus-live")
    KeyRing.new().save(tmp / "ring.json")
    port, metrics_port = free_port(), free_port()
    argv = [
        tsproxy, "serve", "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}",
        "--backend", f"file://{tmp / 'data'}", "--key-ring", str(tmp / "ring.json"),
        "--cache-dir", str(tmp / "cache"), "--cache-size", "64MiB",
        "--chunk-size", f"{CHUNK // 1024}KiB", "--prefetch", f"{4 * CHUNK // 1024}KiB",
    ]  # fmt: skip
    credentials = {"TSPROXY_ACCESS_KEY": ACCESS_KEY, "TSPROXY_SECRET_KEY": SECRET_KEY}
    metrics_url = f"http://127.0.0.1:{metrics_port}"
    with serving(argv, tmp, metrics_port, env=credentials):
        prometheus = Prometheus.start(
            binary, tmp / "prometheus", [f"127.0.0.1:{metrics_port}"], job=JOB, rule_files=[ALERTS]
        )
        try:
            # A scrape before the workload: rate() and increase() then count all of it.
            prometheus.wait_for(
                lambda: prometheus.query(f'up{{job="{JOB}"}} == 1').points, 30, "a first scrape of tsproxy"
            )
            s3 = boto3.client(
                "s3",
                endpoint_url=f"http://127.0.0.1:{port}",
                aws_access_key_id=ACCESS_KEY,
                aws_secret_access_key=SECRET_KEY,
                region_name="us-east-1",
                config=BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
            )
            _run_workload(s3, "live")
            total = _counted_requests(metrics_url)
            # Each request counted once: 5 to set up, 7 a round (boto3 here never retries).
            assert total == 5 + 7 * ROUNDS
            prometheus.wait_for(
                lambda: prometheus.query(f'sum(tsproxy_requests_total{{job="{JOB}"}})').max() == total,
                30,
                f"Prometheus to scrape all {total:g} requests",
            )
            yield LiveRun(prometheus, metrics_url)
        finally:
            exit_code = prometheus.stop()
    assert exit_code == 0, f"Prometheus did not stop cleanly ({exit_code}):\n{prometheus.log_tail()}"


@pytest.fixture(scope="module")
def panels(live: LiveRun) -> dict[tuple[str, str], QueryResult]:
    """Every panel expression evaluated once, now, by (panel title, legend)."""
    targets, queries = _panel_targets(), dashboard_queries()
    assert len(targets) == len(queries) >= 30
    return {target: live.prometheus.query(expr) for target, expr in zip(targets, queries, strict=True)}


def test_every_dashboard_query_returns_data(panels: dict[tuple[str, str], QueryResult]) -> None:
    """Each panel expression, as Grafana sends it for "all instances", gives at least one sample."""
    for (title, legend), result in panels.items():
        assert result.result_type in ("vector", "scalar"), (title, legend, result.result_type)
    empty = [f"{title} / {legend}: {r.expr}" for (title, legend), r in panels.items() if not r.points]
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)


def test_an_absent_series_gives_an_empty_result(live: LiveRun) -> None:
    """The emptiness check above can fail: a series nobody exports yields no sample."""
    result = live.prometheus.query('sum(rate(tsproxy_no_such_series_total{job=~".*"}[1m]))')
    assert result.result_type == "vector" and result.points == ()


def test_panels_show_the_workload(panels: dict[tuple[str, str], QueryResult]) -> None:
    """What the workload did reads above zero; errors it did not cause read exactly zero."""
    missing = [p for p in [*POSITIVE, *ZERO, *BY_LABEL] if p not in panels]
    assert not missing, f"panels not on the dashboard any more: {missing}"
    wrong = []
    for panel in POSITIVE:
        if not panels[panel].max() > 0:
            wrong.append(f"{panel}: {panels[panel].values()} (expected > 0)")
    for panel in ZERO:
        if panels[panel].values() != [0.0]:
            wrong.append(f"{panel}: {panels[panel].values()} (expected 0)")
    for panel, (label, wanted) in BY_LABEL.items():
        values = panels[panel].by(label)
        quiet = sorted(v for v in wanted if not values.get(v, 0.0) > 0)
        if quiet:
            wrong.append(f"{panel}: nothing for {label} in {quiet} (got {values})")
    assert not wrong, "\n".join(wrong)


def _evaluated_rules(live: LiveRun) -> list[dict[str, Any]]:
    """The loaded rules once each has been evaluated at least once (health no longer "unknown")."""

    def evaluated() -> list[dict[str, Any]] | None:
        rules = live.prometheus.rules()
        return rules if rules and all(r["health"] != "unknown" for r in rules) else None

    return live.prometheus.wait_for(evaluated, 15, "every alert rule to be evaluated")


def test_alert_rules_load_and_evaluate(live: LiveRun) -> None:
    """Every rule of alerts.yml is loaded and evaluates on real series without error."""
    names = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}
    rules = _evaluated_rules(live)
    assert sorted(r["name"] for r in rules) == sorted(names)
    unhealthy = {r["name"]: (r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"}
    assert not unhealthy


def test_no_alert_on_a_healthy_workload(live: LiveRun) -> None:
    """Uploads, reads, listings and a few 404s are normal traffic: no alert may even be pending."""
    active = {r["name"]: r["state"] for r in _evaluated_rules(live) if r["state"] != "inactive"}
    assert active == {}


def test_health_and_readiness_answer_as_documented(live: LiveRun) -> None:
    """/healthz is 200 {"status": "ok"}; /readyz is 200 {"status": "ready"} with a reachable backend."""
    for path, body in (("/healthz", {"status": "ok"}), ("/readyz", {"status": "ready"})):
        try:
            with urllib.request.urlopen(live.metrics_url + path, timeout=10) as answer:
                assert answer.status == 200, path
                assert json.load(answer) == body, path
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{path} answered {e.code}: {e.read()!r}") from None
    assert live.prometheus.query(f'up{{job="{JOB}"}}').values() == [1.0]
