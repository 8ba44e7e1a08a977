"""Transform settings: how new objects are chunked, compressed and encrypted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tsproxy import defaults
from tsproxy.errors import ConfigError

MIN_CHUNK_SIZE = 64 * 1024
MAX_CHUNK_SIZE = 64 * 1024 * 1024
DEFAULT_CHUNK_SIZE = defaults.CHUNK_SIZE
FORMAT_VERSION = 1

CompressionMode = Literal["off", "on", "auto"]
COMPRESSION_MODES: tuple[CompressionMode, ...] = ("off", "on", "auto")
MIN_LEVEL = 1
MAX_LEVEL = 22


@dataclass(frozen=True)
class TransformSettings:
    """How the store path transforms an object; readers take everything from the manifest instead."""

    # The server's defaults (tsproxy/defaults.py); the stored format records none of them.
    chunk_size: int = DEFAULT_CHUNK_SIZE
    compression: CompressionMode = defaults.COMPRESSION
    level: int = defaults.COMPRESSION_LEVEL
    encryption: bool = defaults.ENCRYPTION

    def __post_init__(self) -> None:
        if not isinstance(self.chunk_size, int) or not MIN_CHUNK_SIZE <= self.chunk_size <= MAX_CHUNK_SIZE:
            raise ConfigError(
                f"chunk_size: {self.chunk_size!r} is not between {MIN_CHUNK_SIZE} and {MAX_CHUNK_SIZE} bytes"
            )
        if self.compression not in COMPRESSION_MODES:
            raise ConfigError(f"compression: {self.compression!r} is not one of off, on, auto")
        if not isinstance(self.level, int) or not MIN_LEVEL <= self.level <= MAX_LEVEL:
            raise ConfigError(f"compression level: {self.level!r} is not between {MIN_LEVEL} and {MAX_LEVEL}")
