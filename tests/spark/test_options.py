"""Option parsing of the tiered-kafka source: Spark's names and conventions, clear errors."""

from __future__ import annotations

import pytest

from tsproxy.errors import ConfigError
from tsproxy.spark.options import EARLIEST, LATEST, Bound, OptionError, parse_read_options

BASE = {"bucket": "tiered", "topics": "orders"}


def test_defaults_read_everything_through_the_aws_chain() -> None:
    opts = parse_read_options(BASE)
    assert opts.topics == ("orders",)
    assert opts.start.for_partition("orders", 0) == EARLIEST
    assert opts.end.for_partition("orders", 3) == LATEST
    assert opts.layout == "aiven" and not opts.include_headers
    assert opts.store.access_key is None and not opts.store.direct


def test_option_names_are_case_insensitive_and_spark_aliases_work() -> None:
    opts = parse_read_options({"BUCKET": "b", "subscribe": "a, b ,a", "INCLUDEHEADERS": "TRUE"})
    assert opts.topics == ("a", "b") and opts.include_headers
    assert parse_read_options({"bucket": "b", "subscribePattern": "or.*"}).wants_topic("orders")
    assert not parse_read_options({"bucket": "b", "topicPattern": "or"}).wants_topic("orders")  # full match


def test_isolation_level_like_a_kafka_consumer() -> None:
    assert not parse_read_options(BASE).read_committed  # read_uncommitted, the consumer default
    assert parse_read_options({**BASE, "isolationLevel": "READ_COMMITTED"}).read_committed
    assert parse_read_options({**BASE, "kafka.isolation.level": "read_committed"}).read_committed
    both = {**BASE, "isolationLevel": "read_committed", "kafka.isolation.level": "read_committed"}
    assert parse_read_options(both).read_committed
    with pytest.raises(OptionError, match="disagree"):
        parse_read_options(
            {**BASE, "isolationLevel": "read_committed", "kafka.isolation.level": "read_uncommitted"}
        )
    with pytest.raises(OptionError, match="isolationLevel 'committed' is not one of"):
        parse_read_options({**BASE, "isolationLevel": "committed"})


def test_offsets_json_follows_spark() -> None:
    opts = parse_read_options(
        {
            **BASE,
            "startingOffsets": '{"orders":{"0":23,"1":-2}}',
            "endingOffsets": '{"orders":{"0":-1,"1":40}}',
        }
    )
    assert opts.start.for_partition("orders", 0) == Bound("offset", 23)
    assert opts.start.for_partition("orders", 1) == EARLIEST
    assert opts.start.for_partition("orders", 2) == EARLIEST  # not named: earliest
    assert opts.end.for_partition("orders", 0) == LATEST
    assert opts.end.for_partition("orders", 1) == Bound("offset", 40)


def test_timestamps_take_precedence_like_spark() -> None:
    opts = parse_read_options(
        {**BASE, "startingOffsets": '{"orders":{"0":5}}', "startingTimestamp": "1700000000000",
         "endingTimestamp": "2023-11-14T22:13:21Z"}
    )  # fmt: skip
    assert opts.start.for_partition("orders", 0) == Bound("timestamp", 1_700_000_000_000)
    assert opts.end.for_partition("orders", 0) == Bound("timestamp", 1_700_000_001_000)
    per = parse_read_options({**BASE, "startingOffsetsByTimestamp": '{"orders":{"1":1000}}'})
    assert per.start.for_partition("orders", 1) == Bound("timestamp", 1000)
    assert per.start.for_partition("orders", 0) == EARLIEST


def test_load_path_gives_bucket_and_prefix() -> None:
    opts = parse_read_options({"path": "s3://tiered/cluster-a/", "topics": "t"})
    assert (opts.store.bucket, opts.store.prefix) == ("tiered", "cluster-a/")


def test_key_ring_means_direct_reads_and_secret_stays_out_of_repr() -> None:
    opts = parse_read_options({**BASE, "keyRing": "/etc/ring.json", "accessKey": "AK", "secretKey": "SECRET"})
    assert opts.store.direct and opts.store.key_ring == "/etc/ring.json"
    assert "SECRET" not in repr(opts)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topics": "t"}, "'bucket' is required"),
        ({"bucket": "b"}, "exactly one of 'topics'"),
        ({"bucket": "b", "topics": "t", "topicPattern": "t"}, "exactly one of 'topics'"),
        ({"bucket": "b", "topicPattern": "("}, "not a valid regex"),
        ({**BASE, "startingOffsets": "latest"}, "cannot be latest"),
        ({**BASE, "endingOffsets": "earliest"}, "cannot be earliest"),
        ({**BASE, "startingOffsets": '{"orders":{"0":-1}}'}, "cannot use latest"),
        ({**BASE, "endingOffsets": '{"orders":{"0":-2}}'}, "cannot use earliest"),
        ({**BASE, "startingOffsets": '{"orders":{"x":1}}'}, "not a number"),
        ({**BASE, "startingOffsets": "{nope"}, "JSON like"),
        ({**BASE, "startingOffsets": '{"other":{"0":1}}'}, "not in 'topics'"),
        ({**BASE, "startingOffsets": '{"orders":{"0":-7}}'}, "negative"),
        ({**BASE, "startingTimestamp": "yesterday"}, "epoch milliseconds"),
        ({**BASE, "layout": "flat"}, "'layout' must be one of"),
        ({**BASE, "includeHeaders": "sometimes"}, "true or false"),
        ({**BASE, "accessKey": "a"}, "both 'accessKey' and 'secretKey'"),
        ({**BASE, "endpoint": "localhost:9000"}, "http"),
        ({**BASE, "maxBytesPerPartition": "10KiB"}, "at least 16KiB"),
        ({**BASE, "minPartitions": "0"}, "positive integer"),
        ({**BASE, "startingOfsets": "earliest"}, "unknown option"),
    ],
)
def test_bad_options_say_what_is_wrong(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message) as info:
        parse_read_options(options)
    assert isinstance(info.value, ConfigError)
