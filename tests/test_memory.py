"""The allocator setting `tsproxy serve` makes at start (glibc only)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_threshold_is_set_unless_the_operator_set_one() -> None:
    code = "from tsproxy import memory; print(memory.fix_mmap_threshold())"
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    ours = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert ours.stdout.strip() == "True"
    env["MALLOC_MMAP_THRESHOLD_"] = "4194304"
    theirs = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert theirs.stdout.strip() == "False"
