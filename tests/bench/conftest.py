"""The benchmark tests import the benchmarks' own modules (benchmarks/ is a folder of scripts, not a
package): put it on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
