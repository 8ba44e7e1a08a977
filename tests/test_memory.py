"""The allocator settings `tsproxy serve` makes at start (glibc only)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_thresholds_are_set_where_glibc_is() -> None:
    code = (
        "from tsproxy import memory; print(memory.fix_mmap_threshold(8 << 20), "
        "memory.fix_trim_threshold(64 << 20), memory.limit_arenas(2))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True True True"
