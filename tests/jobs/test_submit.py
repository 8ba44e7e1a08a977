"""The jobs run under spark-submit too: the CLI module is the application script."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tsproxy.jobs.cli
from tests.jobs.jobhelpers import records
from tsproxy.format import KeyRing, TransformSettings, encode_object
from tsproxy.format.manifest import META_FORMAT
from tsproxy.store.local import LocalBackend

pytestmark = [pytest.mark.spark, pytest.mark.slow]


async def _seed(root: Path, ring: KeyRing) -> None:
    backend = LocalBackend(root, fsync=False)
    await backend.start()
    await backend.create_bucket("submitted")
    good = encode_object(records(200_000, 1), TransformSettings(chunk_size=1 << 16), ring)
    bad = bytearray(good)
    bad[100] ^= 1
    await backend.put("submitted", "good", good, metadata={META_FORMAT: "1"})
    await backend.put("submitted", "bad", bytes(bad), metadata={META_FORMAT: "1"})
    await backend.close()


def test_verify_under_spark_submit(tmp_path: Path) -> None:
    ring = KeyRing.new()
    ring.save(tmp_path / "ring.json")
    asyncio.run(_seed(tmp_path / "store", ring))
    submit = Path(sys.executable).parent / "spark-submit"
    out = tmp_path / "out"
    argv = [str(submit), "--master", "local[1]", tsproxy.jobs.cli.__file__, "verify", "--bucket", "submitted"]
    argv += ["--backend", f"file://{tmp_path / 'store'}", "--key-ring", str(tmp_path / "ring.json")]
    argv += ["--output", str(out)]
    # spark-submit starts the driver with `python3` unless told otherwise: that choice is the user's
    # (PYSPARK_DRIVER_PYTHON or spark.pyspark.driver.python); the workers' Python is then tsproxy's.
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "CORRUPT: bad" in done.stdout
    # spark-submit merges the Python driver's stderr into its stdout
    assert "on local[1]" in done.stdout  # the master spark-submit gave, not the default local[*]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"] == {"ok": 1, "corrupt": 1} and summary["ok"] is False


def test_verify_on_a_standalone_cluster(tmp_path: Path) -> None:
    """The same job submitted to a real standalone master: it runs on the worker's executor."""
    from tests.spark.standalone import StandaloneCluster

    ring = KeyRing.new()
    ring.save(tmp_path / "ring.json")
    asyncio.run(_seed(tmp_path / "store", ring))
    out = tmp_path / "out"
    args = [tsproxy.jobs.cli.__file__, "verify", "--bucket", "submitted"]
    args += ["--backend", f"file://{tmp_path / 'store'}", "--key-ring", str(tmp_path / "ring.json")]
    args += ["--output", str(out)]
    with StandaloneCluster.start(tmp_path / "spark") as cluster:
        done = cluster.submit(args)
    assert done.returncode == 1, f"{done.stderr[-3000:]}\n{cluster.logs()}"
    assert f"on {cluster.master_url}" in done.stdout
    assert "CORRUPT: bad" in done.stdout
    assert json.loads((out / "summary.json").read_text())["counts"] == {"ok": 1, "corrupt": 1}
    assert list((tmp_path / "spark" / "work").glob("app-*/*/stderr")), "no executor ran on the worker"


def test_key_rotation_and_inventory_on_a_standalone_cluster(tmp_path: Path) -> None:
    """rewrap, verify and inventory submitted to a real standalone master: rotate, drop the old key,
    everything still reads (and the damaged object is still found), and inventory sees only the new key."""
    import pyarrow.parquet as pq

    from tests.spark.standalone import StandaloneCluster

    ring_path = tmp_path / "ring.json"
    ring = KeyRing.new(key_id="kek-a")
    ring.save(ring_path)
    asyncio.run(_seed(tmp_path / "store", ring))
    ring.add(key_id="kek-b")
    ring.activate("kek-b")
    ring.save(ring_path)
    common = [
        "--bucket",
        "submitted",
        "--backend",
        f"file://{tmp_path / 'store'}",
        "--key-ring",
        str(ring_path),
    ]

    def run(cluster: StandaloneCluster, job: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        return cluster.submit([tsproxy.jobs.cli.__file__, job, *common, "--output", str(out), *extra])

    with StandaloneCluster.start(tmp_path / "spark") as cluster:
        rewrap = run(cluster, "rewrap", tmp_path / "rewrap", "--apply")
        assert rewrap.returncode == 0, f"{rewrap.stdout[-3000:]}\n{rewrap.stderr[-3000:]}\n{cluster.logs()}"
        assert f"on {cluster.master_url}" in rewrap.stdout
        rewrapped = json.loads((tmp_path / "rewrap" / "summary.json").read_text())
        assert rewrapped["counts"] == {"rewrapped": 2}, rewrapped
        ring.remove("kek-a")
        ring.save(ring_path)
        verify = run(cluster, "verify", tmp_path / "verify")
        assert verify.returncode == 1, f"{verify.stdout[-3000:]}\n{cluster.logs()}"
        assert json.loads((tmp_path / "verify" / "summary.json").read_text())["counts"] == {
            "ok": 1,
            "corrupt": 1,
        }
        inventory = run(cluster, "inventory", tmp_path / "inventory")
        assert inventory.returncode == 0, f"{inventory.stdout[-3000:]}\n{cluster.logs()}"
    keks = {
        r["kek_id"]: r["objects"] for r in pq.read_table(tmp_path / "inventory" / "keks.parquet").to_pylist()
    }
    assert keks == {"kek-b": 2}
    assert (tmp_path / "inventory" / "report.html").stat().st_size > 0
