"""The stored object format: chunking, transform stages, chunk index and manifest. Pure, no I/O.

docs/FORMAT.md describes the bytes; this package is the only code that reads or writes them.
"""

from .context import ObjectContext
from .decoder import ChunkDecoder
from .index import ChunkIndex, ChunkRef, Span
from .kafka_probe import looks_like_compressed_kafka
from .keyring import KeyRing
from .manifest import (
    MAGIC,
    TRAILER_SIZE,
    Manifest,
    build_manifest,
    decode_tail,
    encode_tail,
    is_tsproxy_trailer,
    rewrap,
    tail_length,
)
from .objects import decode_object, encode_object, encode_stream, iter_range, open_object, read_range
from .pipeline import Stages
from .segment import ChunkCut, SegmentEncoder, SegmentInfo
from .settings import DEFAULT_CHUNK_SIZE, FORMAT_VERSION, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, TransformSettings

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_CHUNK_SIZE",
    "MIN_CHUNK_SIZE",
    "TRAILER_SIZE",
    "ChunkCut",
    "ChunkDecoder",
    "ChunkIndex",
    "ChunkRef",
    "KeyRing",
    "Manifest",
    "ObjectContext",
    "SegmentEncoder",
    "SegmentInfo",
    "Span",
    "Stages",
    "TransformSettings",
    "build_manifest",
    "decode_object",
    "decode_tail",
    "encode_object",
    "encode_stream",
    "encode_tail",
    "is_tsproxy_trailer",
    "iter_range",
    "looks_like_compressed_kafka",
    "open_object",
    "read_range",
    "rewrap",
    "tail_length",
]
