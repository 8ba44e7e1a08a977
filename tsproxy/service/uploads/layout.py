"""The reserved namespace's layout: every key tsproxy keeps under a client bucket's `.tsproxy/`, spelt
here and nowhere else (docs/FORMAT.md, "Keys in the backend" and "Multipart uploads in progress", gives
what each holds).

    .tsproxy/mpu/<upload name>/state                 an upload's state (uploads.records.UploadState)
    .tsproxy/mpu/<upload name>/<part:05d>.info       a part's record (PartRecord), maybe with its bytes
    .tsproxy/mpu/<upload name>/<part:05d>-<16 hex>   a part's stored bytes as an object of their own
    .tsproxy/mpu-done/<upload id>                    what a completion answered (CompletedUpload)
    .tsproxy/catalog/...                             the size catalog (service.catalog)
    .tsproxy/bucket                                  a client bucket of a mapped namespace exists
    .tsproxy/probe-<16 hex>                          an object `serve --check` writes and deletes

An upload's *name* is its id less the ticket (uploads.ids.upload_name). `Layout` gives the backend
location of each for a client bucket; the pure functions below read backend keys back, for the sweeps
that work from a listing (service.leftovers, the jobs).
"""

from __future__ import annotations

import secrets

from tsproxy.service.namespace import INTERNAL, Location, Namespace
from tsproxy.service.uploads.ids import upload_name

UPLOADS = "mpu/"  # below INTERNAL: a folder per client upload, by its name
COMPLETED = "mpu-done/"  # below INTERNAL: completed-upload records, by upload id
CATALOG = "catalog/"  # below INTERNAL: the size catalog
BUCKET_MARKER = "bucket"  # below INTERNAL, in a mapped namespace: the client bucket exists
PROBES = "probe-"  # below INTERNAL: serve --check's probe objects
STATE = "state"  # in an upload's folder
RECORD_SUFFIX = ".info"  # of a part record in an upload's folder


def record_name(part_no: int) -> str:
    return f"{part_no:05d}{RECORD_SUFFIX}"


def part_data_name(part_no: int) -> str:
    """A fresh name for a part's stored bytes: a part sent again goes to a new object, and the record
    written after it switches over atomically."""
    return f"{part_no:05d}-{secrets.token_hex(8)}"


def probe_name() -> str:
    return f"{PROBES}{secrets.token_hex(8)}"


def is_state(key: str) -> bool:
    """Whether a backend key inside an upload's folder is the upload's state object."""
    return key.endswith("/" + STATE)


def is_record(key: str) -> bool:
    """Whether a backend key inside an upload's folder is a part record."""
    return key.endswith(RECORD_SUFFIX)


def internal_part(key: str, root: str) -> str | None:
    """The part of a backend key inside the reserved namespace of a bucket root, or None."""
    if not key.startswith(root):
        return None
    rest = key[len(root) :]
    return rest[len(INTERNAL) :] if rest.startswith(INTERNAL) else None


def upload_folder_of(rest: str) -> str | None:
    """The upload name of a key inside the reserved namespace (`internal_part`) that lies in an upload's
    folder, else None."""
    if not rest.startswith(UPLOADS):
        return None
    name, sep, _ = rest[len(UPLOADS) :].partition("/")
    return name if name and sep else None


def upload_prefix(root: str, name: str) -> str:
    """The backend key prefix of an upload's folder, under a bucket root."""
    return f"{root}{INTERNAL}{UPLOADS}{name}/"


def is_completed_record(rest: str) -> bool:
    return rest.startswith(COMPLETED)


def is_probe(rest: str) -> bool:
    """Whether a key inside the reserved namespace is a probe object (at its top, not in a folder)."""
    return rest.startswith(PROBES) and "/" not in rest


class Layout:
    """Where each thing tsproxy keeps for a client bucket lives in the backend."""

    def __init__(self, ns: Namespace) -> None:
        self.ns = ns

    def reserved(self, bucket: str) -> Location:
        """The reserved namespace of a client bucket (a prefix)."""
        return self.ns.internal(bucket, "")

    def uploads(self, bucket: str) -> Location:
        """The folder of every upload's folder (a prefix)."""
        return self.ns.internal(bucket, UPLOADS)

    def upload(self, bucket: str, upload_id: str, name: str = "") -> Location:
        """An upload's folder (a prefix), or `name` in it; `upload_id` may carry its ticket."""
        return self.ns.internal(bucket, f"{UPLOADS}{upload_name(upload_id)}/{name}")

    def state(self, bucket: str, upload_id: str) -> Location:
        return self.upload(bucket, upload_id, STATE)

    def record(self, bucket: str, upload_id: str, part_no: int) -> Location:
        return self.upload(bucket, upload_id, record_name(part_no))

    def part_data(self, bucket: str, upload_id: str, part_no: int) -> Location:
        return self.upload(bucket, upload_id, part_data_name(part_no))

    def completed(self, bucket: str, upload_id: str = "") -> Location:
        """A completed-upload record, or with no id their folder (a prefix)."""
        return self.ns.internal(bucket, f"{COMPLETED}{upload_id}")

    def catalog(self, bucket: str) -> Location:
        """The size catalog's folder (a prefix)."""
        return self.ns.internal(bucket, CATALOG)

    def bucket_marker(self, bucket: str) -> Location:
        return self.ns.internal(bucket, BUCKET_MARKER)

    def is_bucket_marker(self, key: str) -> bool:
        """Whether a backend key is a bucket marker (in a mapped namespace, where there are some)."""
        return self.ns.mapped and key.endswith(INTERNAL + BUCKET_MARKER)

    def mapped_reserved(self) -> Location | None:
        """The reserved namespace at the top of a mapped namespace (where probes of it go), or None."""
        if self.ns.backend_bucket is None:
            return None
        return Location(self.ns.backend_bucket, f"{self.ns.backend_prefix}{INTERNAL}")
