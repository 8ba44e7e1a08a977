"""Fixtures of the jobs tests: one SparkSession (local[2]) for the whole run and a fresh key ring."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tsproxy.format import KeyRing


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession shared by every jobs test (the JVM takes seconds to start)."""
    from tsproxy.spark.session import spark_session

    session = spark_session("local[2]", app_name="tsproxy-jobs-tests", conf={"spark.ui.enabled": "false"})
    yield session
    session.stop()


@pytest.fixture
def ring_path(tmp_path: Path) -> Path:
    """A key ring file holding one key, "kek-a", active."""
    path = tmp_path / "ring.json"
    KeyRing.new(key_id="kek-a").save(path)
    return path
