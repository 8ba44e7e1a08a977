"""PySpark reading Kafka data through tsproxy, without touching the brokers.

Two ways in, both speaking S3 to tsproxy (http://localhost:9000, path-style, a key pair tsproxy accepts
in TSPROXY_ACCESS_KEY/TSPROXY_SECRET_KEY):

* tsproxy's Spark data source "tiered-kafka" reads the segments the brokers tiered, with the schema of
  Spark's own Kafka source (key, value, topic, partition, offset, timestamp...). It ships with
  `pip install 'tsproxy[spark]'`; `tsproxy.spark.register(spark)` adds it to a session.
* pyarrow's S3 filesystem reads plain objects, here what the Kafka Connect S3 sink wrote
  (connect-s3-sink.properties), and hands them to Spark as an Arrow table.

The pip pyspark has no s3a:// connector, so no Hadoop S3 settings are involved. Run:
    TSPROXY_ACCESS_KEY=... TSPROXY_SECRET_KEY=... python spark_through_tsproxy.py
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import pyarrow.dataset as ds
from pyarrow import fs
from pyspark.sql import DataFrame, SparkSession

# The tsproxy next to you; TSPROXY_ENDPOINT points elsewhere (another port, another host).
ENDPOINT = os.environ.get("TSPROXY_ENDPOINT", "http://localhost:9000")
REGION = "us-east-1"  # tsproxy's region setting: signatures include it


def tsproxy_filesystem() -> fs.S3FileSystem:
    """A pyarrow S3 filesystem on tsproxy (plain HTTP on localhost by default), path-style addressing."""
    return fs.S3FileSystem(
        access_key=os.environ["TSPROXY_ACCESS_KEY"],
        secret_key=os.environ["TSPROXY_SECRET_KEY"],
        region=REGION,
        scheme=urlsplit(ENDPOINT).scheme,
        endpoint_override=urlsplit(ENDPOINT).netloc,
        force_virtual_addressing=False,  # path style: http://localhost:9000/<bucket>/<key>
    )


def tiered_topic(spark: SparkSession, topic: str, bucket: str = "kafka-tiered-storage") -> DataFrame:
    """A topic's tiered segments, as rows like Spark's Kafka source gives."""
    from tsproxy.spark import register

    register(spark)
    return (
        spark.read.format("tiered-kafka")
        .option("endpoint", ENDPOINT)
        .option("pathStyle", "true")
        .option("region", REGION)
        .option("accessKey", os.environ["TSPROXY_ACCESS_KEY"])
        .option("secretKey", os.environ["TSPROXY_SECRET_KEY"])
        .option("bucket", bucket)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )


def connect_sink_output(spark: SparkSession, topic: str, bucket: str = "kafka-archive") -> DataFrame:
    """The JSON records the S3 sink connector wrote for a topic, read through tsproxy by pyarrow."""
    dataset = ds.dataset(f"{bucket}/topics/{topic}", filesystem=tsproxy_filesystem(), format="json")
    return spark.createDataFrame(dataset.to_table())


if __name__ == "__main__":
    session = SparkSession.builder.master("local[*]").appName("tsproxy-example").getOrCreate()
    connect_sink_output(session, "events").show(10, truncate=False)
    session.stop()
