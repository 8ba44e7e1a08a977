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
