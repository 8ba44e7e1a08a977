"""Transform settings: how new objects are chunked, compressed and encrypted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tsproxy import defaults
from tsproxy.errors import ConfigError

from .zstdframes import FRAME_SIZE

MIN_CHUNK_SIZE = 64 * 1024
MAX_CHUNK_SIZE = 64 * 1024 * 1024
DEFAULT_CHUNK_SIZE = defaults.CHUNK_SIZE
# Versions this code reads, and the newest it writes (new objects get defaults.FORMAT_VERSION).
READABLE_VERSIONS = (1, 2)
FORMAT_VERSION = 2

CompressionMode = Literal["off", "on", "auto"]
COMPRESSION_MODES: tuple[CompressionMode, ...] = ("off", "on", "auto")
MIN_LEVEL = 1
MAX_LEVEL = 22
MIN_FRAME_SIZE = 4 * 1024


@dataclass(frozen=True)
class TransformSettings:
    """How the store path transforms an object; readers take everything from the manifest instead."""

    # The server's defaults (tsproxy/defaults.py); the stored format records none of them.
    chunk_size: int = DEFAULT_CHUNK_SIZE
    compression: CompressionMode = defaults.COMPRESSION
    level: int = defaults.COMPRESSION_LEVEL
    encryption: bool = defaults.ENCRYPTION
    # 1: a compressed chunk is one zstd frame; 2: a run of frames of `frame_size` original bytes each,
    # the last shorter (partial reads inflate only the frames they need). Readers of 1 cannot read 2.
    format_version: int = defaults.FORMAT_VERSION
    # Format 2's frame size: the writer's choice (readers find frames by their headers).
    frame_size: int = FRAME_SIZE

    def __post_init__(self) -> None:
        if not isinstance(self.chunk_size, int) or not MIN_CHUNK_SIZE <= self.chunk_size <= MAX_CHUNK_SIZE:
            raise ConfigError(
                f"chunk_size: {self.chunk_size!r} is not between {MIN_CHUNK_SIZE} and {MAX_CHUNK_SIZE} bytes"
            )
        if self.compression not in COMPRESSION_MODES:
            raise ConfigError(f"compression: {self.compression!r} is not one of off, on, auto")
        if not isinstance(self.level, int) or not MIN_LEVEL <= self.level <= MAX_LEVEL:
            raise ConfigError(f"compression level: {self.level!r} is not between {MIN_LEVEL} and {MAX_LEVEL}")
        if self.format_version not in READABLE_VERSIONS:
            raise ConfigError(f"format_version: {self.format_version!r} is not one of 1, 2")
        if not isinstance(self.frame_size, int) or not MIN_FRAME_SIZE <= self.frame_size <= MAX_CHUNK_SIZE:
            raise ConfigError(
                f"frame_size: {self.frame_size!r} is not between {MIN_FRAME_SIZE} and {MAX_CHUNK_SIZE} bytes"
            )
