"""Where client buckets and keys live in the backend, and the reserved namespace for tsproxy's state.

Every client key is mapped to a backend key by `backend_name`, a reversible encoding whose results
never start with `INTERNAL`. So no key a client can spell, however it is spelled, names tsproxy's own
state: the reserved namespace is outside the image of the mapping, not behind a check on the key.

Most keys map to themselves. A key is stored as it is only when every backend keeps it apart from every
other key: it does not start with `/`, has no `//`, no `.` or `..` segment, no character a backend folds or
refuses (`FOLDED`: `\\`, which SeaweedFS stores as `/`, and NUL, which it refuses), does not start with
`.tsproxy` (the reserved and escaped areas), and names no folder a backend keeps for itself
(`BACKEND_FOLDERS`: SeaweedFS's `.uploads`, where a bucket's multipart uploads live). Object stores that
normalise keys (SeaweedFS folds a leading `/`, repeated slashes and backslashes, HTTP stacks may resolve
dot segments) would otherwise make `/a` and `a`, `a//b` and `a/b`, or `\\a` and `a`, one object. Any other
key is *escaped*: stored under `ESCAPED` with `%` written `%25`, a `/` that starts the key or follows
another `/` written `%2F`, the dots of a `.` or `..` segment written `%2E`, and each folded character
written `%` and its two hex digits. The result has none of the shapes a backend folds, and decoding those
escapes gives the client's key back.
docs/FORMAT.md ("Keys in the backend") states the mapping; tests/hostile measures what SeaweedFS folds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tsproxy import errors
from tsproxy.s3.limits import MAX_KEY_BYTES
from tsproxy.s3.routing import check_bucket_name

INTERNAL = ".tsproxy/"  # tsproxy's state: multipart uploads, size catalog, bucket markers
ESCAPED = ".tsproxy~"  # client keys that cannot be stored as they are
RESERVED_START = ".tsproxy"  # keys starting so are escaped, so no client key lands in either area
# Characters some backend folds onto another key or refuses: SeaweedFS stores `\\` as `/` (so `\\a` is
# `/a`, then `a`) and refuses NUL. A key holding one is escaped, so the backend never sees it.
FOLDED = "\\\x00"
# Folders a backend keeps for itself at a bucket's root: SeaweedFS holds each multipart upload of a bucket
# as `.uploads/<upload id>/`, where a plain PUT of `.uploads/<id>/0001.part` writes a part into that
# upload and other objects are left out of listings. A key naming one, or under one, is escaped.
BACKEND_FOLDERS = (".uploads",)
_ESCAPES = {ch: f"%{ord(ch):02X}" for ch in FOLDED} | {"%": "%25"}
_UNESCAPED = {code[1:]: ch for ch, code in _ESCAPES.items()} | {"2F": "/", "2E": "."}
_UNESCAPE = re.compile("%(" + "|".join(sorted(_UNESCAPED)) + ")")
_FOLDED_ANYWHERE = re.compile("[" + re.escape(FOLDED) + "]")


def stored_as_is(key: str) -> bool:
    """True when `key` is its own backend name (no backend can fold it onto another key)."""
    return not _escaped_shape(key, key.split("/"))


def prefix_reachable(prefix: str) -> bool:
    """True when a key stored as it is may start with `prefix` (a common prefix a listing rolled up).

    False when every key under it is escaped or reserved: it starts with `/` or `.tsproxy`, or holds
    `//`, a folded character, a whole `.` or `..` segment or a backend's folder as its first whole
    segment. Its last segment may still grow into a key's (`.` into `.a`), so a prefix is not judged as a
    key (`stored_as_is`) would be.
    """
    return not _escaped_shape(prefix, prefix.split("/")[:-1])


def _escaped_shape(text: str, whole_segments: list[str]) -> bool:
    """Whether a key, or every key starting with `text`, is escaped; `whole_segments` are the segments of
    `text` that nothing more can be added to (all of a key's)."""
    if text.startswith(("/", RESERVED_START)) or "//" in text or _FOLDED_ANYWHERE.search(text):
        return True
    if whole_segments and whole_segments[0] in BACKEND_FOLDERS:
        return True
    return any(segment in (".", "..") for segment in whole_segments)


def shares_reserved_start(prefix: str) -> bool:
    """True when `prefix` is a proper start of `.tsproxy` (`.`, `.t`, ... `.tsprox`): a backend's listing
    may roll its reserved names up into it, alone or with client keys, so only a look at what it holds
    tells whether a client sees it."""
    return 0 < len(prefix) < len(RESERVED_START) and RESERVED_START.startswith(prefix)


def _escape(key: str) -> str:
    out: list[str] = []
    segment_start = 0
    for i, ch in enumerate(key):
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch == "/":
            out.append("%2F" if i == 0 or key[i - 1] == "/" else "/")
            segment_start = i + 1
        elif ch == "." and _in_dot_segment(key, segment_start):
            out.append("%2E")
        else:
            out.append(ch)
    return "".join(out)


def _in_dot_segment(key: str, start: int) -> bool:
    end = key.find("/", start)
    return key[start : len(key) if end < 0 else end] in (".", "..")


def backend_name(key: str) -> str:
    """The backend key (below the bucket's root) of a client key: injective, never under INTERNAL."""
    return key if stored_as_is(key) else ESCAPED + _escape(key)


def client_name(name: str) -> str | None:
    """The client key a backend key (below the bucket's root) stands for; None when it stands for none.

    None for tsproxy's own state and for backend keys no client key maps to (an object written straight
    into the backend under a key a client could not reach through tsproxy).
    """
    if name.startswith(ESCAPED):
        key = _UNESCAPE.sub(lambda m: _UNESCAPED[m.group(1)], name[len(ESCAPED) :])
        return key if backend_name(key) == name else None
    return name if stored_as_is(name) else None


@dataclass(frozen=True)
class Location:
    """Where an object lives in the backend."""

    bucket: str
    key: str


class Namespace:
    """Maps client buckets and keys to backend locations.

    By default a client bucket is the backend bucket of the same name. With `backend_bucket` set, every
    client bucket becomes a prefix `<backend_prefix><bucket>/` inside that one backend bucket, and only
    a name CreateBucket takes names one (`addressable`): `.tsproxy` would be tsproxy's own prefix there.
    """

    def __init__(self, backend_bucket: str | None = None, backend_prefix: str = "") -> None:
        self.backend_bucket = backend_bucket
        self.backend_prefix = backend_prefix

    @property
    def mapped(self) -> bool:
        return self.backend_bucket is not None

    def addressable(self, bucket: str) -> bool:
        """Whether `bucket` can name a client bucket: any name when client buckets are the backend's
        own (the backend answers for them); in a mapped namespace only a name CreateBucket accepts, so
        that no bucket's prefix is tsproxy's own (`.tsproxy`) or reaches into another's."""
        if self.backend_bucket is None:
            return True
        try:
            check_bucket_name(bucket, strict=True)
        except errors.InvalidBucketName:
            return False
        return True

    def root(self, bucket: str) -> Location:
        """The backend bucket and the key prefix under which a client bucket's objects live; NoSuchBucket
        for a name no client bucket can have (`addressable`)."""
        if self.backend_bucket is None:
            return Location(bucket, "")
        if not self.addressable(bucket):
            raise errors.NoSuchBucket(BucketName=bucket)
        return Location(self.backend_bucket, f"{self.backend_prefix}{bucket}/")

    def object(self, bucket: str, key: str) -> Location:
        """Where the client's object (bucket, key) lives; KeyTooLong when its backend key would be."""
        root = self.root(bucket)
        name = root.key + backend_name(key)
        size = len(name.encode("utf-8", "surrogatepass"))
        if size > MAX_KEY_BYTES:
            raise errors.KeyTooLongError(Size=str(size), MaxSizeAllowed=str(MAX_KEY_BYTES))
        return Location(root.bucket, name)

    def internal(self, bucket: str, name: str) -> Location:
        """Where tsproxy keeps its own state `name` for a client bucket (no client key maps here)."""
        root = self.root(bucket)
        return Location(root.bucket, root.key + INTERNAL + name)

    def client_key(self, bucket: str, backend_key: str) -> str | None:
        """The client's key for a backend key, or None for internal objects and unreachable names."""
        prefix = self.root(bucket).key
        if not backend_key.startswith(prefix):
            return None
        return client_name(backend_key[len(prefix) :])
