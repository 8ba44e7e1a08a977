"""benchmarks/http_floor.py runs and reports a sane row (figures are never compared with thresholds)."""

from __future__ import annotations

import math
from pathlib import Path

from bench_helpers import run_benchmark


def test_http_floor_runs(tmp_path: Path) -> None:
    (row,), printed = run_benchmark("http_floor.py", ["--requests", "30"], tmp_path, 120)
    assert row["system"] == "bare aiohttp"
    for field in ("mib_s", "p50_ms", "p99_ms"):
        assert math.isfinite(row[field]) and row[field] > 0
    assert row["p50_ms"] <= row["p99_ms"]
    assert "bare aiohttp" in printed


def test_serve_mode_answers_ranges_of_the_file(tmp_path: Path) -> None:
    # What benchmarks/cpu.py measures its serving floor against: the file's own bytes, any range.
    from cpu import serving_floor

    data = bytes(range(256)) * 4096
    with serving_floor(data, tmp_path) as (pid, client):
        assert pid > 0
        for start, end in ((0, 1), (1000, 70_000), (len(data) - 5, len(data))):
            assert client.get_range("floor", "segment", start, end) == data[start:end]
