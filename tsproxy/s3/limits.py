"""S3's own limits, written down once: every layer that checks one imports it from here."""

from __future__ import annotations

from tsproxy import errors

MIB = 1 << 20

MIN_PART_SIZE = 5 * MIB  # every multipart part but the last
MAX_PART_SIZE = 5 << 30  # one PutObject, one UploadPart, one CopyObject source
MAX_PARTS = 10_000  # parts of one multipart upload, numbered 1..MAX_PARTS
MAX_KEY_BYTES = 1024  # UTF-8 length of an object key
MAX_DELETE_KEYS = 1000  # keys in one DeleteObjects request
MAX_LIST_KEYS = 1000  # entries in one listing page


def check_part_number(part_no: int) -> None:
    """Raise InvalidArgument unless `part_no` is a part number S3 accepts (1..MAX_PARTS)."""
    if not 1 <= part_no <= MAX_PARTS:
        raise errors.InvalidArgument(
            f"Part number must be an integer between 1 and {MAX_PARTS}, inclusive", ArgumentName="partNumber"
        )
