"""The inventory's HTML report: a few tables and bar charts, one self-contained file.

The charts are inline SVG drawn here (a few rectangles and labels), so the report needs no plotting
library: whatever can run the jobs can write it. Input is plain figures (`Headline`, the group tables,
the upload rows); this module imports nothing of the inventory job, which calls it.
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .driver import human_bytes

TOP = 20  # bars per chart, rows per table
STYLE = (
    "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}td:first-child{text-align:left}"
    "svg{font-family:sans-serif;font-size:12px;display:block;margin:1em 0}"
)
# Chart geometry (pixels): label column, bar area, room for the value after the longest bar.
LABEL_WIDTH, BAR_WIDTH, VALUE_WIDTH = 220, 420, 90
BAR_HEIGHT, GROUP_GAP, TOP_MARGIN = 14, 8, 28
COLOURS = ("#3b75af", "#ef8636", "#519e3e", "#c53a32")
LABEL_CHARS = 34  # longer labels are cut, the whole one stays in the bar's tooltip


@dataclass(frozen=True)
class Headline:
    """The report's first table: the bucket's totals."""

    objects: int
    original_bytes: int
    stored_bytes: int
    ratio: float | None
    partitions: int
    orphans: int | None  # None: not checked (no live topics given)
    stale_uploads: int


def _short(label: str) -> str:
    return label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "\u2026"


def bar_chart(
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
    title: str,
    value_text: Callable[[float], str] = human_bytes,
) -> str:
    """A horizontal bar chart as an inline <svg>: one group of bars per label, one bar per series.

    Bars are scaled to the largest value; each names its value after its end and in its tooltip.
    """
    names = list(series)
    biggest = max((v for values in series.values() for v in values), default=0) or 1
    group = BAR_HEIGHT * max(len(names), 1) + GROUP_GAP
    legend = 18 if len(names) > 1 else 0
    height = TOP_MARGIN + legend + group * len(labels) + 4
    width = LABEL_WIDTH + BAR_WIDTH + VALUE_WIDTH
    e = html.escape
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{e(title)}">',
        f'<text x="0" y="16" font-weight="bold" font-size="14">{e(title)}</text>',
    ]
    for i, name in enumerate(names if legend else ()):
        x = LABEL_WIDTH + i * 110
        out.append(
            f'<rect class="legend" x="{x}" y="{TOP_MARGIN - 2}" width="10" height="10" '
            f'fill="{COLOURS[i % len(COLOURS)]}"/>'
        )
        out.append(f'<text x="{x + 14}" y="{TOP_MARGIN + 7}">{e(name)}</text>')
    y0 = TOP_MARGIN + legend
    for row, label in enumerate(labels):
        top = y0 + row * group
        middle = top + (group - GROUP_GAP) / 2 + 4
        out.append(
            f'<text x="{LABEL_WIDTH - 6}" y="{middle:.0f}" text-anchor="end">{e(_short(label))}</text>'
        )
        for i, name in enumerate(names):
            value = series[name][row]
            length = BAR_WIDTH * value / biggest
            y = top + i * BAR_HEIGHT
            text = value_text(value)
            out.append(
                f'<rect class="bar" data-series="{e(name)}" x="{LABEL_WIDTH}" y="{y}" width="{length:.1f}" '
                f'height="{BAR_HEIGHT - 2}" fill="{COLOURS[i % len(COLOURS)]}">'
                f"<title>{e(label)}: {e(name)} {e(text)}</title></rect>"
            )
            out.append(f'<text x="{LABEL_WIDTH + length + 4:.1f}" y="{y + BAR_HEIGHT - 4}">{e(text)}</text>')
    out.append("</svg>")
    return "".join(out)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _ratio(value: float | None) -> str:
    return f"{value:.2f}" if value else "n/a"


def render(
    headline: Headline,
    tables: Mapping[str, Sequence[Mapping[str, Any]]],
    uploads: Sequence[Mapping[str, Any]],
) -> str:
    """The report's HTML text, from the totals, the group tables (partitions, prefixes, keks: rows
    of the inventory's GROUP_SCHEMA) and the multipart upload rows."""
    h = headline
    totals = [
        h.objects,
        human_bytes(h.original_bytes),
        human_bytes(h.stored_bytes),
        _ratio(h.ratio),
        h.partitions,
        "not checked" if h.orphans is None else h.orphans,
        h.stale_uploads,
    ]
    parts = [
        f"<!doctype html><meta charset=utf-8><title>tsproxy inventory</title><style>{STYLE}</style>",
        "<h1>tsproxy inventory</h1>",
        _table(
            ["objects", "original", "stored", "ratio", "topic partitions", "orphans", "stale uploads"],
            [totals],
        ),
    ]

    topics: dict[str, list[int]] = {}
    for row in tables["partitions"]:
        acc = topics.setdefault(row["topic"], [0, 0])
        acc[0] += row["original_bytes"]
        acc[1] += row["stored_bytes"]
    top = sorted(topics.items(), key=lambda kv: -kv[1][1])[:TOP]
    if top:
        series = {"original": [v[0] for _, v in top], "stored": [v[1] for _, v in top]}
        parts += ["<h2>Topics by stored bytes</h2>", bar_chart([k for k, _ in top], series, "Topics")]

    keks = tables["keks"]
    kek_rows = [[k["kek_id"], k["objects"], human_bytes(k["stored_bytes"])] for k in keks]
    parts += [
        "<h2>Key-encryption keys</h2>",
        bar_chart([k["kek_id"] for k in keks], {"stored": [k["stored_bytes"] for k in keks]}, "KEKs"),
        _table(["KEK", "objects", "stored"], kek_rows),
    ]

    prefix_rows = [
        [
            p["prefix"] or "(top level)",
            p["objects"],
            human_bytes(p["original_bytes"]),
            human_bytes(p["stored_bytes"]),
            _ratio(p["compression_ratio"]),
        ]
        for p in sorted(tables["prefixes"], key=lambda r: -r["stored_bytes"])[:TOP]
    ]
    parts += ["<h2>Prefixes</h2>", _table(["prefix", "objects", "original", "stored", "ratio"], prefix_rows)]

    partition_rows = [
        [
            r["topic"],
            r["partition"],
            r["segments"],
            human_bytes(r["original_bytes"]),
            human_bytes(r["stored_bytes"]),
            r["oldest_offset"],
            r["newest_offset"],
            r["oldest_segment"],
            r["newest_segment"],
            " ".join(r["kek_ids"]),
            "yes" if r["orphan"] else "",
        ]
        for r in sorted(tables["partitions"], key=lambda r: -r["stored_bytes"])[: TOP * 5]
    ]
    headers = ["topic", "partition", "segments", "original", "stored", "oldest offset", "newest offset"]
    headers += ["oldest segment", "newest segment", "KEKs", "orphan"]
    parts += ["<h2>Topic partitions</h2>", _table(headers, partition_rows)]

    if uploads:
        upload_rows = [
            [
                u["kind"],
                u["upload_id"],
                u["key"],
                u["objects"] or "",
                u["bytes"] or "",
                u["last_write"],
                u["stale"],
            ]
            for u in uploads
        ]
        headers = ["kind", "upload", "key", "objects", "bytes", "last write", "stale"]
        parts += ["<h2>Multipart uploads left in the backend</h2>", _table(headers, upload_rows)]
    return "\n".join(parts) + "\n"


def write_html(
    path: Path,
    headline: Headline,
    tables: Mapping[str, Sequence[Mapping[str, Any]]],
    uploads: Sequence[Mapping[str, Any]],
) -> None:
    """Write the report atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(render(headline, tables, uploads), encoding="utf-8")
    os.replace(tmp, path)
