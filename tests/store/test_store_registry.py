"""Backends register by URL prefix: config, settings and open_backend find them through the registry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tsproxy.config import BackendSettings, Config, ConfigError, is_local_url
from tsproxy.store import LocalBackend, S3Backend, kind_of, open_backend, registry, url_forms


def test_the_two_kinds_and_their_urls() -> None:
    assert url_forms() == "file:///path or http(s)://host:port"
    local, s3 = kind_of("file:///data"), kind_of("https://s3.example:443")
    assert local is not None and local.embedded and local.options == ()
    assert s3 is not None and not s3.embedded and "access_key" in s3.options
    assert kind_of("ftp://x") is None and kind_of("http:x") is None
    assert is_local_url("file://./data") and not is_local_url("http://127.0.0.1:9000")
    assert isinstance(open_backend("FILE:///tmp/x"), LocalBackend)  # schemes match without case
    assert isinstance(open_backend("HTTP://127.0.0.1:9"), S3Backend)
    with pytest.raises(ValueError, match="use file:///path or http"):
        open_backend("ftp://x")
    assert s3.check("http://h:1/bucket") is not None and s3.check("http://h:1") is None


def test_a_new_kind_needs_no_change_to_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kind registered elsewhere: the settings accept its URLs and open it with the settings it names."""
    opened: list[tuple[str, dict[str, Any]]] = []

    def opener(url: str, **options: Any) -> LocalBackend:
        opened.append((url, options))
        return LocalBackend(tmp_path)

    kind = registry.BackendKind("memo", ("memo://",), "memo://name", opener, options=("region",))
    monkeypatch.setattr(registry, "_KINDS", [*registry._KINDS, kind])
    assert url_forms().endswith(" or memo://name")
    cfg = Config(backend="memo://here", backend_region="r1", credentials=())
    backend = BackendSettings(url=cfg.backend, region=cfg.backend_region).open(on_request=None)
    assert isinstance(backend, LocalBackend)
    assert opened == [("memo://here", {"on_request": None, "region": "r1"})]
    with pytest.raises(ConfigError, match="is not file:///path or http\\(s\\)://host:port or memo://name"):
        Config(backend="gopher://x")
