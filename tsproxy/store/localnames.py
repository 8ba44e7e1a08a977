"""How the local backend names objects on disk, without I/O.

A key is split on "/" into segments; every segment but the last names a directory, the last names the
object file. Each segment is percent-encoded (everything but ASCII letters, digits and `-_.~`) and
given a one-letter kind: `d` for a directory, `o` for an object. So no name is ever empty, `.`, `..`,
hidden, or contains `/` or NUL, a key `a` and a key `a/b` can live side by side (`oa` and `da/ob`), and
nothing a key says can reach outside its bucket. A segment whose encoding would be longer than a file
name may be is named by its SHA-256 instead (`D…`, `O…`); the original segment of such a directory is
kept in a `.segment` file inside it, and every object file holds its full key.

Directory entries are ordered by `sort_key`, which makes a depth-first walk yield keys in S3 order.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import quote, unquote

OBJECT, DIRECTORY = "o", "d"
HASHED = {OBJECT: "O", DIRECTORY: "D"}
KINDS = {"o": OBJECT, "d": DIRECTORY, "O": OBJECT, "D": DIRECTORY}
# Leaves room under the usual 255-byte NAME_MAX for the kind letter and temp-file suffixes.
MAX_ENCODED = 200
SEGMENT_FILE = ".segment"
BUCKET_NAME = re.compile(r"(?!xn--)(?!.*-s3alias$)(?!\d+\.\d+\.\d+\.\d+$)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def valid_bucket_name(bucket: str) -> bool:
    """S3's bucket naming rules (which also keep a bucket name a plain, safe directory name)."""
    return (
        bool(BUCKET_NAME.fullmatch(bucket))
        and ".." not in bucket
        and ".-" not in bucket
        and "-." not in bucket
    )


def segment_name(segment: str, kind: str) -> str:
    """The on-disk name of one key segment of the given kind (OBJECT or DIRECTORY)."""
    encoded = quote(segment, safe="", errors="strict")
    if len(encoded) <= MAX_ENCODED:
        return kind + encoded
    return HASHED[kind] + hashlib.sha256(segment.encode("utf-8")).hexdigest()


def key_path(key: str) -> list[str]:
    """The names from the bucket directory down to the object file of `key`."""
    segments = key.split("/")
    return [segment_name(s, DIRECTORY) for s in segments[:-1]] + [segment_name(segments[-1], OBJECT)]


def prefix_dirs(prefix: str) -> tuple[list[str], str]:
    """For a listing prefix: the directory names of its complete segments, and the key they stand for.

    `"a/b/c"` -> (`["da", "db"]`, `"a/b/"`): every key with that prefix lives under `da/db`.
    """
    *whole, _ = prefix.split("/")
    base = "".join(s + "/" for s in whole)
    return [segment_name(s, DIRECTORY) for s in whole], base


def parse_name(name: str) -> tuple[str, str | None] | None:
    """(kind, segment) of an entry name; segment None when hashed; None for a name that is not ours."""
    kind = KINDS.get(name[:1])
    if kind is None:
        return None
    if name[0] in "OD":
        return kind, None
    try:
        return kind, unquote(name[1:], errors="strict")
    except UnicodeDecodeError:
        return None


def sort_key(kind: str, segment: str) -> str:
    """Orders one directory's entries so that a depth-first walk yields keys in S3 order.

    The keys under directory `s` all start with `s/`, and no key outside it does, so the whole
    subtree sorts where `s/` sorts.
    """
    return segment + "/" if kind == DIRECTORY else segment
