"""Options of the `tiered-kafka` source, parsed once on the driver into plain, picklable values.

Names follow Spark's own Kafka source where the idea is the same (`startingOffsets`, `endingOffsets`,
`startingTimestamp`, `includeHeaders` ...), plus where to read: a tsproxy S3 endpoint, or the backend
itself with a key ring. Option names are case-insensitive, as everywhere in Spark.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from tsproxy import config, defaults
from tsproxy.errors import ConfigError

SOURCE_NAME = "tiered-kafka"  # spark.read.format(SOURCE_NAME)
LAYOUTS = ("aiven", "logdir")
PARTITION_BY = ("partition", "hourly")  # the export's output layouts
DEFAULT_MAX_BYTES = 64 << 20
MIN_SPLIT_BYTES = 16 << 10

# Spark's conventions inside offset JSON: -2 is earliest, -1 is latest.
EARLIEST_JSON = -2
LATEST_JSON = -1


class OptionError(ConfigError):
    """An option of the source or of the export is missing, unknown or malformed."""


@dataclass(frozen=True, slots=True)
class Bound:
    """One end of the range to read in a partition.

    kind is "earliest", "latest", "offset" (value: offset; inclusive at the start, exclusive at the end,
    as in Spark) or "timestamp" (value: epoch milliseconds; resolved like Kafka's offsetsForTimes: the
    first offset whose record timestamp is >= value).
    """

    kind: str
    value: int = 0

    @property
    def is_offset(self) -> bool:
        return self.kind == "offset"

    @property
    def is_timestamp(self) -> bool:
        return self.kind == "timestamp"


EARLIEST = Bound("earliest")
LATEST = Bound("latest")


@dataclass(frozen=True)
class BoundSpec:
    """A default bound plus per-(topic, partition) exceptions."""

    default: Bound
    per_partition: Mapping[tuple[str, int], Bound] = field(default_factory=dict)

    def for_partition(self, topic: str, partition: int) -> Bound:
        return self.per_partition.get((topic, partition), self.default)

    def topics(self) -> set[str]:
        return {t for t, _ in self.per_partition}


@dataclass(frozen=True)
class StoreOptions:
    """Where the objects are and how to reach them; handed to executors, which build their own clients."""

    bucket: str
    prefix: str = ""
    endpoint: str | None = None
    region: str = defaults.REGION
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    key_ring: str | None = None  # path: read directly from the backend and decode tsproxy objects locally
    path_style: bool = defaults.BACKEND_PATH_STYLE

    @property
    def direct(self) -> bool:
        """Whether objects are read from the backend and decoded here (not through a tsproxy endpoint)."""
        return self.key_ring is not None

    def uri(self, key: str) -> str:
        """s3://bucket/key, for error messages."""
        return f"s3://{self.bucket}/{key}"


@dataclass(frozen=True)
class ReadOptions:
    """Everything a read needs, validated."""

    store: StoreOptions
    layout: str = "aiven"
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    start: BoundSpec = field(default_factory=lambda: BoundSpec(EARLIEST))
    end: BoundSpec = field(default_factory=lambda: BoundSpec(LATEST))
    include_headers: bool = False
    max_bytes_per_partition: int = DEFAULT_MAX_BYTES
    min_partitions: int | None = None
    skip_corrupt: bool = False
    read_committed: bool = False  # leave out the records of aborted transactions

    def wants_topic(self, topic: str) -> bool:
        """Whether a topic found in the listing is one the read subscribes to."""
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics


# Options and their aliases from Spark's Kafka source (`subscribe`, `subscribePattern`).
_KNOWN = {
    "topics", "subscribe", "topicpattern", "subscribepattern", "startingoffsets", "endingoffsets",
    "startingtimestamp", "endingtimestamp", "startingoffsetsbytimestamp", "endingoffsetsbytimestamp",
    "includeheaders", "endpoint", "bucket", "prefix", "layout", "accesskey", "secretkey", "region",
    "keyring", "pathstyle", "maxbytesperpartition", "minpartitions", "skipcorrupt", "path",
    "isolationlevel", "kafka.isolation.level",
}  # fmt: skip
ISOLATION_LEVELS = ("read_uncommitted", "read_committed")


def parse_read_options(raw: Mapping[str, str]) -> ReadOptions:
    """Validate the source's options; OptionError names the option and what is wrong with it."""
    opts = {k.lower(): v for k, v in raw.items() if v is not None}
    unknown = sorted(set(opts) - _KNOWN)
    if unknown:
        raise OptionError(f"tiered-kafka: unknown option(s) {', '.join(unknown)}")
    topics, pattern = _parse_topics(opts)
    start = _parse_start(opts)
    end = _parse_end(opts)
    named = start.topics() | end.topics()
    if topics and not named <= set(topics):
        extra = ", ".join(sorted(named - set(topics)))
        raise OptionError(f"tiered-kafka: offsets name topic(s) not in 'topics': {extra}")
    min_partitions = opts.get("minpartitions")
    return ReadOptions(
        store=parse_store_options(opts),
        layout=_parse_layout(opts.get("layout", "aiven")),
        topics=topics,
        topic_pattern=pattern,
        start=start,
        end=end,
        include_headers=parse_bool(opts.get("includeheaders", "false"), "includeHeaders"),
        max_bytes_per_partition=_parse_size(opts.get("maxbytesperpartition"), "maxBytesPerPartition"),
        min_partitions=None if min_partitions is None else _positive(min_partitions, "minPartitions"),
        skip_corrupt=parse_bool(opts.get("skipcorrupt", "false"), "skipCorrupt"),
        read_committed=_parse_isolation(opts) == "read_committed",
    )


def _parse_isolation(opts: Mapping[str, str]) -> str:
    # `kafka.isolation.level` is how Spark's Kafka source takes it (a consumer setting passed through).
    given = {
        name: opts[name].strip().lower()
        for name in ("isolationlevel", "kafka.isolation.level")
        if name in opts
    }
    if len(set(given.values())) > 1:
        raise OptionError("tiered-kafka: 'isolationLevel' and 'kafka.isolation.level' disagree")
    level = next(iter(given.values()), "read_uncommitted")
    if level not in ISOLATION_LEVELS:
        raise OptionError(
            f"tiered-kafka: isolationLevel {level!r} is not one of {', '.join(ISOLATION_LEVELS)}"
        )
    return level


def parse_store_options(opts: Mapping[str, str]) -> StoreOptions:
    """The where-to-read part of lower-cased options (shared with the export command)."""
    bucket = opts.get("bucket") or _bucket_from_path(opts.get("path"))
    if not bucket:
        raise OptionError("tiered-kafka: option 'bucket' is required")
    prefix = opts.get("prefix", "")
    if "path" in opts and not opts.get("bucket"):
        prefix = opts["path"].removeprefix("s3://").partition("/")[2]
    access, secret = opts.get("accesskey"), opts.get("secretkey")
    if (access is None) != (secret is None):
        raise OptionError("tiered-kafka: give both 'accessKey' and 'secretKey', or neither (AWS chain)")
    endpoint = opts.get("endpoint")
    if endpoint is not None and not re.match(r"^https?://[^/\s]+/?$", endpoint):
        raise OptionError(f"tiered-kafka: 'endpoint' must be http(s)://host[:port], not {endpoint!r}")
    return StoreOptions(
        bucket=bucket,
        prefix=prefix,
        endpoint=endpoint.rstrip("/") if endpoint else None,
        region=opts.get("region", defaults.REGION),
        access_key=access,
        secret_key=secret,
        key_ring=opts.get("keyring") or None,
        path_style=parse_bool(opts.get("pathstyle", defaults.BACKEND_PATH_STYLE), "pathStyle"),
    )


def _bucket_from_path(path: str | None) -> str | None:
    # load("s3://bucket/prefix") works like bucket= plus prefix=.
    if not path:
        return None
    if not path.startswith("s3://"):
        raise OptionError(f"tiered-kafka: a load() path must look like s3://bucket/prefix, not {path!r}")
    return path[5:].partition("/")[0] or None


def _parse_topics(opts: Mapping[str, str]) -> tuple[tuple[str, ...], str | None]:
    listed = opts.get("topics", opts.get("subscribe"))
    pattern = opts.get("topicpattern", opts.get("subscribepattern"))
    if (listed is None) == (pattern is None):
        raise OptionError("tiered-kafka: give exactly one of 'topics' (comma list) or 'topicPattern' (regex)")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as e:
            raise OptionError(f"tiered-kafka: 'topicPattern' is not a valid regex: {e}") from None
        return (), pattern
    assert listed is not None
    topics = tuple(dict.fromkeys(t.strip() for t in listed.split(",") if t.strip()))
    if not topics:
        raise OptionError("tiered-kafka: 'topics' lists no topic")
    return topics, None


def _parse_layout(value: str) -> str:
    layout = value.strip().lower()
    if layout not in LAYOUTS:
        raise OptionError(f"tiered-kafka: 'layout' must be one of {', '.join(LAYOUTS)}, not {value!r}")
    return layout


def _parse_start(opts: Mapping[str, str]) -> BoundSpec:
    # Spark's precedence: startingTimestamp, then startingOffsetsByTimestamp, then startingOffsets.
    if "startingtimestamp" in opts:
        return BoundSpec(Bound("timestamp", parse_timestamp(opts["startingtimestamp"], "startingTimestamp")))
    if "startingoffsetsbytimestamp" in opts:
        return _timestamps_json(opts["startingoffsetsbytimestamp"], "startingOffsetsByTimestamp", EARLIEST)
    return parse_offsets(opts.get("startingoffsets", "earliest"), "startingOffsets", start=True)


def _parse_end(opts: Mapping[str, str]) -> BoundSpec:
    if "endingtimestamp" in opts:
        return BoundSpec(Bound("timestamp", parse_timestamp(opts["endingtimestamp"], "endingTimestamp")))
    if "endingoffsetsbytimestamp" in opts:
        return _timestamps_json(opts["endingoffsetsbytimestamp"], "endingOffsetsByTimestamp", LATEST)
    return parse_offsets(opts.get("endingoffsets", "latest"), "endingOffsets", start=False)


def parse_offsets(text: str, name: str, *, start: bool) -> BoundSpec:
    """'earliest', 'latest' or Spark's JSON {"topic":{"0":23,"1":-2}} (-2 earliest, -1 latest).

    A batch read cannot start at 'latest' nor end at 'earliest' (as in Spark). Partitions the JSON does
    not name read from the earliest offset or to the latest one.
    """
    value = text.strip()
    default = EARLIEST if start else LATEST
    if value.lower() in ("earliest", "latest"):
        bound = EARLIEST if value.lower() == "earliest" else LATEST
        if bound != default:
            raise OptionError(f"tiered-kafka: '{name}' cannot be {value.lower()} for a batch read")
        return BoundSpec(default)
    per: dict[tuple[str, int], Bound] = {}
    for topic, partition, number in _partition_json(value, name):
        if number == EARLIEST_JSON:
            bound = EARLIEST
        elif number == LATEST_JSON:
            bound = LATEST
        elif number >= 0:
            bound = Bound("offset", number)
        else:
            raise OptionError(f"tiered-kafka: '{name}': offset {number} for {topic}-{partition} is negative")
        if bound != default and bound.kind in ("earliest", "latest"):
            raise OptionError(f"tiered-kafka: '{name}' cannot use {bound.kind} for {topic}-{partition}")
        per[(topic, partition)] = bound
    return BoundSpec(default, per)


def _timestamps_json(text: str, name: str, default: Bound) -> BoundSpec:
    per = {}
    for topic, partition, number in _partition_json(text, name):
        if number < 0:
            raise OptionError(f"tiered-kafka: '{name}': timestamp for {topic}-{partition} is negative")
        per[(topic, partition)] = Bound("timestamp", number)
    return BoundSpec(default, per)


def _partition_json(text: str, name: str) -> list[tuple[str, int, int]]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        raise OptionError(
            f'tiered-kafka: \'{name}\' must be earliest/latest or JSON like {{"topic":{{"0":23}}}}'
        ) from None
    if not isinstance(doc, dict):
        raise OptionError(f"tiered-kafka: '{name}' must be a JSON object of topics")
    out = []
    for topic, parts in doc.items():
        if not isinstance(parts, dict):
            raise OptionError(f"tiered-kafka: '{name}': topic {topic!r} must map partitions to numbers")
        for part, number in parts.items():
            if not (isinstance(part, str) and part.isascii() and part.isdigit()):
                raise OptionError(f"tiered-kafka: '{name}': partition {part!r} of {topic!r} is not a number")
            if not isinstance(number, int) or isinstance(number, bool):
                raise OptionError(f"tiered-kafka: '{name}': value for {topic}-{part} must be an integer")
            out.append((topic, int(part), number))
    return out


def parse_timestamp(text: str, name: str) -> int:
    """Epoch milliseconds from a number, or from an ISO-8601 date-time (UTC when no zone is given)."""
    value = text.strip()
    if re.fullmatch(r"\d+", value):
        return int(value)
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise OptionError(
            f"tiered-kafka: '{name}' must be epoch milliseconds or an ISO-8601 date-time, not {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    millis = int(when.timestamp() * 1000)
    if millis < 0:
        raise OptionError(f"tiered-kafka: '{name}' is before 1970")
    return millis


def parse_bool(value: str | bool, name: str) -> bool:
    """true/false (any case), as Spark options are strings; the same words as tsproxy's settings."""
    try:
        return config.parse_bool(value)
    except ValueError:
        raise OptionError(f"tiered-kafka: '{name}' must be true or false, not {value!r}") from None


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}  # fmt: skip


def _parse_size(value: str | None, name: str) -> int:
    if value is None:
        return DEFAULT_MAX_BYTES
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", value)
    if not m or m.group(2).lower() not in _UNITS:
        raise OptionError(f"tiered-kafka: '{name}' must be a size like 64MiB, not {value!r}")
    size = int(m.group(1)) * _UNITS[m.group(2).lower()]
    if size < MIN_SPLIT_BYTES:
        raise OptionError(f"tiered-kafka: '{name}' must be at least 16KiB")
    return size


def _positive(value: str, name: str) -> int:
    if not (value.strip().isascii() and value.strip().isdigit()) or int(value) < 1:
        raise OptionError(f"tiered-kafka: '{name}' must be a positive integer, not {value!r}")
    return int(value)
