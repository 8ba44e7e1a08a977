"""The CLI on an install without the 'spark' extra (or without matplotlib): real `tsproxy` runs in a
subprocess whose interpreter cannot import the blocked packages, as if they were not installed."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tsproxy
from tsproxy.format import KeyRing, TransformSettings, encode_object
from tsproxy.format.manifest import META_FORMAT
from tsproxy.store.local import LocalBackend

TREE = Path(tsproxy.__file__).resolve().parent.parent
HINT = "pip install 'tsproxy[spark]'"

# Imported by every interpreter that has its directory on PYTHONPATH (Spark's Python workers too).
BLOCKER = """
import importlib.machinery
import os
import sys

BLOCKED = tuple(os.environ["TEST_IMPORT_BLOCK"].split(","))


class NotInstalled(importlib.machinery.PathFinder):
    \"""The path finder, blind to the blocked packages: importing one fails, and find_spec says it is
    not there, as after `pip uninstall`.\"""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            return None
        return super().find_spec(name, path, target)


sys.meta_path[:] = [
    NotInstalled if f is importlib.machinery.PathFinder else f for f in sys.meta_path
]
"""


def tsproxy_cli(
    tmp_path: Path, block: str, *argv: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`tsproxy ARGV` in a fresh interpreter that cannot import the packages in `block`."""
    site = tmp_path / "blocker"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"},
        "PYTHONPATH": os.pathsep.join([str(site), str(TREE)]),
        "TEST_IMPORT_BLOCK": block,
    }
    code = "import sys; from tsproxy.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_blocker_blocks(tmp_path: Path) -> None:
    done = tsproxy_cli(tmp_path, "pyarrow", "serve", "--help")
    assert done.returncode == 0
    site = tmp_path / "blocker"
    env = {**os.environ, "PYTHONPATH": str(site), "TEST_IMPORT_BLOCK": "pyarrow"}
    probe = subprocess.run([sys.executable, "-c", "import pyarrow"], env=env, capture_output=True, text=True)
    assert probe.returncode == 1 and "No module named 'pyarrow'" in probe.stderr


@pytest.mark.parametrize("blocked", ["pyarrow", "pyspark", "pyarrow,pyspark"])
def test_help_works_without_the_spark_extra(tmp_path: Path, blocked: str) -> None:
    for argv in (["jobs", "--help"], ["jobs", "rewrap", "--help"], ["export", "--help"], ["--help"]):
        done = tsproxy_cli(tmp_path, blocked, *argv)
        assert done.returncode == 0, (argv, done.stderr)
        assert "usage: tsproxy" in done.stdout and not done.stderr
    assert "inventory" in tsproxy_cli(tmp_path, blocked, "jobs", "--help").stdout
    assert "--apply" in tsproxy_cli(tmp_path, blocked, "jobs", "migrate", "--help").stdout


@pytest.mark.parametrize("blocked", ["pyarrow", "pyspark"])
def test_a_job_without_the_spark_extra_says_what_to_install(tmp_path: Path, blocked: str) -> None:
    backend = ["--backend", f"file://{tmp_path / 'store'}", "--no-encryption", "--bucket", "b"]
    for job in ("verify", "rewrap", "inventory", "migrate"):
        done = tsproxy_cli(tmp_path, blocked, "jobs", job, *backend)
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            f"tsproxy jobs needs the 'spark' extra (no module named {blocked!r}): {HINT}"
        ]
        assert done.stdout == ""
    done = tsproxy_cli(
        tmp_path, blocked, "export", "--bucket", "b", "--topics", "t", "--output", str(tmp_path / "out")
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"tsproxy export needs the 'spark' extra (no module named {blocked!r}): {HINT}"
    ]
    assert not (tmp_path / "out").exists()


def test_the_library_names_the_extra_too(tmp_path: Path) -> None:
    site = tmp_path / "blocker"
    tsproxy_cli(tmp_path, "pyarrow", "--version")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(TREE)]),
        "TEST_IMPORT_BLOCK": "pyarrow",
    }
    done = subprocess.run(
        [sys.executable, "-c", "from tsproxy.jobs import verify"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 1 and HINT in done.stderr.splitlines()[-1]


async def _seed(root: Path, ring: KeyRing) -> None:
    backend = LocalBackend(root, fsync=False)
    await backend.start()
    await backend.create_bucket("tiered")
    for n in range(3):
        key = f"orders-{n}/{n * 100:020d}.log"  # a copied log directory: topic orders, partition n
        data = encode_object(bytes(range(256)) * (n + 1), TransformSettings(chunk_size=1 << 16), ring)
        await backend.put("tiered", key, data, metadata={META_FORMAT: "1"})
    await backend.close()


@pytest.mark.spark
@pytest.mark.slow
def test_inventory_writes_its_report_without_matplotlib(tmp_path: Path) -> None:
    """The whole inventory, on Spark, in an interpreter where matplotlib cannot be imported."""
    ring = KeyRing.new(key_id="kek-a")
    ring.save(tmp_path / "ring.json")
    asyncio.run(_seed(tmp_path / "store", ring))
    out = tmp_path / "inventory"
    done = tsproxy_cli(
        tmp_path,
        "matplotlib",
        "jobs",
        "inventory",
        "--master",
        "local[1]",
        "--backend",
        f"file://{tmp_path / 'store'}",
        "--key-ring",
        str(tmp_path / "ring.json"),
        "--bucket",
        "tiered",
        "--output",
        str(out),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "inventory: 3 objects" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["objects"] == 3 and summary["statuses"] == {"ok": 3}
    html = (out / "report.html").read_text()
    assert html.count("<svg") == 2 and "kek-a" in html and "orders" in html
