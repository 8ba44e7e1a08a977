"""Backends by URL scheme: each backend module registers its kind here, and nothing else picks one.

A kind says which URLs are its own (their prefixes, as written), how its URL is spelt in a message,
which of the backend settings it takes (`config.BackendSettings` names them), whether it is embedded
(a directory on this node: the dev credentials and key ring are allowed with it), what is wrong with a
URL of its own beyond its prefix, and how to open a backend for a URL. Adding a backend is its module,
its registration, its import in `tsproxy.store`, and its tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tsproxy.store.base import Backend


def _no_check(url: str) -> str | None:
    return None


@dataclass(frozen=True)
class BackendKind:
    """One kind of backend (see the module docstring)."""

    name: str
    prefixes: tuple[str, ...]  # URLs of this kind start so, as written ("file:", "https://")
    form: str  # how its URL is spelt, for messages: "file:///path"
    opener: Callable[..., Backend]  # (url, **options, on_request=...) -> a backend not yet started
    options: tuple[str, ...] = ()  # the backend settings it takes
    embedded: bool = False
    check: Callable[[str], str | None] = _no_check  # what is wrong with a URL of this kind, or None

    def open(self, url: str, **options: Any) -> Backend:
        return self.opener(url, **options)


_KINDS: list[BackendKind] = []


def register(kind: BackendKind) -> BackendKind:
    """Make `kind` the backend for URLs with its prefixes (a later kind does not take an earlier's)."""
    _KINDS.append(kind)
    return kind


def kind_of(url: str) -> BackendKind | None:
    """The kind whose prefix `url` has, as written (None: no backend takes it)."""
    return next((k for k in _KINDS if url.startswith(k.prefixes)), None)


def url_forms() -> str:
    """How the URLs of every kind are spelt: "file:///path or http(s)://host:port"."""
    return " or ".join(dict.fromkeys(k.form for k in _KINDS))


def open_backend(url: str, **options: Any) -> Backend:
    """A backend for `url`, not yet started; `options` go to its kind's opener. The scheme is matched
    without regard to case, as URLs are. Unknown options raise TypeError, so a misspelt setting is
    never ignored."""
    scheme, colon, rest = url.partition(":")
    kind = kind_of(scheme.lower() + colon + rest) if colon else None
    if kind is None:
        raise ValueError(f"unsupported backend URL {url!r} (use {url_forms()})")
    return kind.open(url, **options)
