"""Where the export writes: a local or cluster filesystem path, or an S3 bucket and prefix.

Every file appears whole or not at all. A local file is written under a hidden temporary name in its
final directory and renamed into place (os.replace is atomic within one filesystem); an S3 object is
written from a finished local temporary file with one PUT, which S3 makes visible atomically. Names
starting with "." or "_" are skipped by Spark, Hive and pyarrow dataset readers, so neither temporary
files nor the export's state directory show up as data.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tsproxy import errors
from tsproxy.durable import fsync_dir

from .bucket import Bucket
from .options import OptionError, StoreOptions


class Output(Protocol):
    """The export's destination; paths are relative, '/'-separated."""

    def describe(self, path: str) -> str:
        """The full location of a relative path, for messages."""
        ...

    def temp_file(self, path: str) -> Path:
        """A fresh local file to write what will become `path`."""
        ...

    def commit(self, temp: Path, path: str) -> int:
        """Make the finished temp file visible as `path` (replacing any older one); returns its size."""
        ...

    def discard(self, temp: Path) -> None:
        """Drop a temp file that will not be committed."""
        ...

    def list(self, prefix: str) -> list[str]:
        """Relative paths of the files under prefix."""
        ...

    def delete(self, path: str) -> None:
        """Remove a file if it is there."""
        ...

    def read_bytes(self, path: str) -> bytes:
        """A small file's content."""
        ...


@dataclass(frozen=True)
class LocalOutput:
    """A directory on a local or cluster (NFS, mounted) filesystem that every executor can reach."""

    root: str

    def describe(self, path: str) -> str:
        return os.path.join(self.root, path)

    def temp_file(self, path: str) -> Path:
        final = Path(self.root, path)
        final.parent.mkdir(parents=True, exist_ok=True)
        return final.with_name(f".{final.name}.{uuid.uuid4().hex[:12]}.tmp")

    def commit(self, temp: Path, path: str) -> int:
        final = Path(self.root, path)
        with open(temp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(temp, final)
        fsync_dir(final.parent, best_effort=True)
        return final.stat().st_size

    def discard(self, temp: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()

    def list(self, prefix: str) -> list[str]:
        base = Path(self.root, prefix)
        if not base.is_dir():
            return []
        root = Path(self.root)
        return sorted(p.relative_to(root).as_posix() for p in base.rglob("*") if p.is_file())

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            Path(self.root, path).unlink()

    def read_bytes(self, path: str) -> bytes:
        return Path(self.root, path).read_bytes()


@dataclass(frozen=True)
class S3Output:
    """s3://bucket/prefix on any S3 endpoint (a tsproxy, the backend, AWS)."""

    store: StoreOptions

    def _key(self, path: str) -> str:
        return self.store.prefix + path

    def describe(self, path: str) -> str:
        return self.store.uri(self._key(path))

    def temp_file(self, path: str) -> Path:
        fd, name = tempfile.mkstemp(prefix=".tsproxy-export-", suffix=".tmp")
        os.close(fd)
        return Path(name)

    def commit(self, temp: Path, path: str) -> int:
        bucket = Bucket(self.store)
        size = temp.stat().st_size
        try:
            with open(temp, "rb") as body:
                # One PUT: the object appears whole or not at all (S3 allows up to 5 GiB this way).
                bucket.call(
                    self.describe(path),
                    bucket.client.put_object,
                    Bucket=self.store.bucket,
                    Key=self._key(path),
                    Body=body,
                    ContentLength=size,
                )
        finally:
            self.discard(temp)
        return size

    def discard(self, temp: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()

    def list(self, prefix: str) -> list[str]:
        cut = len(self.store.prefix)
        try:
            return [key[cut:] for key, _ in Bucket(self.store).list(self._key(prefix))]
        except errors.NoSuchBucket:
            return []

    def delete(self, path: str) -> None:
        bucket = Bucket(self.store)
        bucket.call(
            self.describe(path), bucket.client.delete_object, Bucket=self.store.bucket, Key=self._key(path)
        )

    def read_bytes(self, path: str) -> bytes:
        return Bucket(self.store).read(self._key(path))


def open_output(location: str, store: StoreOptions | None = None) -> Output:
    """An Output for a local path or s3://bucket/prefix (store gives the endpoint and credentials)."""
    if location.startswith("s3://"):
        bucket, _, prefix = location[5:].partition("/")
        if not bucket:
            raise OptionError(f"export: output {location!r} names no bucket")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        base = store or StoreOptions(bucket=bucket)
        return S3Output(
            StoreOptions(
                bucket=bucket,
                prefix=prefix,
                endpoint=base.endpoint,
                region=base.region,
                access_key=base.access_key,
                secret_key=base.secret_key,
                path_style=base.path_style,
            )
        )
    if "://" in location:
        raise OptionError(f"export: output must be a filesystem path or s3://bucket/prefix, not {location!r}")
    return LocalOutput(os.path.abspath(location))
