"""benchmarks/frames.py runs and reports one sane row per frame size (figures are never compared with
thresholds)."""

from __future__ import annotations

import math
from pathlib import Path

from bench_helpers import run_benchmark


def test_frames_benchmark_runs(tmp_path: Path) -> None:
    args = ["--size", "8", "--frame-sizes", "1024,256", "--parts", "5", "--repeat", "1"]
    rows, _ = run_benchmark("frames.py", args, tmp_path, 300)
    assert [r["frame_kib"] for r in rows] == [1024, 256]
    for row in rows:
        assert 0 < row["stored"] < 1  # Kafka-like batches compress
        for field in ("seal_s_per_gib", "open_s_per_gib", "part_ms"):
            assert math.isfinite(row[field]) and row[field] > 0
    assert rows[0]["part_ms_vs_first"] == 1.0
