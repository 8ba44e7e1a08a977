"""Finding a stored object's tail from its end. Pure: sizes and bytes in, answers out; no I/O.

A tsproxy object ends in its tail: the manifest, then the fixed-size trailer that gives the manifest's
length (see manifest.py). Whoever reads a tail -- the object service, the jobs, the Spark source --
reads a suffix of the object as long as a first guess, asks `find_tail` what those bytes say, and
reads once more only when the tail turns out longer than the guess:

    search = find_tail(read_suffix(first_read(guess)), size)
    if search.read_next:
        search = find_tail(read_suffix(search.read_next), size)
    search.tail  # None: the object ends in no tsproxy trailer

A good guess makes that one request: the tail length the backend metadata records (`metadata_guess`),
or `TAIL_GUESS`, which holds the manifests of ordinary objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tsproxy.errors import IntegrityError

from .manifest import META_TAIL_LENGTH, TRAILER_SIZE, is_tsproxy_trailer, tail_length

# A suffix this long holds the tail of an ordinary object (the manifest grows with its chunks).
TAIL_GUESS = 64 << 10


class TailTooLong(IntegrityError):
    """The trailer names a tail longer than the whole object: the object was cut short."""

    def __init__(self, length: int, size: int) -> None:
        super().__init__(f"the trailer names a {length}-byte tail in a {size}-byte object")
        self.length = length
        self.size = size


@dataclass(frozen=True)
class TailSearch:
    """What an object's last bytes say about its tail."""

    length: int  # manifest plus trailer; 0 when there is no tsproxy trailer (or none read yet)
    read_next: int  # bytes to read from the object's end next; 0 when nothing more is needed
    tail: memoryview | None  # the tail itself, once the bytes given hold all of it

    @property
    def has_trailer(self) -> bool:
        return self.length > 0


def first_read(guess: int) -> int:
    """How many bytes to read from an object's end first: the guess, and never less than a trailer."""
    return max(guess, TRAILER_SIZE)


def metadata_guess(metadata: Mapping[str, str], size: int) -> int:
    """The tail length the backend metadata records, when it is plausible for an object of `size`
    bytes; else TRAILER_SIZE (read the trailer, then the tail it names)."""
    recorded = metadata.get(META_TAIL_LENGTH, "")
    length = int(recorded) if recorded.isascii() and recorded.isdigit() else 0
    return length if TRAILER_SIZE < length <= size else TRAILER_SIZE


def find_tail(end: bytes | bytearray | memoryview, size: int) -> TailSearch:
    """Look for the tail in `end`, the last bytes of an object of `size` stored bytes.

    TailTooLong when the trailer names a tail longer than the object; FormatError (or IntegrityError)
    when the trailer names an unsupported format version or is malformed.
    """
    view = memoryview(end).cast("B")
    if len(view) < TRAILER_SIZE:
        whole = len(view) >= size
        return TailSearch(0, 0 if whole else TRAILER_SIZE, None)
    if not is_tsproxy_trailer(view):
        return TailSearch(0, 0, None)
    length = tail_length(view[-TRAILER_SIZE:])
    if length > size:
        raise TailTooLong(length, size)
    if length > len(view):
        return TailSearch(length, length, None)
    return TailSearch(length, 0, view[len(view) - length :])
