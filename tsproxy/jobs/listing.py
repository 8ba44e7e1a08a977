"""The driver's one listing of a bucket, page by page (shared with the server's janitor)."""

from __future__ import annotations

from tsproxy.service.leftovers import list_keys

__all__ = ["list_keys"]
