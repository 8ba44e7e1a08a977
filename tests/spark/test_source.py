"""The tiered-kafka source on a real local[2] Spark, reading from a real tsproxy and a real SeaweedFS.

Segments come from kafka-python's record builder (every codec, headers, null keys and values,
transactions with their markers, LogAppendTime) and are stored as the Aiven tiered-storage plugin
stores them. What the source returns is compared record by record with what was written.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.spark.conftest import BASE_TS, RANGE_SEGMENTS, Tiered, WeedTiered
from tests.spark.kafkadata import PartitionWriter, Row, kafka_uuid, upload_aiven, upload_logdir
from tsproxy.format import KeyRing
from tsproxy.kafka.records import iter_batches

pytestmark = pytest.mark.spark

Expected = list[tuple[str, int, Row]]


def load(spark: Any, options: dict[str, str]) -> Any:
    reader = spark.read.format("tiered-kafka")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def collect(df: Any, headers: bool = True) -> Expected:
    """Rows as (topic, partition, (offset, epoch ms, type, key, value, headers)), in source order."""
    cols = ["topic", "partition", "offset", "unix_millis(timestamp) AS ts", "timestampType", "key", "value"]
    if headers:
        cols.append("headers")
    out = []
    for r in df.selectExpr(*cols).collect():
        # A record without headers has null there (as in Spark's Kafka source), never an empty array.
        assert not headers or r["headers"] is None or len(r["headers"]) > 0
        hdrs = tuple((h["key"], _bytes(h["value"])) for h in r["headers"] or ()) if headers else ()
        row = (r["offset"], r["ts"], r["timestampType"], _bytes(r["key"]), _bytes(r["value"]), hdrs)
        out.append((r["topic"], r["partition"], row))
    return out


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def test_every_record_round_trips(spark: Any, tiered: Tiered) -> None:
    # kafka-python stores a batch uncompressed when compressing does not help: check every codec is in.
    batches = [h for s in tiered.segments("orders") for h in iter_batches(s.data)]
    assert {h.codec for h in batches} == {0, 1, 2, 3, 4}
    assert any(h.is_control for h in batches) and any(h.timestamp_type == 1 for h in batches)
    got = collect(load(spark, tiered.options(topics="orders", includeHeaders="true")))
    expected = tiered.rows("orders")
    assert got == expected  # in topic, partition, offset order, every field equal
    types = {row[2] for _, _, row in got}
    assert types == {0, 1}  # CreateTime and LogAppendTime both present
    assert any(row[3] is None for _, _, row in got) and any(row[4] is None for _, _, row in got)
    # Markers take offsets but are no records: offsets have gaps exactly where they are.
    markers = {off for off, _, is_marker in tiered.writers[("orders", 0)].timeline if is_marker}
    assert markers and not markers & {row[0] for _, p, row in got if p == 0}


def test_schema_matches_spark_kafka_source(spark: Any, tiered: Tiered) -> None:
    df = load(spark, tiered.options(topics="orders"))
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"),
        ("offset", "bigint"), ("timestamp", "timestamp"), ("timestampType", "int"),
    ]  # fmt: skip
    with_headers = load(spark, tiered.options(topics="orders", includeHeaders="true"))
    assert with_headers.schema["headers"].dataType.simpleString() == "array<struct<key:string,value:binary>>"
    # Records without headers: null, as Spark's Kafka source gives (and size() of null is null).
    sizes = dict(with_headers.selectExpr("size(headers) AS n").groupBy("n").count().collect())
    assert sizes.keys() == {None, 2} and sizes[None] > sizes[2] > 0


def test_topic_pattern_and_sql(spark: Any, tiered: Tiered) -> None:
    df = load(spark, tiered.options(topicPattern="ord.*"))
    df.createOrReplaceTempView("tiered_orders")
    counts = dict(spark.sql("SELECT partition, count(*) FROM tiered_orders GROUP BY partition").collect())
    assert counts == {p: sum(len(s.rows) for s in tiered.segments("orders", p)) for p in (0, 1)}


def test_offset_range_is_exact_and_reads_only_its_segment(spark: Any, tiered: Tiered) -> None:
    segs = tiered.segments("ranges")
    inside = segs[3]
    start, end = inside.base_offset + 17, inside.next_offset - 23
    options = tiered.options(topics="ranges", startingOffsets=json.dumps({"ranges": {"0": start}}),
                             endingOffsets=json.dumps({"ranges": {"0": end}}))  # fmt: skip
    gets, sent = tiered.client_gets(), tiered.bytes_sent()
    got = collect(load(spark, options), headers=False)
    gets, sent = tiered.client_gets() - gets, tiered.bytes_sent() - sent
    assert [row[0] for _, _, row in got] == list(range(start, end))
    assert [row for _, _, row in got] == [r for r in inside.rows if start <= r[0] < end]
    # Other segments were never downloaded: what went out is this segment (at most) plus index objects.
    small = sum(len(s.offset_index) + len(s.time_index) + 1024 for s in segs)
    assert sent <= len(inside.data) + small
    assert sent < len(inside.data) + min(len(s.data) for s in segs if s is not inside)
    # The manifest and indexes of the one segment the range cuts, one ranged GET of its data (reading
    # every segment would take at least one GET each).
    assert gets <= 4 < RANGE_SEGMENTS


def test_timestamp_range_is_exact_and_reads_only_its_segment(spark: Any, tiered: Tiered) -> None:
    segs = tiered.segments("ranges")
    inside = segs[4]
    start_ts, end_ts = BASE_TS + 4 * 2000 + 333, BASE_TS + 4 * 2000 + 1500
    options = tiered.options(topics="ranges", startingTimestamp=str(start_ts), endingTimestamp=str(end_ts))
    sent = tiered.bytes_sent()
    got = collect(load(spark, options), headers=False)
    sent = tiered.bytes_sent() - sent
    expected = [r for r in inside.rows if start_ts <= r[1] < end_ts]  # monotonic timestamps here
    assert [row for _, _, row in got] == expected and expected
    small = sum(len(s.offset_index) + len(s.time_index) + 1024 for s in segs)
    assert sent <= len(inside.data) + small


def test_big_segments_split_into_many_partitions(spark: Any, tiered: Tiered) -> None:
    df = load(spark, tiered.options(topics="ranges", maxBytesPerPartition="16KiB"))
    assert df.rdd.getNumPartitions() >= 12
    got = collect(df, headers=False)
    assert got == [(t, p, (*row[:5], ())) for t, p, row in tiered.rows("ranges")]


def test_a_topic_with_nothing_tiered_reads_empty(spark: Any, tiered: Tiered) -> None:
    assert load(spark, tiered.options(topics="nothing-here")).count() == 0


def test_bad_options_fail_at_load_with_the_reason(spark: Any, tiered: Tiered) -> None:
    with pytest.raises(Exception, match="cannot be latest"):
        load(spark, tiered.options(topics="orders", startingOffsets="latest"))
    with pytest.raises(Exception, match="exactly one of 'topics'"):
        load(spark, tiered.options())


def test_wrong_credentials_are_a_clear_error(spark: Any, tiered: Tiered) -> None:
    with pytest.raises(Exception, match=r"AccessDenied|access denied"):
        load(spark, tiered.options(topics="orders", secretKey="not-the-secret")).count()


def test_logdir_layout(spark: Any, tiered: Tiered) -> None:
    writer = PartitionWriter("copied", 2)
    for n in range(3):
        writer.batch([(BASE_TS + n, b"k", b"v%d" % n, ())], codec="lz4")
        writer.roll()
    upload_logdir(tiered.proxy.client(), tiered.bucket, "logs/", writer.segments)
    got = collect(
        load(spark, {**tiered.options(topics="copied", layout="logdir"), "prefix": "logs/"}), headers=False
    )
    assert [row for _, _, row in got] == [(*r[:5], ()) for s in writer.segments for r in s.rows]


@pytest.mark.seaweed
def build_transactions() -> PartitionWriter:
    """Transactions across segment rolls: producer 7 aborts one that began a segment before its marker."""
    w = PartitionWriter("txns", 0, start_offset=500)
    w.batch([(BASE_TS, b"plain", b"a", ())], codec="gzip")
    doomed = [(BASE_TS + 1, b"p7", b"doomed-1", ()), (BASE_TS + 2, b"p7", b"doomed-2", ())]
    w.batch(doomed, transactional=True, producer_id=7, codec="zstd")
    w.batch([(BASE_TS + 3, b"p8", b"kept-1", ())], transactional=True, producer_id=8)
    w.roll()
    w.batch([(BASE_TS + 4, b"p7", b"doomed-3", ())], transactional=True, producer_id=7)
    w.batch([(BASE_TS + 5, b"plain", b"b", ())])
    w.marker(commit=False, producer_id=7, timestamp=BASE_TS + 6)
    w.batch([(BASE_TS + 7, b"p8", b"kept-2", ())], transactional=True, producer_id=8, codec="lz4")
    w.marker(commit=True, producer_id=8, timestamp=BASE_TS + 8)
    w.batch([(BASE_TS + 9, b"p7", b"again", ())], transactional=True, producer_id=7)
    w.marker(commit=True, producer_id=7, timestamp=BASE_TS + 10)
    w.roll()
    w.batch([(BASE_TS + 11, b"plain", b"c", ())], codec="snappy")
    w.roll()
    return w


@pytest.mark.parametrize("layout", ["aiven", "logdir"])
def test_read_committed_leaves_out_aborted_transactions_across_segments(
    spark: Any, tiered: Tiered, layout: str
) -> None:
    w = build_transactions()
    assert w.segments[1].aborted == [(7, 501, 506)] and not w.segments[0].aborted
    prefix = f"txn-{layout}/"
    if layout == "aiven":
        upload_aiven(tiered.proxy.client(), tiered.bucket, prefix, w.segments, kafka_uuid())
    else:
        upload_logdir(tiered.proxy.client(), tiered.bucket, prefix, w.segments)
    every = [r for s in w.segments for r in s.rows]
    committed = [r for r in every if r[0] not in w.aborted_offsets]
    assert {r[4] for r in every} - {r[4] for r in committed} == {b"doomed-1", b"doomed-2", b"doomed-3"}
    base = {**tiered.options(topics="txns", layout=layout, includeHeaders="true"), "prefix": prefix}

    def rows(**extra: str) -> list[Row]:
        return [row for _, _, row in collect(load(spark, {**base, **extra}))]

    assert rows() == every  # read_uncommitted, the default, as a Kafka consumer
    assert rows(isolationLevel="read_committed") == committed
    assert rows(**{"kafka.isolation.level": "read_committed"}) == committed
    # The abort marker is in the second segment, the first records of that transaction in the first.
    from_offset = json.dumps({"txns": {"0": 502}})
    assert rows(isolationLevel="read_committed", startingOffsets=from_offset) == [
        r for r in committed if r[0] >= 502
    ]
    # A timestamp bound reads through the slower path that sees markers; it filters the same way.
    assert rows(isolationLevel="read_committed", startingTimestamp=str(BASE_TS + 2)) == [
        r for r in committed if r[1] >= BASE_TS + 2
    ]


def test_read_committed_on_the_shared_data(spark: Any, tiered: Tiered) -> None:
    aborted = tiered.writers[("orders", 0)].aborted_offsets
    assert len(aborted) == 5
    got = collect(
        load(spark, tiered.options(topics="orders", includeHeaders="true", isolationLevel="read_committed"))
    )
    assert got == [(t, p, r) for t, p, r in tiered.rows("orders") if not (p == 0 and r[0] in aborted)]


def test_direct_reads_from_the_backend_with_the_key_ring(spark: Any, tiered_weed: WeedTiered) -> None:
    weed = tiered_weed.weed
    # The backend holds encrypted, compressed objects, not segments:
    stored = weed.boto3_client().list_objects_v2(Bucket=tiered_weed.bucket, Prefix=tiered_weed.prefix)
    a_log = next(o["Key"] for o in stored["Contents"] if o["Key"].endswith(".log"))
    raw = weed.boto3_client().get_object(Bucket=tiered_weed.bucket, Key=a_log)["Body"].read()
    assert raw.endswith(b"\x89TSPROXY")
    got = collect(load(spark, tiered_weed.direct_options(topics="orders", includeHeaders="true")))
    assert got == tiered_weed.rows("orders")


@pytest.mark.seaweed
def test_direct_offset_range_reads_only_its_segment(spark: Any, tiered_weed: WeedTiered) -> None:
    weed, bucket = tiered_weed.weed, tiered_weed.bucket
    inside = tiered_weed.segments("ranges")[2]
    options = tiered_weed.direct_options(
        topics="ranges",
        startingOffsets=json.dumps({"ranges": {"0": inside.base_offset + 5}}),
        endingOffsets=json.dumps({"ranges": {"0": inside.next_offset - 5}}),
    )
    before = weed.request_count("GET", bucket=bucket)
    got = collect(load(spark, options), headers=False)
    gets = weed.request_count("GET", bucket=bucket) - before
    assert [row[0] for _, _, row in got] == list(range(inside.base_offset + 5, inside.next_offset - 5))
    # As through tsproxy: this segment's manifest, indexes and data (one 64 KiB suffix GET holds a small
    # object's tail and data alike); every segment would take at least one GET each.
    assert gets <= 4 < RANGE_SEGMENTS


@pytest.mark.seaweed
def test_direct_reads_pass_through_objects_tsproxy_did_not_write(spark: Any, tiered_weed: WeedTiered) -> None:
    writer = PartitionWriter("plain", 0)
    writer.batch([(BASE_TS, b"k", b"stored-as-is", (("h", b"1"),))], codec="snappy")
    writer.roll()
    upload_aiven(
        tiered_weed.weed.boto3_client(), tiered_weed.bucket, tiered_weed.prefix, writer.segments, kafka_uuid()
    )
    got = collect(load(spark, tiered_weed.direct_options(topics="plain", includeHeaders="true")))
    assert [row for _, _, row in got] == writer.segments[0].rows


@pytest.mark.seaweed
def test_direct_reads_with_the_wrong_key_ring_name_the_object_and_key(
    spark: Any, tiered_weed: WeedTiered, tmp_path: Any
) -> None:
    other = tmp_path / "other-ring.json"
    KeyRing.new().save(other)
    with pytest.raises(Exception, match="KeyNotFound") as info:
        load(spark, tiered_weed.direct_options(topics="orders", keyRing=str(other))).count()
    assert "not on the key ring" in str(info.value) and tiered_weed.bucket in str(info.value)


@pytest.mark.seaweed
def test_direct_reads_of_tampered_data_fail_naming_the_object(spark: Any, tiered_weed: WeedTiered) -> None:
    writer = PartitionWriter("tampered", 0)
    writer.batch([(BASE_TS + i, b"k", b"value-%d" % i * 50, ()) for i in range(40)], codec="none")
    writer.roll()
    keys = upload_aiven(tiered_weed.proxy.client(), tiered_weed.bucket, tiered_weed.prefix, writer.segments,
                        kafka_uuid())  # fmt: skip
    backend = tiered_weed.weed.boto3_client()
    stored = bytearray(backend.get_object(Bucket=tiered_weed.bucket, Key=keys[0])["Body"].read())
    stored[100] ^= 0x01  # inside the first chunk's ciphertext
    backend.put_object(Bucket=tiered_weed.bucket, Key=keys[0], Body=bytes(stored))
    with pytest.raises(Exception, match="IntegrityError") as info:
        load(spark, tiered_weed.direct_options(topics="tampered")).count()
    assert keys[0] in str(info.value) and "authentication failed" in str(info.value)
