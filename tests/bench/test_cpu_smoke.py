"""benchmarks/cpu.py end to end at 8 MiB: every scenario's row is there with its CPU figures, for a
segment tsproxy compresses and for one whose batches the producer compressed (stored as they are, so the
bare limit has no zstd in it). Figures are never compared with time thresholds."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from bench_helpers import run_benchmark

pytestmark = [pytest.mark.slow, pytest.mark.seaweed]

SCENARIOS = ["upload 25MiB parts, 1 in flight", "seq 1MiB cold", "chunks 4MiB cold"]


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_cpu_benchmark_runs_end_to_end(tmp_path: Path, codec: str) -> None:
    args = ["--size", "8", "--client-checks", "none", "--producer-codec", codec]
    rows, printed = run_benchmark("cpu.py", args, tmp_path, 480)
    assert [r["scenario"] for r in rows] == SCENARIOS
    for row in rows:
        for field in ("tsproxy_s_per_gib", "bare_s_per_gib", "ratio", "wall_s"):
            assert math.isfinite(row[field]) and row[field] > 0, (field, row)
        assert row["ratio"] == pytest.approx(row["tsproxy_s_per_gib"] / row["bare_s_per_gib"])
    upload = rows[0]
    # tsproxy compresses Kafka batches of its own; a producer's compressed batches it stores as they are.
    assert ("zstd compress" in upload["bare_parts"]) == (codec == "none")
    assert f"({codec} batches; stored" in printed
    stored = "uncompressed" if codec == "zstd" else "zstd level"
    assert stored in printed
