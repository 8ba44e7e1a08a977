"""benchmarks/http_floor.py runs and reports a sane row (figures are never compared with thresholds)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_http_floor_runs(tmp_path: Path) -> None:
    out = tmp_path / "floor.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "http_floor.py"), "--requests", "30", "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(out.read_text())
    assert row["system"] == "bare aiohttp"
    for field in ("mib_s", "p50_ms", "p99_ms"):
        assert math.isfinite(row[field]) and row[field] > 0
    assert row["p50_ms"] <= row["p99_ms"]
    assert "bare aiohttp" in done.stdout


def test_serve_mode_answers_ranges_of_the_file(tmp_path: Path) -> None:
    # What benchmarks/cpu.py measures its serving floor against: the file's own bytes, any range.
    from cpu import serving_floor

    data = bytes(range(256)) * 4096
    with serving_floor(data, tmp_path) as (pid, client):
        assert pid > 0
        for start, end in ((0, 1), (1000, 70_000), (len(data) - 5, len(data))):
            assert client.get_range("floor", "segment", start, end) == data[start:end]
