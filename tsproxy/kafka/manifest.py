"""The ``.rsm-manifest`` that Aiven's tiered-storage plugin writes next to each segment, as JSON.

Shape (version "1")::

    {"version": "1",
     "chunkIndex": {"type": "fixed", "originalChunkSize": 4194304, "originalFileSize": 1073741800,
                    "transformedChunkSize": 4194304, "finalTransformedChunkSize": 4194280},
     "segmentIndexes": {"offset": {"position": 0, "size": 1832}, "timestamp": {...},
                        "producerSnapshot": {...}, "leaderEpoch": {...}, "transaction": null},
     "compression": false,
     "encryption": {"dataKey": ..., "aad": ...},            (only when encrypted)
     "remoteLogSegmentMetadata": {"remoteLogSegmentId": {"topicIdPartition": {"topicId": ...,
         "topicPartition": {"topic": ..., "partition": ...}}, "id": ...},
         "startOffset": ..., "endOffset": ..., "maxTimestampMs": ..., ...}}   (newer plugin versions)

``segmentIndexes`` gives each index's (position, size) inside the ``.indexes`` object; ``transaction``
is null when the segment had no transaction index, and the whole field is missing in manifests of
plugin versions that stored each index as an object of its own. With the plugin's compression and
encryption off, the chunk index is "fixed" with transformed sizes equal to the original ones and the
``.log`` object holds the segment byte for byte: that is the only case tsproxy reads, because tsproxy
compresses and encrypts below the plugin itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import ManifestError, UnsupportedManifestError

INDEX_NAMES = ("offset", "timestamp", "producerSnapshot", "leaderEpoch", "transaction")


@dataclass(frozen=True)
class IndexRange:
    """Where one index sits in the ``.indexes`` object."""

    position: int
    size: int

    def slice(self, indexes_object: bytes | bytearray | memoryview) -> memoryview:
        """This index's bytes, without copying; checks that the object is long enough."""
        view = memoryview(indexes_object)
        if self.position + self.size > len(view):
            raise ManifestError(
                "", f"index at {self.position}+{self.size} lies past the end of {len(view)} bytes"
            )
        return view[self.position : self.position + self.size]


@dataclass(frozen=True)
class ChunkIndexInfo:
    """The plugin's chunk index. For a "variable" index only the sizes of the original are kept."""

    kind: str  # "fixed" or "variable"
    original_chunk_size: int
    original_file_size: int
    transformed_chunk_size: int | None = None
    final_transformed_chunk_size: int | None = None


@dataclass(frozen=True)
class RsmManifest:
    """What tsproxy needs from a segment manifest."""

    version: str
    chunk_index: ChunkIndexInfo
    compression: bool
    encrypted: bool
    # Positions of the indexes in the ``.indexes`` object; None when absent (see module doc).
    segment_indexes: dict[str, IndexRange | None] | None = None
    # From "remoteLogSegmentMetadata", when the plugin wrote it.
    topic: str | None = None
    partition: int | None = None
    topic_id: str | None = None
    segment_id: str | None = None
    start_offset: int | None = None
    end_offset: int | None = None
    max_timestamp: int | None = None

    @property
    def segment_size(self) -> int:
        """Size of the original segment, which the ``.log`` object holds as is."""
        return self.chunk_index.original_file_size

    def index(self, name: str) -> IndexRange | None:
        """The range of index ``name`` (one of INDEX_NAMES) in the ``.indexes`` object, if there is one."""
        if name not in INDEX_NAMES:
            raise KeyError(name)
        return (self.segment_indexes or {}).get(name)

    def to_json(self) -> bytes:
        """The manifest as the plugin would write it (the writer side, for tests and tools)."""
        chunk: dict[str, Any] = {
            "type": self.chunk_index.kind,
            "originalChunkSize": self.chunk_index.original_chunk_size,
            "originalFileSize": self.chunk_index.original_file_size,
        }
        if self.chunk_index.kind == "fixed":
            chunk["transformedChunkSize"] = self.chunk_index.transformed_chunk_size
            chunk["finalTransformedChunkSize"] = self.chunk_index.final_transformed_chunk_size
        doc: dict[str, Any] = {"version": self.version, "chunkIndex": chunk}
        if self.segment_indexes is not None:
            doc["segmentIndexes"] = {
                name: None if rng is None else {"position": rng.position, "size": rng.size}
                for name, rng in self.segment_indexes.items()
            }
        doc["compression"] = self.compression
        if self.encrypted:
            doc["encryption"] = {"dataKey": "", "aad": ""}
        if self.topic is not None:
            doc["remoteLogSegmentMetadata"] = {
                "remoteLogSegmentId": {
                    "topicIdPartition": {
                        "topicId": self.topic_id,
                        "topicPartition": {"topic": self.topic, "partition": self.partition},
                    },
                    "id": self.segment_id,
                },
                "startOffset": self.start_offset,
                "endOffset": self.end_offset,
                "maxTimestampMs": self.max_timestamp,
            }
        return json.dumps(doc).encode()


def plain_manifest(
    segment_size: int,
    *,
    chunk_size: int = 4 * 1024 * 1024,
    index_ranges: dict[str, tuple[int, int] | None] | None = None,
    **metadata: Any,
) -> RsmManifest:
    """The manifest the plugin writes for a segment stored without its compression and encryption."""
    chunks = max(1, -(-segment_size // chunk_size))
    final = segment_size - (chunks - 1) * chunk_size
    indexes = None
    if index_ranges is not None:
        indexes = {name: None if rng is None else IndexRange(*rng) for name, rng in index_ranges.items()}
    return RsmManifest(
        version="1",
        chunk_index=ChunkIndexInfo("fixed", chunk_size, segment_size, chunk_size, final),
        compression=False,
        encrypted=False,
        segment_indexes=indexes,
        **metadata,
    )


def parse_rsm_manifest(data: bytes, *, object_name: str = "", require_plain: bool = True) -> RsmManifest:
    """Parse a ``.rsm-manifest``; ``require_plain`` refuses segments the plugin compressed or encrypted."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(object_name, f"not JSON: {exc}") from None
    reader = _Fields(object_name)
    doc = reader.obj(doc, "manifest")
    version = doc.get("version")
    if version != "1":
        raise UnsupportedManifestError(
            object_name, f"manifest version {version!r} is not supported (only '1')"
        )
    chunk = reader.obj(doc.get("chunkIndex"), "chunkIndex")
    kind = chunk.get("type")
    if kind not in ("fixed", "variable"):
        raise ManifestError(object_name, f"chunkIndex type {kind!r} is unknown")
    chunk_index = ChunkIndexInfo(
        kind=kind,
        original_chunk_size=reader.integer(chunk, "originalChunkSize", minimum=1),
        original_file_size=reader.integer(chunk, "originalFileSize"),
        transformed_chunk_size=reader.integer(chunk, "transformedChunkSize") if kind == "fixed" else None,
        final_transformed_chunk_size=reader.integer(chunk, "finalTransformedChunkSize")
        if kind == "fixed"
        else None,
    )
    compression = doc.get("compression")
    if not isinstance(compression, bool):
        raise ManifestError(object_name, "compression must be true or false")
    encrypted = doc.get("encryption") is not None
    segment_indexes: dict[str, IndexRange | None] | None = None
    if doc.get("segmentIndexes") is not None:
        indexes = reader.obj(doc["segmentIndexes"], "segmentIndexes")
        segment_indexes = {}
        for name in INDEX_NAMES:
            entry = indexes.get(name)
            if entry is None:
                segment_indexes[name] = None
                continue
            entry = reader.obj(entry, f"segmentIndexes.{name}")
            segment_indexes[name] = IndexRange(
                reader.integer(entry, "position"), reader.integer(entry, "size")
            )
    manifest = RsmManifest(
        version=version,
        chunk_index=chunk_index,
        compression=compression,
        encrypted=encrypted,
        segment_indexes=segment_indexes,
        **_segment_metadata(doc.get("remoteLogSegmentMetadata"), reader),
    )
    if require_plain:
        _check_plain(manifest, object_name)
    return manifest


def _check_plain(manifest: RsmManifest, object_name: str) -> None:
    if manifest.compression or manifest.encrypted:
        used = " and ".join(
            n for n, on in (("compression", manifest.compression), ("encryption", manifest.encrypted)) if on
        )
        raise UnsupportedManifestError(
            object_name,
            f"segment was stored with the plugin's {used}; tsproxy reads only segments stored with both off "
            "(tsproxy compresses and encrypts them itself)",
        )
    chunk = manifest.chunk_index
    chunks = -(-chunk.original_file_size // chunk.original_chunk_size)
    final = chunk.original_file_size - (chunks - 1) * chunk.original_chunk_size if chunks else 0
    if (
        chunk.kind != "fixed"
        or chunk.transformed_chunk_size != chunk.original_chunk_size
        or (chunks and chunk.final_transformed_chunk_size != final)
    ):
        raise UnsupportedManifestError(
            object_name, "chunk index says the stored segment differs from the original"
        )


def _segment_metadata(meta: Any, reader: _Fields) -> dict[str, Any]:
    if meta is None:
        return {}
    meta = reader.obj(meta, "remoteLogSegmentMetadata")
    segment_id = reader.obj(meta.get("remoteLogSegmentId", {}), "remoteLogSegmentId")
    topic_id_partition = reader.obj(segment_id.get("topicIdPartition", {}), "topicIdPartition")
    topic_partition = reader.obj(topic_id_partition.get("topicPartition", {}), "topicPartition")
    return {
        "topic": reader.optional(topic_partition, "topic", str),
        "partition": reader.optional(topic_partition, "partition", int),
        "topic_id": reader.optional(topic_id_partition, "topicId", str),
        "segment_id": reader.optional(segment_id, "id", str),
        "start_offset": reader.optional(meta, "startOffset", int),
        "end_offset": reader.optional(meta, "endOffset", int),
        "max_timestamp": reader.optional(meta, "maxTimestampMs", int),
    }


class _Fields:
    """Typed access to JSON fields, with errors that name the object and the field."""

    def __init__(self, object_name: str) -> None:
        self.object_name = object_name

    def obj(self, value: Any, what: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise ManifestError(self.object_name, f"{what} must be a JSON object")
        return value

    def integer(self, parent: dict[str, Any], name: str, minimum: int = 0) -> int:
        value = parent.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ManifestError(self.object_name, f"{name} must be an integer >= {minimum}, not {value!r}")
        return value

    def optional(self, parent: dict[str, Any], name: str, kind: type) -> Any:
        value = parent.get(name)
        if value is None:
            return None
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ManifestError(self.object_name, f"{name} must be of type {kind.__name__}, not {value!r}")
        return value
