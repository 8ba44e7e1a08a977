"""Helpers for the tests of what operators deploy: paths, external tools, and tsproxy's own series."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tsproxy.metrics import Metrics

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

# A metric name followed by its label matchers, as written in PromQL: name{...}.
_SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^{}]*)\}")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def find_tool(name: str) -> str | None:
    """The path of an external tool: on PATH, or next to this interpreter (the project's virtualenv)."""
    found = shutil.which(name)
    if found:
        return found
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else None


def require_tool(name: str, how: str) -> str:
    """The tool's path; the test is skipped, saying how to install it, only when it is really absent."""
    path = find_tool(name)
    if path is None:
        pytest.skip(f"{name} is not installed ({how}; `make test` installs it)")
    return path


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def samples(metrics: Metrics) -> Iterator[Sample]:
    """Every sample the registry exports, as /metrics would show it (without the *_created timestamps)."""
    for family in metrics.registry.collect():
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            yield Sample(s.name, dict(s.labels), float(s.value))


def fresh_metrics() -> Metrics:
    """The metrics of a tsproxy just started with encryption on and a key ring loaded, as deployed."""
    m = Metrics()
    m.key_ring_loaded(["kek-1"], "kek-1")  # what Proxy.start does with the ring it loaded
    return m


def exported_names() -> set[str]:
    """Names of the samples a fresh tsproxy exports (counters with _total, histograms with _bucket...)."""
    return {s.name for s in samples(fresh_metrics())}


def selectors(expr: str) -> list[tuple[str, dict[str, tuple[str, str]]]]:
    """(metric, {label: (operator, value)}) for every `metric{...}` selector in a PromQL expression."""
    found = []
    for m in _SELECTOR.finditer(expr):
        name, body = m.group(1), m.group(2)
        matchers = {label: (op, value) for label, op, value in _MATCHER.findall(body)}
        found.append((name, matchers))
    return found


def tsproxy_names(expr: str) -> set[str]:
    """Every tsproxy_* identifier in an expression, with or without a selector."""
    return set(re.findall(r"\btsproxy_[a-zA-Z0-9_]+", expr))


@contextmanager
def serving(
    argv: list[str], cwd: Path, metrics_port: int, env: dict[str, str] | None = None
) -> Iterator[Path]:
    """Run a `tsproxy serve` command line until /healthz answers, yield its log file, stop it (SIGTERM)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TSPROXY_")}
    environment.update(env or {})
    log = cwd / "tsproxy.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, cwd=cwd, env=environment, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/healthz", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    output = log.read_text(errors="replace")
                    raise AssertionError(f"tsproxy did not come up:\n{output}") from None
                time.sleep(0.1)
        yield log
    finally:
        process.terminate()
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
