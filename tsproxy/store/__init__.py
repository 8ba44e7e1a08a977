"""Storage backends behind one small async interface (`tsproxy.store.base.Backend`), with multipart
uploads and bucket administration as separate capabilities (`MultipartCapable`, `BucketCapable`) and
one hook every backend request passes through (`tsproxy.store.observe.RequestObserver`).

`open_backend(url, **options)` picks one from a URL: `file:///abs/path` is the embedded local
directory backend, `http(s)://host:port` an S3-compatible store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from tsproxy.store.base import (
    Backend,
    BucketCapable,
    ListPage,
    MultipartCapable,
    ObjectInfo,
    ObjectReader,
    UploadInfo,
)
from tsproxy.store.local import LocalBackend
from tsproxy.store.observe import RequestObserver
from tsproxy.store.s3 import S3Backend

__all__ = [
    "Backend",
    "BucketCapable",
    "ListPage",
    "LocalBackend",
    "MultipartCapable",
    "ObjectInfo",
    "ObjectReader",
    "RequestObserver",
    "S3Backend",
    "UploadInfo",
    "open_backend",
]


def open_backend(url: str, **options: Any) -> Backend:
    """A backend for `url`, not yet started; `options` go to its constructor.

    `file:///abs/path` (or `file://./relative`) -> LocalBackend; `http(s)://host[:port]` -> S3Backend
    with that endpoint. Unknown options raise TypeError, so a misspelt setting is never ignored.
    """
    scheme = urlsplit(url).scheme.lower()
    if scheme == "file":
        rest = url[len("file://") :] if url[:7].lower() == "file://" else url[len("file:") :]
        if rest.startswith("localhost/"):
            rest = rest[len("localhost") :]
        if not rest:
            raise ValueError(f"{url!r} names no directory")
        return LocalBackend(Path(unquote(rest)), **options)
    if scheme in ("http", "https"):
        parts = urlsplit(url)
        if not parts.hostname or parts.path not in ("", "/") or parts.query:
            raise ValueError(f"{url!r} is not an endpoint (expected http(s)://host[:port])")
        return S3Backend(f"{scheme}://{parts.netloc}", **options)
    raise ValueError(f"unsupported backend URL {url!r} (use file:///path or http(s)://host:port)")
