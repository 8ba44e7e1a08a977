"""An upload's state object keeps the stored format version its parts are written in; a state written by
a release before format 2 (four settings) is read as version 1."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from tsproxy.format import TransformSettings
from tsproxy.service.uploads.records import UploadState


@pytest.mark.parametrize("version", [1, 2])
def test_the_state_keeps_the_format_version(version: int) -> None:
    settings = TransformSettings(chunk_size=2 << 20, compression="on", level=3, format_version=version)
    state = UploadState("u", "k", b"ctx", settings, None, {}, {}, datetime(2026, 1, 2, tzinfo=UTC), "b")
    assert UploadState.from_bytes(state.to_bytes()).settings == settings


def test_a_state_of_an_earlier_release_is_version_1() -> None:
    settings = TransformSettings(format_version=2)
    state = UploadState("u", "k", b"ctx", settings, None, {}, {}, datetime(2026, 1, 2, tzinfo=UTC))
    fields = json.loads(state.to_bytes())
    fields["settings"] = fields["settings"][:4]
    assert UploadState.from_bytes(json.dumps(fields).encode()).settings.format_version == 1
