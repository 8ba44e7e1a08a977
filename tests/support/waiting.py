"""Waiting for what a server does just after it answers (a log line, a count, a file), without racing it."""

from __future__ import annotations

import time
from collections.abc import Callable


def eventually(check: Callable[[], bool], timeout: float = 20.0, what: str = "condition not reached") -> None:
    """Return once `check()` is true; fail the test with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)
