"""The jobs as a user runs them: the installed `tsproxy` entry point, no `--master`, no PYSPARK_PYTHON,
and the system's `python3` first on the PATH (tests/support/as_user.py)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from tests.jobs.jobhelpers import records
from tests.support.as_user import run_tsproxy, user_env
from tsproxy.format import KeyRing, TransformSettings, encode_object
from tsproxy.format.manifest import META_FORMAT
from tsproxy.store.local import LocalBackend

pytestmark = [pytest.mark.spark, pytest.mark.slow]


async def _seed(root: Path, ring: KeyRing) -> None:
    backend = LocalBackend(root, fsync=False)
    await backend.start()
    await backend.create_bucket("tiered")
    for n in range(3):
        body = encode_object(records(150_000, n), TransformSettings(chunk_size=1 << 16), ring)
        await backend.put("tiered", f"seg-{n}", body, metadata={META_FORMAT: "1"})
    await backend.close()


def test_jobs_verify_without_master_or_pyspark_python(tmp_path: Path) -> None:
    """Spark's workers run the Python tsproxy is installed in, whatever `python3` on the PATH is."""
    ring = KeyRing.new()
    ring.save(tmp_path / "ring.json")
    os.chmod(tmp_path / "ring.json", 0o600)
    asyncio.run(_seed(tmp_path / "store", ring))
    (tmp_path / "tsproxy.toml").write_text('backend = "file://./store"\nkey_ring = "ring.json"\n')
    assert "PYSPARK_PYTHON" not in user_env()
    done = run_tsproxy(
        ["jobs", "verify", "--config", "tsproxy.toml", "--bucket", "tiered", "--output", "out"], tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ModuleNotFoundError" not in done.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["counts"] == {"ok": 3} and summary["ok"] is True


def test_worker_python_is_the_configured_one_else_this_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from tsproxy.spark.session import worker_python

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert worker_python({}) == sys.executable == os.environ["PYSPARK_PYTHON"]
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python/bin/python3")
    assert worker_python({}) == "/opt/python/bin/python3"  # the user's variable stands
    assert worker_python({"spark.pyspark.python": "/srv/py"}) == "/srv/py"  # and --conf beats it
    assert os.environ["PYSPARK_PYTHON"] == "/srv/py"
