"""The export submitted with spark-submit to a real Spark standalone cluster (master + worker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.spark.conftest import Tiered
from tests.spark.standalone import StandaloneCluster
from tests.spark.test_export import digests, job, quiet
from tsproxy.spark.export import run_export

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ENTRY = str(Path(__file__).resolve().parents[2] / "tsproxy" / "spark" / "export_main.py")


def test_export_on_a_standalone_cluster_equals_the_local_export_and_reruns_identically(
    tiered: Tiered, tmp_path: Path
) -> None:
    run_export(job(tiered, str(tmp_path / "local")), say=quiet)
    expected = digests(tmp_path / "local")
    o = tiered.options()
    args = [ENTRY, "--endpoint", o["endpoint"], "--bucket", o["bucket"], "--prefix", o["prefix"],
            "--topics", "orders", "--access-key", o["accessKey"], "--secret-key", o["secretKey"],
            "--output", str(tmp_path / "cluster"), "--progress-seconds", "1"]  # fmt: skip
    with StandaloneCluster.start(tmp_path / "spark") as cluster:
        first = cluster.submit(args)
        assert first.returncode == 0, f"{first.stderr[-3000:]}\n{cluster.logs()}"
        assert "6 (0 already exported" in first.stdout
        assert f"on {cluster.master_url}" in first.stdout  # spark-submit's master, not a local one
        assert digests(tmp_path / "cluster") == expected
        again = cluster.submit([*args, "--full"])
        assert again.returncode == 0, f"{again.stderr[-3000:]}\n{cluster.logs()}"
        assert digests(tmp_path / "cluster") == expected
        # The work ran on the cluster's executor, not in the driver.
        assert list((tmp_path / "spark" / "work").glob("app-*/*/stderr"))
