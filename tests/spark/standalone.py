"""A Spark standalone cluster (one master, one worker) started from the pip pyspark package, for tests.

    with StandaloneCluster.start(tmp_path) as cluster:
        cluster.submit(["tsproxy/spark/export_main.py", "--bucket", ...])

Everything binds to 127.0.0.1 on free ports (SPARK_LOCAL_IP), logs go to files in the given directory
(shown by `logs()` when something fails), and `stop()` ends the two daemons it started, by process id.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark

from tests.support.ports import HOST, free_port

SPARK_HOME = Path(pyspark.__file__).parent
START_TIMEOUT = 120.0


def _env() -> dict[str, str]:
    # No PYSPARK_PYTHON: the jobs and the export give the executors tsproxy's Python themselves. The
    # driver's Python under spark-submit is the user's choice (spark-submit's default is `python3`).
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP=HOST,
        SPARK_LOCAL_HOSTNAME="localhost",
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_DAEMON_MEMORY="512m",
    )
    return env


@dataclass
class StandaloneCluster:
    root: Path
    master_url: str
    ui_url: str
    processes: list[subprocess.Popen[bytes]]

    @classmethod
    def start(cls, root: Path, cores: int = 2, memory: str = "2g") -> StandaloneCluster:
        root.mkdir(parents=True, exist_ok=True)
        port, ui, worker_port, worker_ui = free_port(), free_port(), free_port(), free_port()
        spark_class = str(SPARK_HOME / "bin" / "spark-class")
        master_cmd = [spark_class, "org.apache.spark.deploy.master.Master", "--host", HOST,
                      "--port", str(port), "--webui-port", str(ui)]  # fmt: skip
        master_url = f"spark://{HOST}:{port}"
        worker_cmd = [spark_class, "org.apache.spark.deploy.worker.Worker", master_url, "--host", HOST,
                      "--port", str(worker_port), "--webui-port", str(worker_ui), "--cores", str(cores),
                      "--memory", memory, "--work-dir", str(root / "work")]  # fmt: skip
        cluster = cls(root, master_url, f"http://{HOST}:{ui}", [])
        try:
            cluster.processes.append(cls._spawn(master_cmd, root / "master.log"))
            cluster._wait(lambda state: True)
            cluster.processes.append(cls._spawn(worker_cmd, root / "worker.log"))
            cluster._wait(
                lambda state: len([w for w in state.get("workers", []) if w.get("state") == "ALIVE"]) == 1
            )
        except BaseException:
            cluster.stop()
            raise
        return cluster

    @staticmethod
    def _spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            return subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=_env(), start_new_session=True
            )

    def _wait(self, ready: Any) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for p in self.processes:
                if p.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited early:\n{self.logs()}")
            try:
                with urllib.request.urlopen(self.ui_url + "/json/", timeout=2) as r:
                    if ready(json.loads(r.read())):
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the Spark cluster did not come up:\n{self.logs()}")

    def submit(self, args: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """spark-submit against this cluster, in client mode; output captured."""
        cmd = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", self.master_url,
               "--conf", f"spark.driver.host={HOST}", "--conf", "spark.ui.enabled=false",
               "--conf", "spark.executor.memory=1g", *args]  # fmt: skip
        return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout, check=False)

    def logs(self) -> str:
        parts = []
        for name in ("master.log", "worker.log"):
            path = self.root / name
            if path.exists():
                parts.append(f"--- {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-40:]))
        return "\n".join(parts)

    def stop(self) -> None:
        for p in reversed(self.processes):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.processes):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)

    def __enter__(self) -> StandaloneCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
