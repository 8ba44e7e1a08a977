"""Errors of the Kafka layer: every one names the object and, where there is one, the byte offset."""

from __future__ import annotations

from tsproxy.errors import FormatError


class CorruptRecordError(FormatError):
    """A record batch, record or index entry is not what the Kafka format says.

    ``offset`` is the byte position (within the object) of the batch or index entry at fault, so an
    operator can find it with ``dd``; ``reason`` says what is wrong in one line.
    """

    def __init__(self, object_name: str, offset: int, reason: str) -> None:
        self.object_name = object_name
        self.offset = offset
        self.reason = reason
        super().__init__(f"{object_name or '<segment>'}: corrupt data at byte {offset}: {reason}")

    def __reduce__(self) -> tuple[type[CorruptRecordError], tuple[str, int, str]]:
        # Spark ships exceptions between processes by pickling them.
        return (type(self), (self.object_name, self.offset, self.reason))


class CodecUnavailableError(FormatError):
    """A batch uses a codec whose library is not installed (install the ``spark`` extra)."""


class ManifestError(FormatError):
    """A tiered-storage ``.rsm-manifest`` is not valid JSON of the expected shape."""

    def __init__(self, object_name: str, reason: str) -> None:
        self.object_name = object_name
        self.reason = reason
        super().__init__(f"{object_name or '<manifest>'}: {reason}")

    def __reduce__(self) -> tuple[type[ManifestError], tuple[str, str]]:
        return (type(self), (self.object_name, self.reason))


class UnsupportedManifestError(ManifestError):
    """The segment was stored with the plugin's own compression or encryption, which tsproxy does instead."""
