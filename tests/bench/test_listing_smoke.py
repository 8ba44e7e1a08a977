"""benchmarks/listing.py runs: a writer instance, a fresh reader instance over the same bucket, and
SeaweedFS's own listing, each listing every key (the script checks every size it lists); figures are
never compared with thresholds."""

from __future__ import annotations

import math
from pathlib import Path

from bench_helpers import run_benchmark


def test_listing_benchmark_runs(tmp_path: Path) -> None:
    rows, out = run_benchmark("listing.py", ["--counts", "60"], tmp_path, 300)
    assert [(r["system"], r["scenario"]) for r in rows] == [
        ("direct", "list"),
        ("tsproxy", "cold"),
        ("tsproxy", "warm"),
    ]
    for row in rows:
        assert row["objects"] == 60
        assert math.isfinite(row["seconds"]) and row["seconds"] > 0
        assert row["backend_requests"] >= 1
    assert "| 60 | tsproxy | cold |" in out
