"""benchmarks/network.py and benchmarks/soak.py end to end, small: every scenario's row is there for both
systems with every body checked, and the soak reads back no wrong byte and keeps tsproxy's RSS, sockets and
asyncio tasks flat. Figures are never compared with time thresholds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench_helpers import BENCHMARKS


def _run(script: str, args: list[str], workdir: Path, timeout: float) -> tuple[dict, str, int]:
    out = workdir / "out.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args, "--json", str(out)],
        cwd=workdir, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert out.exists(), f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"
    return json.loads(out.read_text()), done.stdout, done.returncode


@pytest.mark.slow
def test_network_benchmark_runs_every_scenario_through_a_shaped_link(tmp_path: Path) -> None:
    result, printed, code = _run(
        "network.py",
        ["--latency", "5", "--bandwidth", "50", "--bandwidth-latency", "0", "--rounds", "1", "--size", "6",
         "--random-reads", "3"],
        tmp_path, timeout=900,
    )  # fmt: skip
    assert code == 0, printed
    from network import SCENARIOS

    networks = {r["network"] for r in result["rows"]}
    assert networks == {"5 ±0.5 ms, unlimited", "0 ms, 50 MB/s"}
    for network in networks:
        for system in ("tsproxy", "direct"):
            got = {r["scenario"] for r in result["rows"] if r["network"] == network and r["system"] == system}
            assert got == set(SCENARIOS), (network, system)
    assert all(r["client_bytes"] > 0 and r["speed"] > 0 for r in result["rows"])
    assert len(result["summary"]) == 2 * len(SCENARIOS)
    assert "| network | scenario | tsproxy | direct | vs_direct |" in printed


# tsproxy's RSS grows for about a minute as its memory cache, pools and heaps fill (a 15-minute soak: flat
# from then on); the check starts after it.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_two_minute_soak_reads_no_wrong_byte_and_stays_flat(tmp_path: Path) -> None:
    result, printed, code = _run(
        "soak.py", ["--minutes", "2", "--sample", "3", "--fault-every", "8", "--warmup", "1"], tmp_path, 500
    )
    assert result["wrong"] == 0
    assert result["tsproxy_log"].get("traceback", 0) == 0, result["tsproxy_log"]
    assert result["verified_bytes"] > 0 and sum(result["faults"].values()) > 0
    for name, verdict in result["flat"].items():
        assert verdict["flat"], (name, verdict, printed[-3000:])
    assert code == 0
