"""What a scrape of tsproxy's registry carries, before any traffic: build info, and no `_created` twins."""

from __future__ import annotations

import platform

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import tsproxy
from tsproxy.metrics import Metrics


def _samples() -> dict[str, list[tuple[dict[str, str], float]]]:
    text = generate_latest(Metrics().registry).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_build_info_names_the_running_version() -> None:
    series = _samples()["tsproxy_build_info"]
    assert series == [({"version": tsproxy.__version__, "python": platform.python_version()}, 1.0)]


def test_no_created_series_double_the_counters() -> None:
    samples = _samples()
    assert "tsproxy_requests_total" in samples
    assert not [name for name in samples if name.endswith("_created")]
