"""Storage backends behind one small async interface (`tsproxy.store.base.Backend`), with multipart
uploads and bucket administration as separate capabilities (`MultipartCapable`, `BucketCapable`) and
one hook every backend request passes through (`tsproxy.store.observe.RequestObserver`).

`open_backend(url, **options)` picks one from a URL by the kinds the backend modules register
(`registry`): `file:///abs/path` is the embedded local directory backend (`local`), `http(s)://host:port`
an S3-compatible store (`s3`). Importing this package registers them.
"""

from __future__ import annotations

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
from tsproxy.store.registry import BackendKind, kind_of, open_backend, url_forms
from tsproxy.store.s3 import S3Backend

__all__ = [
    "Backend",
    "BackendKind",
    "BucketCapable",
    "ListPage",
    "LocalBackend",
    "MultipartCapable",
    "ObjectInfo",
    "ObjectReader",
    "RequestObserver",
    "S3Backend",
    "UploadInfo",
    "kind_of",
    "open_backend",
    "url_forms",
]
