"""Kafka's on-disk formats, pure: record batches v2, segment indexes and tiered-storage object layouts.

Bytes in, values out, no I/O: the compression heuristic, the tests and the Spark pipeline read
segments fetched by someone else. See ``records`` (batches and records), ``indexes`` (``.index`` and
``.timeindex``), ``layout`` (object keys and the ``.rsm-manifest``) and ``builder`` (a writer for
tests and synthetic data).
"""

from .errors import CodecUnavailableError, CorruptRecordError, ManifestError, UnsupportedManifestError
from .indexes import lookup_position, lookup_timestamp, parse_offset_index, parse_time_index, split_points
from .layout import SegmentObject, group_segments, parse_rsm_manifest, parse_segment_key
from .records import BatchHeader, DecodeStats, Record, decode_batch, iter_batches, iter_records, iter_rows

__all__ = [
    "BatchHeader",
    "CodecUnavailableError",
    "CorruptRecordError",
    "DecodeStats",
    "ManifestError",
    "Record",
    "SegmentObject",
    "UnsupportedManifestError",
    "decode_batch",
    "group_segments",
    "iter_batches",
    "iter_records",
    "iter_rows",
    "lookup_position",
    "lookup_timestamp",
    "parse_offset_index",
    "parse_rsm_manifest",
    "parse_segment_key",
    "parse_time_index",
    "split_points",
]
