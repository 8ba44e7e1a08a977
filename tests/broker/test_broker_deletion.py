"""The broker's deletes reach the store: remote retention, then deletion of the whole topic.

The plugin deletes a segment with one DeleteObjects of its three keys; through tsproxy that must leave
no object in SeaweedFS, no live record in tsproxy's size catalog (which listings trust) and no chunk of
the deleted objects in tsproxy's cache.
"""

from __future__ import annotations

import sqlite3

import pytest

from tests.broker.fixtures import Stack
from tests.broker.records import consume, drafts, produce
from tests.broker.stack import wait_for
from tsproxy.cache.reader import version_id
from tsproxy.format import KeyRing, open_object
from tsproxy.format.catalog import CatalogIndex, decode_catalog


def _catalog(stack: Stack) -> CatalogIndex:
    """tsproxy's size catalog of the bucket, merged from the catalog objects in the store."""
    weed = stack.weed.boto3_client()
    index = CatalogIndex()
    for key in sorted(stack.stored_keys(".tsproxy/catalog/")):
        index.add(decode_catalog(weed.get_object(Bucket=stack.bucket, Key=key)["Body"].read()))
    return index


def _versions(stack: Stack, keys: list[str]) -> dict[str, bytes]:
    """The cache's object id (version id) of each stored object."""
    ring = KeyRing.load(stack.tsproxy.key_ring)
    weed = stack.weed.boto3_client()
    out = {}
    for key in keys:
        manifest, _ = open_object(weed.get_object(Bucket=stack.bucket, Key=key)["Body"].read(), ring)
        out[key] = version_id(manifest)
    return out


def _cached_object_ids(stack: Stack) -> set[bytes]:
    db = stack.tsproxy.cache_dir / "cache.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        return {bytes(row[0])[:16] for row in conn.execute("SELECT key FROM Cache")}


@pytest.fixture(scope="module")
def expired(stack: Stack) -> dict[str, object]:
    """A topic read once (its chunks cached), then its retention cut to below its size."""
    topic = "expiring"
    stack.broker.create_topic(topic, 1)
    produced = produce(stack.broker.bootstrap, topic, 0, drafts(80, 2500, 2000))
    stack.wait_tiered(topic, 1)
    assert consume(stack.broker.bootstrap, topic, [0])[0] == produced
    prefix = stack.topic_prefix(topic)
    before = sorted(stack.stored_keys(prefix))
    versions = _versions(stack, before)
    logs = {v for k, v in versions.items() if k.endswith(".log")}
    wait_for(lambda: logs <= _cached_object_ids(stack), 30, "the read did not fill tsproxy's cache")

    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    admin = stack.broker.admin()
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.bytes", "1500000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(60)

    def some_deleted() -> list[str]:
        return [k for k in before if k not in stack.stored_keys(prefix)]

    gone = wait_for(some_deleted, 120, "retention deleted nothing remote", stack.logs)
    return {"topic": topic, "prefix": prefix, "before": before, "gone": gone, "versions": versions}


def test_remote_retention_deletes_reach_the_store(stack: Stack, expired: dict[str, object]) -> None:
    prefix, gone = str(expired["prefix"]), list(expired["gone"])  # type: ignore[call-overload]
    # Whole segments go: each deleted key's two companions are gone as well.
    segments = {k.rsplit(".", 1)[0] for k in gone}
    wait_for(
        lambda: not [k for k in stack.stored_keys(prefix) if k.rsplit(".", 1)[0] in segments],
        60,
        "part of a deleted segment is left",
    )
    assert not set(stack.client_keys(prefix)) & set(gone)
    # tsproxy writes its catalog records (the deletes' tombstones too) every few seconds.
    wait_for(lambda: not [k for k in gone if k in _catalog(stack)], 30, "catalog records are left")


def test_topic_deletion_empties_the_store(stack: Stack, expired: dict[str, object]) -> None:
    topic, prefix = str(expired["topic"]), str(expired["prefix"])
    before = list(expired["before"])  # type: ignore[call-overload]
    stack.broker.delete_topic(topic)
    wait_for(lambda: not stack.stored_keys(prefix), 120, "the deleted topic's objects are left", stack.logs)
    assert not stack.client_keys(prefix)
    wait_for(lambda: not [k for k in before if k in _catalog(stack)], 30, "catalog records are left")


def test_deleted_segments_leave_no_cache_entries(stack: Stack, expired: dict[str, object]) -> None:
    versions: dict[str, bytes] = expired["versions"]  # type: ignore[assignment]
    gone = [k for k in versions if k not in stack.stored_keys(str(expired["prefix"]))]
    assert gone
    assert not {versions[k] for k in gone} & _cached_object_ids(stack)
