"""Running a benchmark script the way a person does, for the bench tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run_benchmark(
    script: str, args: list[str], workdir: Path, timeout: float
) -> tuple[list[dict[str, Any]], str]:
    """benchmarks/<script> run with `args` and `--json`, in workdir: (its JSON rows, what it printed).
    A non-zero exit fails the test, with the end of its output."""
    out = workdir / f"{Path(script).stem}.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args, "--json", str(out)],
        cwd=workdir, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"
    rows: list[dict[str, Any]] = json.loads(out.read_text())
    return rows, done.stdout
