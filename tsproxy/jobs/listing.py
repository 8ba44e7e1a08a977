"""The driver's one listing of a bucket, page by page."""

from __future__ import annotations

from tsproxy.s3.limits import MAX_LIST_KEYS
from tsproxy.store.base import Backend

from .plan import Listed


async def list_keys(
    backend: Backend, bucket: str, prefix: str = "", *, page_size: int = MAX_LIST_KEYS
) -> list[Listed]:
    """Every object under `prefix`, in listing order (UTF-8 byte order of the key)."""
    out: list[Listed] = []
    token: str | None = None
    while True:
        page = await backend.list(bucket, prefix=prefix, token=token, max_keys=page_size)
        out += [Listed(o.key, o.size, o.etag, o.last_modified.timestamp()) for o in page.objects]
        if not page.is_truncated or not page.next_token:
            return out
        token = page.next_token
