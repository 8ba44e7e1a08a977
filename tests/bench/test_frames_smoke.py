"""benchmarks/frames.py runs and reports one sane row per frame size (figures are never compared with
thresholds)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_frames_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "frames.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "frames.py"), "--size", "8", "--frame-sizes", "1024,256",
         "--parts", "5", "--repeat", "1", "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["frame_kib"] for r in rows] == [1024, 256]
    for row in rows:
        assert 0 < row["stored"] < 1  # Kafka-like batches compress
        for field in ("seal_s_per_gib", "open_s_per_gib", "part_ms"):
            assert math.isfinite(row[field]) and row[field] > 0
    assert rows[0]["part_ms_vs_first"] == 1.0
