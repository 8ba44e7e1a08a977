"""Where client buckets and keys live in the backend, and the reserved namespace for tsproxy's state."""

from __future__ import annotations

from dataclasses import dataclass

INTERNAL = ".tsproxy/"


@dataclass(frozen=True)
class Location:
    """Where an object lives in the backend."""

    bucket: str
    key: str


class Namespace:
    """Maps client buckets and keys to backend locations.

    By default a client bucket is the backend bucket of the same name. With `backend_bucket` set, every
    client bucket becomes a prefix `<backend_prefix><bucket>/` inside that one backend bucket.
    """

    def __init__(self, backend_bucket: str | None = None, backend_prefix: str = "") -> None:
        self.backend_bucket = backend_bucket
        self.backend_prefix = backend_prefix

    @property
    def mapped(self) -> bool:
        return self.backend_bucket is not None

    def root(self, bucket: str) -> Location:
        """The backend bucket and the key prefix under which a client bucket's objects live."""
        if self.backend_bucket is None:
            return Location(bucket, "")
        return Location(self.backend_bucket, f"{self.backend_prefix}{bucket}/")

    def object(self, bucket: str, key: str) -> Location:
        root = self.root(bucket)
        return Location(root.bucket, root.key + key)

    def internal(self, bucket: str, name: str) -> Location:
        root = self.root(bucket)
        return Location(root.bucket, root.key + INTERNAL + name)

    def client_key(self, bucket: str, backend_key: str) -> str | None:
        """The client's key for a backend key, or None for internal objects."""
        prefix = self.root(bucket).key
        if not backend_key.startswith(prefix):
            return None
        key = backend_key[len(prefix) :]
        return None if key.startswith(INTERNAL) else key
