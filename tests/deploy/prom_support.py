"""A real Prometheus server for tests: started on a free loopback port, queried through its HTTP API.

`Prometheus.start(workdir, targets, rule_files)` writes a config that scrapes the targets every second,
starts the `prometheus` binary with its storage in `workdir`, and waits until it is ready. `query`,
`rules` and `wait_for` talk to it; `stop` ends it with SIGTERM and returns its exit code.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from deploy_tools import find_tool

from tests.support.ports import free_port

T = TypeVar("T")

HOW_TO_INSTALL = "Debian package prometheus: apt-get install prometheus; `make test` installs it"


def require_prometheus() -> str:
    """The prometheus binary. Missing, it fails the test in CI (CI=true) and skips it elsewhere."""
    path = find_tool("prometheus")
    if path is None:
        message = f"prometheus is not installed ({HOW_TO_INSTALL})"
        if os.environ.get("CI") == "true":
            pytest.fail(message + ": CI must run the live Prometheus test")
        pytest.skip(message)
    return path


@dataclass(frozen=True)
class Point:
    """One sample of an instant query: its labels and value (NaN where PromQL gives NaN)."""

    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class QueryResult:
    """The data of a successful /api/v1/query answer."""

    expr: str
    result_type: str
    points: tuple[Point, ...]

    def values(self) -> list[float]:
        """Every sample value, NaN included."""
        return [p.value for p in self.points]

    def max(self) -> float:
        """The largest value that is a number, or NaN when there is none."""
        numbers = [v for v in self.values() if not math.isnan(v)]
        return max(numbers) if numbers else math.nan

    def by(self, label: str) -> dict[str, float]:
        """Values keyed by one label (for `sum by (label)` results)."""
        return {p.labels.get(label, ""): p.value for p in self.points}


def _points(data: dict[str, Any]) -> tuple[Point, ...]:
    kind, result = data["resultType"], data["result"]
    if kind == "scalar":
        return (Point({}, float(result[1])),)
    if kind == "vector":
        return tuple(Point(dict(r["metric"]), float(r["value"][1])) for r in result)
    if kind == "matrix":
        return tuple(Point(dict(r["metric"]), float(r["values"][-1][1])) for r in result if r["values"])
    return ()


class PrometheusError(AssertionError):
    """Prometheus refused a request or answered with status "error" (a bad expression, for one)."""


class Prometheus:
    """A running `prometheus` process and a small client for its HTTP API."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.process, self.url, self.log = process, url, log

    @classmethod
    def start(
        cls,
        binary: str,
        workdir: Path,
        targets: Sequence[str],
        *,
        job: str = "tsproxy",
        rule_files: Sequence[Path] = (),
        interval: str = "1s",
        timeout: float = 30,
    ) -> Prometheus:
        """Scrape `targets` (host:port) as `job` every `interval`, evaluating `rule_files` as often."""
        workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {"job_name": job, "metrics_path": "/metrics", "static_configs": [{"targets": list(targets)}]}
            ],
        }
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        port = free_port()
        argv = [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ]
        log = workdir / "prometheus.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(argv, cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
        prometheus = cls(process, f"http://127.0.0.1:{port}", log)
        try:
            prometheus.wait_for(prometheus._ready, timeout, "Prometheus to report ready")
        except BaseException:
            prometheus.stop()
            raise
        return prometheus

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def log_tail(self, lines: int = 40) -> str:
        """The end of Prometheus's own log, for failure messages."""
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_for(self, check: Callable[[], T | None], timeout: float, what: str) -> T:
        """Poll `check` until it returns something truthy; fail, with Prometheus's log, after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                code = self.process.returncode
                raise AssertionError(
                    f"Prometheus exited ({code}) while waiting for {what}:\n{self.log_tail()}"
                )
            found = check()
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}:\n{self.log_tail()}")
            time.sleep(0.2)

    def api(self, path: str, form: dict[str, str] | None = None) -> Any:
        """The `data` of a /api/v1 answer; a POST when `form` is given (long expressions fit in a body)."""
        body = urllib.parse.urlencode(form).encode() if form is not None else None
        request = urllib.request.Request(self.url + "/api/v1/" + path, data=body)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                document = json.load(answer)
        except urllib.error.HTTPError as e:
            # Prometheus answers bad queries with 400/422 and a JSON body that says why.
            document = json.loads(e.read() or b"{}")
        if document.get("status") != "success":
            raise PrometheusError(
                f"{path} {form or ''}: {document.get('errorType')}: {document.get('error')}"
            )
        return document["data"]

    def query(self, expr: str) -> QueryResult:
        """Evaluate `expr` as an instant query at the current time."""
        data = self.api("query", {"query": expr})
        return QueryResult(expr, data["resultType"], _points(data))

    def rules(self) -> list[dict[str, Any]]:
        """Every rule Prometheus loaded, with its health, state and last error."""
        groups = self.api("rules")["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def stop(self, timeout: float = 30) -> int:
        """Stop Prometheus with SIGTERM (it flushes and exits 0); kill it if it hangs. Its exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode
