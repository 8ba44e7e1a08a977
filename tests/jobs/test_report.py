"""The inventory's HTML report: its charts are SVG drawn without a plotting library."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from tsproxy.jobs.report import BAR_WIDTH, Headline, bar_chart, render

SVG = "{http://www.w3.org/2000/svg}"


def _bars(svg: str) -> list[tuple[str, float, str]]:
    """(series, width, tooltip) of every bar, in drawing order."""
    root = ET.fromstring(svg)  # well-formed XML, or this raises
    return [
        (r.attrib["data-series"], float(r.attrib["width"]), r.findtext(f"{SVG}title") or "")
        for r in root.iter(f"{SVG}rect")
        if r.attrib.get("class") == "bar"
    ]


def test_bars_are_scaled_to_the_largest_value() -> None:
    svg = bar_chart(["orders", "clicks"], {"original": [4 << 20, 1 << 20], "stored": [2 << 20, 0]}, "Topics")
    bars = _bars(svg)
    assert [(s, w) for s, w, _ in bars] == [
        ("original", BAR_WIDTH),
        ("stored", BAR_WIDTH / 2),
        ("original", BAR_WIDTH / 4),
        ("stored", 0.0),
    ]
    assert bars[0][2] == "orders: original 4.0 MiB" and bars[3][2] == "clicks: stored 0 B"
    assert svg.count('class="legend"') == 2  # a legend only when there is more than one series


def test_labels_and_titles_are_escaped_and_long_labels_cut() -> None:
    long = "x" * 100
    svg = bar_chart(['<kek & "one">', long], {"stored": [1.0, 2.0]}, "KEKs <all>")
    texts = [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")]
    assert "KEKs <all>" in texts and '<kek & "one">' in texts
    assert not any(t == long for t in texts) and any(
        t and t.startswith("xxx") and t.endswith("\u2026") for t in texts
    )
    assert _bars(svg)[1][2].startswith(long)  # the whole label stays in the tooltip
    assert "legend" not in svg


def test_empty_and_zero_charts_are_well_formed() -> None:
    assert _bars(bar_chart([], {"stored": []}, "none")) == []
    assert [w for _, w, _ in _bars(bar_chart(["a"], {"stored": [0]}, "zero"))] == [0.0]


def _group(**values: Any) -> dict[str, Any]:
    return {"original_bytes": 0, "stored_bytes": 0, "objects": 1, "compression_ratio": None, **values}


def test_report_has_a_chart_per_figure_and_the_totals() -> None:
    tables = {
        "partitions": [
            _group(topic="orders", partition=p, segments=1, original_bytes=300, stored_bytes=100 * (p + 1),
                   oldest_offset=0, newest_offset=9, oldest_segment=None, newest_segment=None,
                   kek_ids=["kek-a"], orphan=False)
            for p in range(2)
        ] + [
            _group(topic="gone", partition=0, segments=1, original_bytes=50, stored_bytes=50, oldest_offset=0,
                   newest_offset=0, oldest_segment=None, newest_segment=None, kek_ids=[], orphan=True)
        ],
        "prefixes": [_group(prefix="orders/", stored_bytes=300)],
        "keks": [_group(kek_id="kek-a", stored_bytes=300), _group(kek_id="(none)", stored_bytes=50)],
    }  # fmt: skip
    upload = {"kind": "tsproxy", "upload_id": "u1", "key": "k", "objects": 2, "bytes": 10}
    html = render(
        Headline(3, 650, 350, 650 / 350, 3, None, 1),
        tables,
        [{**upload, "last_write": "2024-01-01", "stale": True}],
    )
    charts = re.findall(r"<svg.*?</svg>", html)
    assert len(charts) == 2 and "<img" not in html
    topics = _bars(charts[0])
    # Topics by stored bytes, summed over partitions: orders (300 stored, 600 original) before gone.
    assert [t.split(":")[0] for _, _, t in topics] == ["orders", "orders", "gone", "gone"]
    assert topics[0][1] == BAR_WIDTH and topics[1][1] == BAR_WIDTH / 2
    assert [t.split(":")[0] for _, _, t in _bars(charts[1])] == ["kek-a", "(none)"]
    assert "<td>not checked</td>" in html and "<td>1.86</td>" in html
    assert "Multipart uploads left in the backend" in html and "<td>u1</td>" in html
