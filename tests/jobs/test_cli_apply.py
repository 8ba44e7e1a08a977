"""Every job that writes is a dry run unless given --apply: `tsproxy jobs` from its command line, over a
local backend whose files are compared byte for byte before and after."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.jobs.jobhelpers import records
from tsproxy.format import KeyRing, TransformSettings, encode_object
from tsproxy.format.manifest import META_FORMAT
from tsproxy.jobs import cli as jobs_cli
from tsproxy.store.local import LocalBackend

pytestmark = pytest.mark.spark


async def _seed(root: Path, ring: KeyRing) -> None:
    backend = LocalBackend(root, fsync=False)
    await backend.start()
    await backend.create_bucket("jobsbucket")
    settings = TransformSettings(chunk_size=1 << 16)
    for key, seed in (("orders-0/00000000000000000000.log", 1), ("gone-0/00000000000000000000.log", 2)):
        data = encode_object(records(70_000, seed), settings, ring)
        await backend.put("jobsbucket", key, data, metadata={META_FORMAT: "1"})
    await backend.put("jobsbucket", "legacy/plain.txt", records(3000, 3))  # not written by tsproxy
    await backend.close()


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, Path]:
    """A local backend with two tsproxy objects under kek-a (kek-b active) and one plain object."""
    ring = KeyRing.new(key_id="kek-a")
    asyncio.run(_seed(tmp_path / "store", ring))
    ring.add(key_id="kek-b")
    ring.activate("kek-b")
    ring.save(tmp_path / "ring.json")
    return tmp_path / "store", tmp_path / "ring.json"


def _job(store: tuple[Path, Path], out: Path, *argv: str) -> list[str]:
    root, ring = store
    return [
        *argv,
        "--backend",
        f"file://{root}",
        "--key-ring",
        str(ring),
        "--bucket",
        "jobsbucket",
        "--output",
        str(out),
    ]


def test_writing_jobs_are_dry_runs_without_apply(
    spark: Any, tmp_path: Path, store: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = store[0]
    before = _files(root)

    assert jobs_cli.main(_job(store, tmp_path / "r1", "rewrap")) == 0
    out = capsys.readouterr().out
    assert "rewrap (dry run: nothing written; --apply to rewrap)" in out and "would-rewrap" in out
    counts = json.loads((tmp_path / "r1" / "summary.json").read_text())["counts"]
    assert counts == {"would-rewrap": 2, "passthrough": 1}

    assert jobs_cli.main(_job(store, tmp_path / "m1", "migrate")) == 0
    out = capsys.readouterr().out
    assert "dry run: nothing written; --apply to migrate" in out

    live = ["--live-topics", "orders", "--delete-orphans"]
    assert jobs_cli.main(_job(store, tmp_path / "i1", "inventory", *live)) == 0
    out = capsys.readouterr().out
    assert "would delete 1 orphan objects" in out and "--apply to delete" in out

    assert _files(root) == before  # three dry runs, not one byte changed

    # The same with --apply: each job writes.
    assert jobs_cli.main(_job(store, tmp_path / "r2", "rewrap", "--apply")) == 0
    counts = json.loads((tmp_path / "r2" / "summary.json").read_text())["counts"]
    assert counts == {"rewrapped": 2, "passthrough": 1}
    assert jobs_cli.main(_job(store, tmp_path / "m2", "migrate", "--apply")) == 0
    assert "migrated" in capsys.readouterr().out
    assert jobs_cli.main(_job(store, tmp_path / "i2", "inventory", *live, "--apply")) == 0
    assert "deleted 1 orphan objects" in capsys.readouterr().out
    after = _files(root)
    assert not any(k.startswith("jobsbucket/gone-0") for k in after) and after != before


def test_apply_flags_that_make_no_sense_are_refused(
    tmp_path: Path, store: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert jobs_cli.main(_job(store, tmp_path / "x", "rewrap", "--apply", "--dry-run")) == 2
    assert "contradict" in capsys.readouterr().err
    assert jobs_cli.main(_job(store, tmp_path / "x", "inventory", "--apply")) == 2
    assert "--delete-orphans" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
