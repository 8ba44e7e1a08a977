"""Where Kafka segments live in a bucket: the two key layouts tsproxy reads, both ways.

Aiven's RemoteStorageManager (``prefix`` is its ``key.prefix``, used as is)::

    <prefix><topic>-<topicId>/<partition>/<20-digit start offset>-<segmentId>.log
                                                                        .indexes       (all indexes)
                                                                        .rsm-manifest  (written last)

``topicId`` and ``segmentId`` are Kafka UUIDs as Kafka prints them: 16 bytes in URL-safe base64 without
padding, 22 characters that may include ``-`` and ``_``. Plugin versions before the ``.indexes`` object
stored ``.index``, ``.timeindex``, ``.snapshot``, ``.txnindex`` and ``.leader-epoch-checkpoint``
objects instead.

A broker's log directory copied to the bucket::

    <prefix><topic>-<partition>/<20-digit base offset>.log   with .index and .timeindex next to it

Topic names are 1-249 characters of ``[A-Za-z0-9._-]``; the 20-digit offset is the segment's first
offset, zero-padded as in Kafka's file names.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from .manifest import IndexRange, RsmManifest, parse_rsm_manifest

__all__ = [
    "LAYOUT_AIVEN",
    "LAYOUT_LOGDIR",
    "IndexRange",
    "RsmManifest",
    "SegmentObject",
    "aiven_segment_key",
    "group_segments",
    "logdir_segment_key",
    "parse_rsm_manifest",
    "parse_segment_key",
]

LAYOUT_AIVEN = "aiven"
LAYOUT_LOGDIR = "logdir"

_TOPIC = r"[A-Za-z0-9._-]{1,249}"
_UUID = r"[A-Za-z0-9_-]{22}"
_PARTITION = r"0|[1-9][0-9]{0,9}"
_AIVEN = re.compile(
    rf"(?P<topic>{_TOPIC})-(?P<topic_id>{_UUID})/(?P<partition>{_PARTITION})/"
    rf"(?P<offset>[0-9]{{20}})-(?P<segment_id>{_UUID})"
    r"\.(?P<suffix>log|indexes|rsm-manifest|index|timeindex|snapshot|txnindex|leader-epoch-checkpoint)"
)
_LOGDIR = re.compile(
    rf"(?P<topic>{_TOPIC})-(?P<partition>{_PARTITION})/(?P<offset>[0-9]{{20}})"
    r"\.(?P<suffix>log|index|timeindex|snapshot|txnindex)"
)
_TOPIC_NAME = re.compile(_TOPIC)


@dataclass(frozen=True)
class SegmentObject:
    """A segment's ``.log`` object and the objects that go with it.

    From :func:`parse_segment_key` the companion keys say where those objects belong; from
    :func:`group_segments` a companion key is None unless that object is in the listing. An Aiven
    segment without its manifest is an upload that never finished (or a deletion half done): skip it.
    """

    key: str
    topic: str
    partition: int
    base_offset: int
    layout: str  # LAYOUT_AIVEN or LAYOUT_LOGDIR
    topic_id: str | None = None
    segment_id: str | None = None
    offset_index_key: str | None = None
    time_index_key: str | None = None
    manifest_key: str | None = None
    indexes_key: str | None = None  # Aiven: the object holding all indexes, located by the manifest
    txn_index_key: str | None = None  # ``.txnindex`` (log directory, older plugins): only where one aborted


def parse_segment_key(key: str, prefix: str = "") -> SegmentObject | None:
    """The segment a ``.log`` key names, or None for any other key (indexes, manifests, strangers)."""
    parsed = _parse(key, prefix)
    if parsed is None or parsed[1] != "log":
        return None
    return parsed[0]


def group_segments(keys: Iterable[str], prefix: str = "") -> list[SegmentObject]:
    """The segments among ``keys`` with the companion objects actually present, ordered by
    (topic, partition, base offset)."""
    present = set(keys)
    segments = []
    for key in present:
        segment = parse_segment_key(key, prefix)
        if segment is None:
            continue
        stem = key[: -len(".log")]
        segments.append(
            replace(
                segment,
                offset_index_key=_if_present(stem + ".index", present),
                time_index_key=_if_present(stem + ".timeindex", present),
                manifest_key=_if_present(stem + ".rsm-manifest", present)
                if segment.layout == LAYOUT_AIVEN
                else None,
                indexes_key=_if_present(stem + ".indexes", present)
                if segment.layout == LAYOUT_AIVEN
                else None,
                txn_index_key=_if_present(stem + ".txnindex", present),
            )
        )
    segments.sort(key=lambda s: (s.topic, s.partition, s.base_offset, s.layout, s.key))
    return segments


def aiven_segment_key(
    prefix: str,
    topic: str,
    topic_id: str,
    partition: int,
    base_offset: int,
    segment_id: str,
    suffix: str = "log",
) -> str:
    """The key Aiven's plugin gives a segment's object (``suffix``: log, indexes, rsm-manifest ...)."""
    _check_topic(topic)
    for name, uuid in (("topic id", topic_id), ("segment id", segment_id)):
        if not is_kafka_uuid(uuid):
            raise ValueError(f"{name} {uuid!r} is not a Kafka UUID (22 characters of URL-safe base64)")
    _check_numbers(partition, base_offset)
    return f"{prefix}{topic}-{topic_id}/{partition}/{base_offset:020d}-{segment_id}.{suffix}"


def logdir_segment_key(prefix: str, topic: str, partition: int, base_offset: int, suffix: str = "log") -> str:
    """The key of a segment file of a broker log directory copied under ``prefix``."""
    _check_topic(topic)
    _check_numbers(partition, base_offset)
    return f"{prefix}{topic}-{partition}/{base_offset:020d}.{suffix}"


def is_kafka_uuid(text: str) -> bool:
    """True if ``text`` is a UUID as Kafka prints it: unpadded URL-safe base64 of exactly 16 bytes."""
    if len(text) != 22:
        return False
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except (binascii.Error, ValueError):
        return False
    # The last character carries 2 spare bits, which must be zero for the text to be canonical.
    return len(raw) == 16 and base64.urlsafe_b64encode(raw).rstrip(b"=").decode() == text


def _parse(key: str, prefix: str) -> tuple[SegmentObject, str] | None:
    if not key.startswith(prefix):
        return None
    rest = key[len(prefix) :]
    match = _AIVEN.fullmatch(rest)
    if match is not None:
        if not (is_kafka_uuid(match["topic_id"]) and is_kafka_uuid(match["segment_id"])):
            return None
        stem = key[: -len(match["suffix"]) - 1]
        segment = SegmentObject(
            key=stem + ".log",
            topic=match["topic"],
            partition=int(match["partition"]),
            base_offset=int(match["offset"]),
            layout=LAYOUT_AIVEN,
            topic_id=match["topic_id"],
            segment_id=match["segment_id"],
            manifest_key=stem + ".rsm-manifest",
            indexes_key=stem + ".indexes",
        )
        return segment, match["suffix"]
    match = _LOGDIR.fullmatch(rest)
    if match is not None:
        stem = key[: -len(match["suffix"]) - 1]
        segment = SegmentObject(
            key=stem + ".log",
            topic=match["topic"],
            partition=int(match["partition"]),
            base_offset=int(match["offset"]),
            layout=LAYOUT_LOGDIR,
            offset_index_key=stem + ".index",
            time_index_key=stem + ".timeindex",
            txn_index_key=stem + ".txnindex",
        )
        return segment, match["suffix"]
    return None


def _if_present(key: str, present: set[str]) -> str | None:
    return key if key in present else None


def _check_topic(topic: str) -> None:
    if not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
        raise ValueError(f"{topic!r} is not a legal Kafka topic name")


def _check_numbers(partition: int, base_offset: int) -> None:
    if not 0 <= partition < 2**31:
        raise ValueError(f"partition {partition} is out of range")
    if not 0 <= base_offset < 10**20:
        raise ValueError(f"offset {base_offset} does not fit 20 digits")
