"""benchmarks/fetch.py end to end at 8 MiB, tsproxy and direct SeaweedFS only (no rclone): every row is
there with sane figures, the table and the goal checks are printed. Figures are never compared with
time thresholds; only what must hold whatever the machine's speed is checked."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from bench_helpers import run_benchmark
from fetch_support import READ_SCENARIOS, SCENARIOS, UPLOAD, UPLOAD_SCENARIOS, UPLOAD_SERIAL

FIELDS = {
    "system",
    "scenario",
    "mib_s",
    "vs_direct",
    "p50_ms",
    "p99_ms",
    "first_ms",
    "backend_gets_per_mib",
    "backend_bytes_ratio",
    "backend_requests",
    "round",
    "cpu_client",
    "cpu_system",
    "cpu_backend",
    "cpu_machine",
    "cpu_machine_vs_direct",
}

pytestmark = [pytest.mark.slow, pytest.mark.seaweed]


def _finite(value: object) -> float:
    assert isinstance(value, int | float) and not isinstance(value, bool), value
    assert math.isfinite(value), value
    return float(value)


def test_fetch_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    rows, table = run_benchmark("fetch.py", ["--size", "8", "--systems", "tsproxy,direct"], tmp_path, 480)
    keys = [(r["system"], r["scenario"]) for r in rows]
    assert sorted(keys) == sorted((s, sc) for s in ("tsproxy", "direct") for sc in SCENARIOS)
    for row in rows:
        assert set(row) - {"parts"} == FIELDS, row
        assert _finite(row["vs_direct"]) > 0
        assert _finite(row["backend_requests"]) >= 0
        assert _finite(row["mib_s"]) > 0
        assert _finite(row["first_ms"]) > 0
        assert _finite(row["p50_ms"]) > 0
        assert _finite(row["p99_ms"]) >= row["p50_ms"]
        assert _finite(row["backend_gets_per_mib"]) >= 0
        assert _finite(row["backend_bytes_ratio"]) >= 0
        # Who spent the CPU: the system's own process only where there is one; nobody's share above
        # the machine's (five ticks of slack for each process counted on its own).
        assert (row["cpu_system"] is None) == (row["system"] == "direct"), row
        shares = [row["cpu_client"], row["cpu_system"] or 0.0, row["cpu_backend"]]
        assert all(_finite(v) >= 0 for v in shares)
        slack = 3 * 0.05 / (8 / 1024)  # seconds per GiB of 8 MiB
        assert _finite(row["cpu_machine"]) + slack >= sum(shares), row
        assert _finite(row["cpu_machine_vs_direct"]) >= 0
    by = {(r["system"], r["scenario"]): r for r in rows}
    for scenario in UPLOAD_SCENARIOS:
        # tsproxy transforms what it stores, and SeaweedFS stores what it is sent: both did work.
        assert by[("tsproxy", scenario)]["cpu_system"] > 0
        assert by[("direct", scenario)]["cpu_backend"] > 0
        assert by[("direct", scenario)]["cpu_machine_vs_direct"] == 1.0
    # Direct access: every fetch is a GET at SeaweedFS and every byte crosses once.
    for scenario in READ_SCENARIOS:
        direct = by[("direct", scenario)]
        assert direct["backend_gets_per_mib"] > 0
        assert direct["backend_bytes_ratio"] == pytest.approx(1.0, abs=0.01)
    for scenario in UPLOAD_SCENARIOS:
        assert by[("direct", scenario)]["backend_bytes_ratio"] == pytest.approx(1.0, abs=0.01)
    # One part of 8 MiB: create, the part and complete reach SeaweedFS straight from the client.
    assert by[("direct", UPLOAD_SERIAL)]["backend_requests"] == by[("direct", UPLOAD_SERIAL)]["parts"] + 2
    # tsproxy stores its upload and reads from the backend whenever its cache was emptied.
    assert by[("tsproxy", UPLOAD)]["backend_bytes_ratio"] > 0
    for scenario in (s for s in READ_SCENARIOS if "cold" in s):
        assert by[("tsproxy", scenario)]["backend_gets_per_mib"] > 0
        assert by[("tsproxy", scenario)]["backend_bytes_ratio"] > 0

    assert "| system | scenario | mib_s |" in table
    assert "| system | scenario | cpu_client | cpu_system | cpu_backend | cpu_machine |" in table
    # each row once in the figures' table and once in the CPU table
    assert sum(line.startswith(("| tsproxy ", "| direct ")) for line in table.splitlines()) == 2 * len(rows)
    goals = [line.strip() for line in table.split("Goals:", 1)[1].splitlines() if line.strip()]
    assert len(goals) == 9 + len(READ_SCENARIOS)
    assert all(g.startswith(("PASS", "FAIL")) for g in goals if "rclone" not in g)
    assert all(g.startswith("n/a") for g in goals if "rclone" in g)


def test_fetch_benchmark_runs_its_scenarios_with_boto3(tmp_path: Path) -> None:
    args = ["--size", "8", "--systems", "tsproxy,direct", "--client", "boto3"]
    rows, printed = run_benchmark(
        "fetch.py", [*args, "--scenarios", "upload 1,put,chunks,random"], tmp_path, 480
    )
    assert len(rows) == 8 and all(_finite(r["mib_s"]) > 0 for r in rows)
    assert "boto3 client" in printed


def test_fetch_benchmark_in_rounds_shows_medians_and_ranges(tmp_path: Path) -> None:
    args = ["--size", "4", "--systems", "tsproxy,direct", "--scenarios", "chunks,random", "--rounds", "3"]
    rows, printed = run_benchmark("fetch.py", args, tmp_path, 480)
    assert sorted((r["system"], r["scenario"], r["round"]) for r in rows) == sorted(
        (s, sc, n) for s in ("tsproxy", "direct") for sc in READ_SCENARIOS[2:] for n in (1, 2, 3)
    )
    by = {(r["system"], r["scenario"], r["round"]): r for r in rows}
    ratios = []
    for n in (1, 2, 3):
        mine, direct = by[("tsproxy", "random 1MiB cold", n)], by[("direct", "random 1MiB cold", n)]
        # each round's ratio is against that round's direct figure
        assert mine["vs_direct"] == pytest.approx(mine["mib_s"] / direct["mib_s"])
        ratios.append(mine["vs_direct"])
    assert "median of 3 rounds" in printed
    line = next(x for x in printed.splitlines() if x.startswith("| tsproxy | random 1MiB cold |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert float(cells[3]) == pytest.approx(sorted(ratios)[1], abs=0.001)
    assert cells[4] == f"{min(ratios):.2f}-{max(ratios):.2f}"
    goal = next(x for x in printed.splitlines() if "random 1MiB cold MiB/s, tsproxy / direct" in x)
    assert f"{sorted(ratios)[1]:.3f}" in goal and f"[{min(ratios):.3f}-{max(ratios):.3f}]" in goal
