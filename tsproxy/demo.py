"""`tsproxy demo`: sample Kafka tiered segments written through a tsproxy, to try the pipeline on.

A broker with tiered storage leaves segments in the object store as Aiven's remote storage plugin
lays them out: per segment a `.log` (the record batches as the broker wrote them), an `.indexes`
object (offset and time indexes, …) and an `.rsm-manifest`. This command writes such segments, built
with the project's own batch writer (tsproxy.kafka.builder), into a bucket through a running tsproxy,
so that `tsproxy export` and `tsproxy jobs` have real-shaped data within minutes of `make run`:

    tsproxy demo                       # a tsproxy on http://127.0.0.1:9000 with its dev defaults
    tsproxy demo --endpoint URL --bucket B --topic orders --partitions 3 --segments 4

The records are order events (JSON values, customer keys, a header on some), deterministic for a
`--seed`: a rerun writes the same objects again. Some segments hold producer-compressed (zstd)
batches, as a topic with `compression.type=zstd` does. It prints the commands that read them back.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from tsproxy import config, defaults, errors
from tsproxy.errors import ConfigError
from tsproxy.kafka.builder import SegmentBuilder, build_indexes_object
from tsproxy.kafka.codecs import CODEC_NONE, CODEC_ZSTD
from tsproxy.kafka.layout import aiven_segment_key
from tsproxy.kafka.manifest import plain_manifest
from tsproxy.kafka.records import Record
from tsproxy.store.s3errors import BackendRefused

DEFAULT_ENDPOINT = f"http://127.0.0.1:{defaults.LISTEN[1]}"
DEFAULT_BUCKET = "demo-tiered"
RECORDS_PER_BATCH = 50
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: the same seed, the same bytes, any day


@dataclass(frozen=True)
class DemoSegment:
    """One built segment and the three objects the plugin stores for it."""

    partition: int
    base_offset: int
    segment_id: str
    records: int
    objects: dict[str, bytes]  # suffix (log, indexes, rsm-manifest) -> body


def kafka_uuid(rng: random.Random) -> str:
    """A Kafka UUID as Kafka prints it: 16 bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(rng.randbytes(16)).rstrip(b"=").decode()


def build_segments(
    topic: str, topic_id: str, partitions: int, segments: int, records: int, seed: int, start_ms: int
) -> list[DemoSegment]:
    """`segments` rolled segments of `records` order events for each partition."""
    rng = random.Random(seed)
    out: list[DemoSegment] = []
    for partition in range(partitions):
        offset, ts = 0, start_ms + partition
        for n in range(segments):
            # Every third segment's batches are compressed by the producer, as with compression.type=zstd.
            codec = CODEC_ZSTD if n % 3 == 2 else CODEC_NONE
            builder = SegmentBuilder(offset)
            base = offset
            for first in range(0, records, RECORDS_PER_BATCH):
                batch = []
                for _ in range(min(RECORDS_PER_BATCH, records - first)):
                    ts += rng.randrange(1, 400)
                    batch.append(_order(rng, offset, ts))
                    offset += 1
                builder.add(batch, codec=codec)
            builder.close()
            segment_id = kafka_uuid(rng)
            indexes, ranges = build_indexes_object(builder.offset_index, builder.time_index)
            manifest = plain_manifest(
                len(builder.segment), index_ranges=ranges, topic=topic, partition=partition,
                topic_id=topic_id, segment_id=segment_id, start_offset=base, end_offset=offset - 1,
                max_timestamp=ts,
            )  # fmt: skip
            objects = {"log": builder.segment, "indexes": indexes, "rsm-manifest": manifest.to_json()}
            out.append(DemoSegment(partition, base, segment_id, offset - base, objects))
    return out


def _order(rng: random.Random, offset: int, ts: int) -> Record:
    customer = rng.randrange(1, 500)
    value = {
        "order_id": offset,
        "customer": f"customer-{customer:04d}",
        "item": rng.choice(("keyboard", "monitor", "cable", "lamp", "chair", "desk", "mug")),
        "quantity": rng.randrange(1, 5),
        "amount_cents": rng.randrange(100, 50_000),
        "ts": ts,
    }
    headers: tuple[tuple[str, bytes | None], ...] = ()
    if offset % 10 == 0:
        headers = (("source", b"web"), ("trace-id", rng.randbytes(8).hex().encode()))
    body = json.dumps(value, separators=(",", ":")).encode()
    return Record(offset, ts, 0, f"customer-{customer:04d}".encode(), body, headers)


async def upload(
    segments: Sequence[DemoSegment],
    *,
    endpoint: str,
    bucket: str,
    prefix: str,
    topic: str,
    topic_id: str,
    access_key: str | None,
    secret_key: str | None,
    region: str,
) -> int:
    """Create the bucket (if need be) and store every segment's objects; returns the bytes written."""
    from tsproxy.store.s3 import S3Backend

    client = S3Backend(endpoint, region=region, access_key=access_key, secret_key=secret_key, max_attempts=2)
    await client.start()
    try:
        try:
            await client.create_bucket(bucket)
        except errors.BucketAlreadyOwnedByYou:
            pass
        written = 0
        for seg in segments:
            for suffix, body in seg.objects.items():
                key = aiven_segment_key(
                    prefix, topic, topic_id, seg.partition, seg.base_offset, seg.segment_id, suffix
                )
                await client.put(bucket, key, body)
                written += len(body)
        return written
    finally:
        await client.close()


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `demo` command to the main CLI."""
    p = subparsers.add_parser(
        "demo",
        help="write sample Kafka tiered segments through a tsproxy, to try export and jobs on",
        description="Write sample Kafka tiered segments (Aiven plugin layout) into a bucket through a "
        "running tsproxy, then print the commands that read them back.",
    )
    p.add_argument("--endpoint", default=DEFAULT_ENDPOINT, help=f"the tsproxy (default {DEFAULT_ENDPOINT})")
    p.add_argument("--bucket", default=DEFAULT_BUCKET, help=f"created if need be (default {DEFAULT_BUCKET})")
    p.add_argument("--prefix", default="", help="key prefix, as the plugin's key.prefix (default none)")
    p.add_argument("--topic", default="orders", help="topic name (default orders)")
    p.add_argument("--partitions", type=int, default=2, help="partitions (default 2)")
    p.add_argument("--segments", type=int, default=3, help="segments per partition (default 3)")
    p.add_argument("--records", type=int, default=10_000, help="records per segment (default 10000)")
    p.add_argument("--seed", type=int, default=1, help="the same seed writes the same data (default 1)")
    p.add_argument("--region", default=defaults.REGION, help=f"(default {defaults.REGION})")
    p.add_argument(
        "--access-key",
        help="access key (default: the AWS credential chain, else the development credentials of `make run`)",
    )
    p.add_argument("--secret-key", help="secret key (with --access-key)")
    p.set_defaults(func=run)


async def _credentials(args: argparse.Namespace) -> tuple[str | None, str | None, bool]:
    """(access key, secret key, whether the reading commands must be given them): the flags', else the
    AWS credential chain's (None, None: the client finds them where the export will), else the
    development credentials of `make run`."""
    if (args.access_key is None) != (args.secret_key is None):
        raise ConfigError("demo: give both --access-key and --secret-key, or neither")
    if args.access_key is not None:
        return args.access_key, args.secret_key, True
    from aiobotocore.session import get_session

    if await get_session().get_credentials() is not None:
        return None, None, False
    return config.DEV_ACCESS_KEY, config.DEV_SECRET_KEY, True


def run(args: argparse.Namespace) -> int:
    for name in ("partitions", "segments", "records"):
        if getattr(args, name) < 1:
            raise ConfigError(f"demo: --{name} must be at least 1")
    access_key, secret_key, pass_keys = asyncio.run(_credentials(args))
    rng = random.Random(args.seed)
    topic_id = kafka_uuid(rng)
    segments = build_segments(
        args.topic, topic_id, args.partitions, args.segments, args.records, args.seed, START_MS
    )
    try:
        written = asyncio.run(
            upload(
                segments,
                endpoint=args.endpoint,
                bucket=args.bucket,
                prefix=args.prefix,
                topic=args.topic,
                topic_id=topic_id,
                access_key=access_key,
                secret_key=secret_key,
                region=args.region,
            )
        )
    except BackendRefused as e:  # the store client's word for refused credentials
        print(
            f"tsproxy demo: {args.endpoint} refused the credentials ({e.backend_code}): give "
            "--access-key/--secret-key, those tsproxy accepts",
            file=sys.stderr,
        )
        return 1
    except errors.S3Error as e:
        print(f"tsproxy demo: {args.endpoint}: {e.code}: {e.message}", file=sys.stderr)
        return 1
    records = sum(s.records for s in segments)
    where = f"s3://{args.bucket}/{args.prefix}"
    print(
        f"tsproxy demo: wrote {len(segments)} segments of topic {args.topic} ({args.partitions} partitions, "
        f"{records} records, {written / (1 << 20):.1f} MiB with indexes and manifests) to {where} "
        f"through {args.endpoint}"
    )
    print("read them back:")
    for command in reading_commands(args, access_key, secret_key, pass_keys):
        print(f"  {command}")
    return 0


def reading_commands(
    args: argparse.Namespace, access_key: str | None, secret_key: str | None, pass_keys: bool
) -> list[str]:
    """The export and a job over what was written, as shell lines."""
    export = ["tsproxy", "export", "--endpoint", args.endpoint, "--bucket", args.bucket]
    if args.prefix:
        export += ["--prefix", args.prefix]
    export += ["--topics", args.topic, "--output", "demo-export"]
    if pass_keys and access_key and secret_key:
        export += ["--access-key", access_key, "--secret-key", secret_key]
    if args.region != defaults.REGION:
        export += ["--region", args.region]
    # The jobs read the store behind tsproxy with the server's configuration: run where `make run` runs
    # (or add --config FILE, the server's).
    verify = ["tsproxy", "jobs", "verify", "--bucket", args.bucket, "--output", "demo-verify"]
    return [shlex.join(export), shlex.join(verify)]
