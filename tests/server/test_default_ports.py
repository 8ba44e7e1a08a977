"""No test depends on a default port: the whole run holds them (tests/conftest.py, `default_ports_held`),
as a `make run` left running beside `make test` does. These cases check that the hold is real."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ports import default_ports


@pytest.mark.parametrize("address", default_ports(), ids=lambda a: f"{a[0]}:{a[1]}")
def test_the_default_ports_are_taken_while_the_tests_run(address: tuple[str, int]) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with pytest.raises(OSError):
            s.bind(address)
            s.listen()


def test_serve_with_its_defaults_meets_the_taken_port(tmp_path: Path) -> None:
    """What a test that forgot its ports would meet: the start-up line for a port in use."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TSPROXY_")}
    done = subprocess.run(
        [sys.executable, "-m", "tsproxy.cli", "serve"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "(default): cannot listen on 127.0.0.1:" in line and "already in use" in line
