"""Running `tsproxy` as a user runs it: the installed entry point, from a shell that knows nothing of the
tests.

A user who installed tsproxy into a virtual environment calls `.venv/bin/tsproxy` (or has activated
the environment, or not): the variables a test run may carry (PYSPARK_PYTHON, PYTHONPATH, TSPROXY_*,
AWS_*) are not in their shell, and `python3` on their PATH is the system's, which has neither tsproxy
nor pyspark. `user_env()` is that shell's environment: the test run's own, without those variables and
without this interpreter's directory on PATH, so that a step that silently relies on the test
environment fails here as it fails for the user.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from tests.support.ports import HOST, free_port

BIN = Path(sys.executable).parent
ENTRY_POINT = BIN / "tsproxy"

# Variables the test run may set that a user's shell does not have.
_TEST_ONLY = ("PYSPARK_", "PYTHONPATH", "TSPROXY_", "AWS_", "SPARK_", "PYTEST_", "VIRTUAL_ENV")


def user_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A user's environment: no test-only variables, and this interpreter's bin directory off PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_TEST_ONLY)}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != BIN.resolve()]
    env["PATH"] = os.pathsep.join(path)
    env.update(extra or {})
    return env


def run_tsproxy(
    argv: Sequence[str],
    cwd: Path,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """`tsproxy ARGV` through the installed entry point, in `cwd`, with a user's environment."""
    assert ENTRY_POINT.exists(), f"{ENTRY_POINT} is missing: install tsproxy (make install-test)"
    return subprocess.run(
        [str(ENTRY_POINT), *argv],
        cwd=cwd,
        env=user_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextlib.contextmanager
def serving_as_user(cwd: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    """`tsproxy serve ARGS` on free ports (entry point, a user's environment) from its start line until
    the block ends; yields the process, its S3 port and its metrics port. Its log goes to `cwd/serve.log`."""
    port, metrics_port = free_port(), free_port()
    with open(cwd / "serve.log", "w") as log:
        proc = subprocess.Popen(
            [str(ENTRY_POINT), "serve", "--listen", f"{HOST}:{port}", "--metrics-listen",
             f"{HOST}:{metrics_port}", "--backend-check", "0", *args],
            cwd=cwd, env=user_env(), stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line and json.loads(line)["msg"] == "tsproxy serving S3", (cwd / "serve.log").read_text()
        yield proc, port, metrics_port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
