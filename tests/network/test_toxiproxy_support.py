"""The toxiproxy wrapper against the real toxiproxy server and a real SeaweedFS: toxics land where asked,
a cut link refuses connections and comes back on the same port, and a reset clears everything."""

from __future__ import annotations

import pytest
from botocore.exceptions import EndpointConnectionError, ResponseStreamingError

from tests.support.seaweed import SeaweedFS
from tests.support.toxiproxy import Link, Toxiproxy


def test_shape_sets_latency_and_bandwidth_both_ways_and_replaces_itself(store_link: Link) -> None:
    store_link.shape(latency_ms=30, jitter_ms=3, mb_per_s=20)
    toxics = {t["name"]: t for t in store_link.toxics()}
    assert toxics["latency_downstream"]["attributes"] == {"latency": 30, "jitter": 3}
    assert toxics["bandwidth_upstream"]["attributes"] == {"rate": 20_000}  # KB/s of 1000 bytes
    assert toxics["bandwidth_downstream"]["stream"] == "downstream"
    store_link.shape(latency_ms=10)
    assert [t["name"] for t in store_link.toxics()] == ["latency_downstream"]
    store_link.shape()
    assert store_link.toxics() == []


def test_a_link_carries_s3_is_cut_and_comes_back(
    store_link: Link, seaweed: SeaweedFS, seaweed_bucket: str
) -> None:
    s3 = seaweed.boto3_client(store_link.endpoint, retries={"total_max_attempts": 1})
    body = bytes(range(256)) * 4096
    s3.put_object(Bucket=seaweed_bucket, Key="k", Body=body)
    assert s3.get_object(Bucket=seaweed_bucket, Key="k")["Body"].read() == body

    with store_link.toxic("limit_data", bytes=100_000), pytest.raises(ResponseStreamingError):
        s3.get_object(Bucket=seaweed_bucket, Key="k")["Body"].read()

    store_link.disable()
    with pytest.raises(EndpointConnectionError):
        s3.head_object(Bucket=seaweed_bucket, Key="k")
    store_link.enable()
    assert s3.get_object(Bucket=seaweed_bucket, Key="k")["Body"].read() == body


def test_reset_enables_every_link_and_removes_every_toxic(toxiproxy: Toxiproxy, store_link: Link) -> None:
    store_link.add("latency", latency=5)
    store_link.disable()
    toxiproxy.reset()
    state = toxiproxy.state()[store_link.name]
    assert state["enabled"] is True and state["toxics"] == []
