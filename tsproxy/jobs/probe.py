"""Reading just enough of an object to know what it is: its metadata and, for tsproxy objects, the tail.

One suffix GET usually answers everything (manifests are small); a second fetches a tail longer than
the first guess. Backend metadata says whether tsproxy wrote an object; the trailer says whether its
end still looks like it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tsproxy import errors
from tsproxy.errors import FormatError
from tsproxy.format.manifest import META_FORMAT
from tsproxy.format.tail import TAIL_GUESS, TailTooLong, find_tail, first_read
from tsproxy.store.base import Backend, ObjectInfo

from .checks import Truncated


@dataclass(frozen=True)
class Probe:
    """What the end of an object says about it."""

    info: ObjectInfo  # of the whole object, from the same response
    tail: bytes | None  # the tsproxy tail (manifest and trailer), when the object ends in a trailer
    tail_error: FormatError | None = None  # a trailer that names an impossible or unsupported tail

    @property
    def written_by_tsproxy(self) -> bool:
        """The backend metadata marks the object as tsproxy's."""
        return META_FORMAT in self.info.metadata

    @property
    def has_trailer(self) -> bool:
        return self.tail is not None or self.tail_error is not None

    @property
    def data_size(self) -> int:
        """Stored bytes before the tail (the whole object when there is no tail)."""
        return self.info.size - (len(self.tail) if self.tail is not None else 0)


async def probe(backend: Backend, bucket: str, key: str, *, guess: int = TAIL_GUESS) -> Probe:
    """Fetch the object's info and tail; NoSuchKey when it is gone."""
    try:
        info, end = await backend.get_bytes(bucket, key, -first_read(guess), None)
    except errors.InvalidRange:
        # Some stores refuse any range of an empty object.
        return Probe(await backend.head(bucket, key), None)
    try:
        search = find_tail(end, info.size)
        if search.read_next:
            _, end = await backend.get_bytes(bucket, key, -search.read_next, None, if_match=info.etag)
            search = find_tail(end, info.size)
    except TailTooLong as e:
        return Probe(info, None, Truncated(str(e)))
    except FormatError as e:
        return Probe(info, None, e)
    return Probe(info, bytes(search.tail) if search.tail is not None else None)
