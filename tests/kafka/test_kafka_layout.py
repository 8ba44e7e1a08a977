"""Tiered object keys (Aiven plugin and copied log directories) and the plugin's ``.rsm-manifest``."""

from __future__ import annotations

import base64
import json
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka_helpers import sample_records

from tsproxy.kafka.builder import SegmentBuilder, build_indexes_object
from tsproxy.kafka.errors import ManifestError, UnsupportedManifestError
from tsproxy.kafka.indexes import parse_offset_index, parse_time_index
from tsproxy.kafka.layout import (
    LAYOUT_AIVEN,
    LAYOUT_LOGDIR,
    aiven_segment_key,
    group_segments,
    is_kafka_uuid,
    logdir_segment_key,
    parse_rsm_manifest,
    parse_segment_key,
)
from tsproxy.kafka.manifest import plain_manifest
from tsproxy.kafka.records import iter_records

TOPIC_ID = "MWJ6FHTfRYy67jzwZdeqSQ"  # Kafka UUIDs as the plugin's own documentation shows them
SEGMENT_ID = "tqimKeZwStOEOwRzT3L5oQ"


def kafka_uuid(seed: int) -> str:
    return base64.urlsafe_b64encode(uuid.UUID(int=seed * 7919 + 1).bytes).rstrip(b"=").decode()


def test_the_plugins_documented_example_parses() -> None:
    key = "someprefix/topic-MWJ6FHTfRYy67jzwZdeqSQ/7/00000000000000001234-tqimKeZwStOEOwRzT3L5oQ.log"
    segment = parse_segment_key(key, "someprefix/")
    assert segment is not None
    assert (segment.topic, segment.partition, segment.base_offset, segment.layout) == (
        "topic",
        7,
        1234,
        LAYOUT_AIVEN,
    )
    assert (segment.topic_id, segment.segment_id) == (TOPIC_ID, SEGMENT_ID)
    assert segment.manifest_key == key.replace(".log", ".rsm-manifest")
    assert segment.indexes_key == key.replace(".log", ".indexes")
    assert aiven_segment_key("someprefix/", "topic", TOPIC_ID, 7, 1234, SEGMENT_ID) == key


@pytest.mark.parametrize(
    "topic", ["orders", "a-b.c_d", "x-AAAAAAAAAAAAAAAAAAAAAA", "t" * 249, "__consumer_offsets"]
)
@pytest.mark.parametrize("prefix", ["", "tiered/", "kafka-", "deep/er/"])
def test_aiven_keys_round_trip(topic: str, prefix: str) -> None:
    for seed, (partition, offset) in enumerate([(0, 0), (12, 10**19 + 5), (2**31 - 1, 77)]):
        topic_id, segment_id = kafka_uuid(seed), kafka_uuid(seed + 100)
        for suffix in ("log", "indexes", "rsm-manifest"):
            key = aiven_segment_key(prefix, topic, topic_id, partition, offset, segment_id, suffix)
            segment = parse_segment_key(key, prefix)
            if suffix != "log":
                assert segment is None
                continue
            assert segment is not None
            assert (segment.key, segment.topic, segment.partition, segment.base_offset) == (
                key,
                topic,
                partition,
                offset,
            )
            assert (segment.topic_id, segment.segment_id) == (topic_id, segment_id)


@pytest.mark.parametrize("prefix", ["", "backup/broker-1/"])
def test_logdir_keys_round_trip(prefix: str) -> None:
    key = logdir_segment_key(prefix, "my-topic.v2", 3, 4567)
    assert key == f"{prefix}my-topic.v2-3/00000000000000004567.log"
    segment = parse_segment_key(key, prefix)
    assert segment is not None
    assert (segment.topic, segment.partition, segment.base_offset, segment.layout) == (
        "my-topic.v2",
        3,
        4567,
        LAYOUT_LOGDIR,
    )
    assert segment.offset_index_key == key[:-4] + ".index"
    assert segment.time_index_key == key[:-4] + ".timeindex"
    assert segment.manifest_key is None and segment.topic_id is None


@pytest.mark.parametrize(
    "key",
    [
        "orders-0/00000000000000000000.index",
        "orders-0/00000000000000000000.log.deleted",
        "orders-0/00000000000000000000.log.swap",
        "orders-0.2b1d5c-delete/00000000000000000000.log",
        "orders-0/0000000000000000000.log",  # 19 digits
        "orders-01/00000000000000000000.log",  # not how Kafka prints a partition
        "orders/00000000000000000000.log",
        "orders-0/leader-epoch-checkpoint",
        f"topic-{TOPIC_ID}/7/00000000000000001234-{SEGMENT_ID}.rsm-manifest",
        f"topic-{TOPIC_ID}/7/00000000000000001234-{SEGMENT_ID[:-1]}B.log",  # non-canonical UUID
        f"topic-{TOPIC_ID}/x/00000000000000001234-{SEGMENT_ID}.log",
        f"other/topic-{TOPIC_ID}/7/00000000000000001234-{SEGMENT_ID}.log",  # not under the prefix
        "",
    ],
)
def test_other_keys_are_not_segments(key: str) -> None:
    prefix = "" if not key.startswith("other/") else "tiered/"
    assert parse_segment_key(key, prefix) is None


def test_kafka_uuid_check() -> None:
    assert (
        is_kafka_uuid(TOPIC_ID)
        and is_kafka_uuid("AAAAAAAAAAAAAAAAAAAAAA")
        and is_kafka_uuid("_-_-_-_-_-_-_-_-_-_-_w")
    )
    assert not is_kafka_uuid("AAAAAAAAAAAAAAAAAAAAAB")  # spare bits set
    assert not is_kafka_uuid("AAAAAAAAAAAAAAAAAAAAA") and not is_kafka_uuid("AAAAAAAAAAAAAAAAAAAA+A")


def test_key_writers_refuse_bad_parts() -> None:
    with pytest.raises(ValueError):
        aiven_segment_key("", "bad/topic", TOPIC_ID, 0, 0, SEGMENT_ID)
    with pytest.raises(ValueError):
        aiven_segment_key("", "t", "not-a-uuid", 0, 0, SEGMENT_ID)
    with pytest.raises(ValueError):
        logdir_segment_key("", "t", -1, 0)
    with pytest.raises(ValueError):
        logdir_segment_key("", "t", 0, 10**20)
    with pytest.raises(ValueError):
        logdir_segment_key("", "..", 0, 0)


def test_group_segments_pairs_companions_and_orders() -> None:
    stem = "tiered/orders-" + TOPIC_ID + "/1/"
    complete = stem + f"00000000000000000100-{kafka_uuid(1)}"
    unfinished = stem + f"00000000000000000000-{kafka_uuid(2)}"
    old_style = stem + f"00000000000000000200-{kafka_uuid(3)}"
    keys = [
        complete + ".log", complete + ".indexes", complete + ".rsm-manifest",
        unfinished + ".log", unfinished + ".indexes",  # manifest never written
        old_style + ".log", old_style + ".index", old_style + ".timeindex", old_style + ".rsm-manifest",
        "tiered/orders-0/00000000000000000050.log", "tiered/orders-0/00000000000000000050.index",
        "tiered/orders-0/00000000000000000050.timeindex", "tiered/orders-0/00000000000000000000.log",
        "tiered/README.txt", complete + ".indexes.tmp",
    ]  # fmt: skip
    segments = group_segments(reversed(keys), "tiered/")
    assert [(s.layout, s.partition, s.base_offset) for s in segments] == [
        (LAYOUT_LOGDIR, 0, 0), (LAYOUT_LOGDIR, 0, 50), (LAYOUT_AIVEN, 1, 0), (LAYOUT_AIVEN, 1, 100),
        (LAYOUT_AIVEN, 1, 200),
    ]  # fmt: skip
    bare, logdir, unfinished_seg, complete_seg, old = segments
    assert bare.offset_index_key is None and bare.time_index_key is None
    assert logdir.offset_index_key == "tiered/orders-0/00000000000000000050.index"
    assert unfinished_seg.manifest_key is None and unfinished_seg.indexes_key == unfinished + ".indexes"
    assert complete_seg.manifest_key == complete + ".rsm-manifest" and complete_seg.offset_index_key is None
    assert old.indexes_key is None and old.offset_index_key == old_style + ".index"
    assert old.time_index_key == old_style + ".timeindex"


def a_manifest_document(**changes: object) -> dict:
    """A manifest in the shape the plugin writes, for a 10000-byte segment in 4 KiB chunks."""
    doc: dict = {
        "version": "1",
        "chunkIndex": {
            "type": "fixed", "originalChunkSize": 4096, "originalFileSize": 10000,
            "transformedChunkSize": 4096, "finalTransformedChunkSize": 1808,
        },
        "segmentIndexes": {
            "offset": {"position": 0, "size": 16}, "timestamp": {"position": 16, "size": 24},
            "producerSnapshot": {"position": 40, "size": 0}, "leaderEpoch": {"position": 40, "size": 9},
            "transaction": None,
        },
        "compression": False,
        "remoteLogSegmentMetadata": {
            "remoteLogSegmentId": {
                "topicIdPartition": {
                    "topicId": TOPIC_ID, "topicPartition": {"topic": "orders", "partition": 1},
                },
                "id": SEGMENT_ID,
            },
            "startOffset": 100, "endOffset": 199, "maxTimestampMs": 1700000000000, "brokerId": 2,
            "eventTimestampMs": 1700000001000, "segmentLeaderEpochs": {"0": 100},
        },
    }  # fmt: skip
    doc.update(changes)
    return doc


def test_manifest_as_the_plugin_writes_it() -> None:
    manifest = parse_rsm_manifest(json.dumps(a_manifest_document()).encode())
    assert manifest.segment_size == 10000 and not manifest.compression and not manifest.encrypted
    assert (manifest.topic, manifest.partition, manifest.topic_id, manifest.segment_id) == (
        "orders", 1, TOPIC_ID, SEGMENT_ID,
    )  # fmt: skip
    assert (manifest.start_offset, manifest.end_offset, manifest.max_timestamp) == (100, 199, 1700000000000)
    offset_range = manifest.index("offset")
    assert offset_range is not None and (offset_range.position, offset_range.size) == (0, 16)
    assert manifest.index("transaction") is None
    with pytest.raises(KeyError):
        manifest.index("nonsense")
    assert parse_rsm_manifest(manifest.to_json()) == manifest


def test_older_manifests_without_segment_indexes_or_metadata() -> None:
    doc = a_manifest_document()
    del doc["segmentIndexes"], doc["remoteLogSegmentMetadata"]
    manifest = parse_rsm_manifest(json.dumps(doc).encode())
    assert manifest.segment_indexes is None and manifest.index("offset") is None and manifest.topic is None


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"compression": True}, "compression"),
        ({"encryption": {"dataKey": "x", "aad": "y"}}, "encryption"),
        (
            {
                "chunkIndex": {
                    "type": "variable",
                    "originalChunkSize": 4096,
                    "originalFileSize": 10000,
                    "transformedChunks": "AAAA",
                }
            },
            "differs",
        ),
        (
            {
                "chunkIndex": {
                    "type": "fixed",
                    "originalChunkSize": 4096,
                    "originalFileSize": 10000,
                    "transformedChunkSize": 4124,
                    "finalTransformedChunkSize": 1836,
                }
            },
            "differs",
        ),
        ({"version": "2"}, "version"),
    ],
)
def test_manifests_tsproxy_cannot_read_are_refused_clearly(changes: dict, words: str) -> None:
    data = json.dumps(a_manifest_document(**changes)).encode()
    with pytest.raises(UnsupportedManifestError, match=words) as caught:
        parse_rsm_manifest(data, object_name="t/0/x.rsm-manifest")
    assert "t/0/x.rsm-manifest" in str(caught.value)
    if words != "version":
        assert parse_rsm_manifest(data, require_plain=False).segment_size == 10000


@pytest.mark.parametrize(
    "data",
    [
        b"{not json",
        b"\xff\xfe",
        b"[]",
        json.dumps(a_manifest_document(chunkIndex=None)).encode(),
        json.dumps(a_manifest_document(chunkIndex={"type": "zigzag"})).encode(),
        json.dumps(a_manifest_document(compression="no")).encode(),
        json.dumps(a_manifest_document(segmentIndexes={"offset": {"position": -1, "size": 3}})).encode(),
        json.dumps(a_manifest_document(segmentIndexes={"offset": {"position": True, "size": 3}})).encode(),
        json.dumps(a_manifest_document(segmentIndexes=[])).encode(),
        json.dumps(a_manifest_document(remoteLogSegmentMetadata={"startOffset": "100"})).encode(),
    ],
)
def test_malformed_manifests(data: bytes) -> None:
    with pytest.raises(ManifestError):
        parse_rsm_manifest(data, object_name="m")


def test_a_tiered_segment_end_to_end() -> None:
    """What the Spark reader does: list, pick the segment, read its manifest, slice the indexes, decode."""
    builder = SegmentBuilder(5000, index_interval_bytes=256)
    for n in range(40):
        builder.add(sample_records(10, 5000 + 10 * n, seed=n))
    builder.close()
    indexes, ranges = build_indexes_object(
        builder.offset_index, builder.time_index, b"snap", b"0\n1\n0 5000\n"
    )
    prefix, topic_id, segment_id = "ts/", kafka_uuid(5), kafka_uuid(6)
    key = aiven_segment_key(prefix, "clicks", topic_id, 4, 5000, segment_id)
    manifest = plain_manifest(
        len(builder.segment), chunk_size=4096, index_ranges=ranges, topic="clicks", partition=4,
        topic_id=topic_id, segment_id=segment_id, start_offset=5000, end_offset=5399,
    )  # fmt: skip
    bucket = {
        key: builder.segment,
        key[:-4] + ".indexes": indexes,
        key[:-4] + ".rsm-manifest": manifest.to_json(),
    }
    (segment,) = group_segments(bucket, prefix)
    assert segment.manifest_key is not None and segment.indexes_key is not None
    parsed = parse_rsm_manifest(bucket[segment.manifest_key], object_name=segment.manifest_key)
    offset_range, time_range = parsed.index("offset"), parsed.index("timestamp")
    assert offset_range is not None and time_range is not None
    offsets = parse_offset_index(offset_range.slice(bucket[segment.indexes_key]), segment.base_offset)
    times = parse_time_index(time_range.slice(bucket[segment.indexes_key]), segment.base_offset)
    assert offsets == builder.offset_entries and times == builder.time_entries
    assert parsed.segment_size == len(bucket[segment.key])
    assert [r.offset for r in iter_records(bucket[segment.key])] == list(range(5000, 5400))
    with pytest.raises(ManifestError):
        offset_range.slice(b"short")


@settings(max_examples=200, deadline=None)
@given(
    topic=st.from_regex(r"[A-Za-z0-9._-]{1,60}", fullmatch=True).filter(lambda t: t not in (".", "..")),
    partition=st.integers(0, 2**31 - 1),
    offset=st.integers(0, 10**20 - 1),
    ids=st.tuples(st.binary(min_size=16, max_size=16), st.binary(min_size=16, max_size=16)),
    prefix=st.sampled_from(["", "p/", "a-b_", "x/y/"]),
)
def test_any_legal_segment_key_round_trips(
    topic: str, partition: int, offset: int, ids: tuple[bytes, bytes], prefix: str
) -> None:
    topic_id, segment_id = (base64.urlsafe_b64encode(i).rstrip(b"=").decode() for i in ids)
    aiven = parse_segment_key(
        aiven_segment_key(prefix, topic, topic_id, partition, offset, segment_id), prefix
    )
    assert aiven is not None and (aiven.topic, aiven.partition, aiven.base_offset) == (
        topic,
        partition,
        offset,
    )
    assert (aiven.topic_id, aiven.segment_id) == (topic_id, segment_id)
    logdir = parse_segment_key(logdir_segment_key(prefix, topic, partition, offset), prefix)
    assert logdir is not None and (logdir.topic, logdir.partition, logdir.base_offset) == (
        topic,
        partition,
        offset,
    )
