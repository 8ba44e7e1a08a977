"""The inventory's HTML report: a few tables and charts (matplotlib, drawn to PNG and inlined)."""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .driver import human_bytes

if TYPE_CHECKING:
    from .inventory import InventoryReport

TOP = 20  # bars per chart, rows per table
STYLE = (
    "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}td:first-child{text-align:left}"
)


def _chart(labels: Sequence[str], series: Mapping[str, Sequence[float]], title: str, unit: str) -> str:
    """A horizontal bar chart as an inline <img>."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.35 * max(len(labels), 3) + 1.2))
    try:
        height = 0.8 / max(len(series), 1)
        for i, (name, values) in enumerate(series.items()):
            ax.barh([y + i * height for y in range(len(labels))], values, height=height, label=name)
        ticks = [y + height * (len(series) - 1) / 2 for y in range(len(labels))]
        ax.set_yticks(ticks, labels=labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(unit)
        ax.set_title(title)
        if len(series) > 1:
            ax.legend()
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90)
    finally:
        plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="{html.escape(title)}" src="data:image/png;base64,{data}">'


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _mib(n: int) -> float:
    return n / (1 << 20)


def _ratio(value: float | None) -> str:
    return f"{value:.2f}" if value else "n/a"


def render(report: InventoryReport, tables: dict[str, list[dict[str, Any]]]) -> str:
    """The report's HTML text."""
    s, t = report.summary, report.summary.total
    orphans = s.orphans.objects if report.live_topics is not None else "not checked"
    totals = [
        t.objects,
        human_bytes(t.original_bytes),
        human_bytes(t.stored_bytes),
        _ratio(t.ratio),
        len(s.partitions),
        orphans,
        len(report.stale_uploads),
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
        series = {"original": [_mib(v[0]) for _, v in top], "stored": [_mib(v[1]) for _, v in top]}
        parts += ["<h2>Topics by stored bytes</h2>", _chart([k for k, _ in top], series, "Topics", "MiB")]

    keks = tables["keks"]
    kek_rows = [[k["kek_id"], k["objects"], human_bytes(k["stored_bytes"])] for k in keks]
    parts += [
        "<h2>Key-encryption keys</h2>",
        _chart(
            [k["kek_id"] for k in keks], {"stored": [_mib(k["stored_bytes"]) for k in keks]}, "KEKs", "MiB"
        ),
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

    if report.uploads:
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
            for u in report.uploads
        ]
        headers = ["kind", "upload", "key", "objects", "bytes", "last write", "stale"]
        parts += ["<h2>Multipart uploads left in the backend</h2>", _table(headers, upload_rows)]
    return "\n".join(parts) + "\n"


def write_html(path: Path, report: InventoryReport, tables: dict[str, list[dict[str, Any]]]) -> None:
    """Write the report atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(render(report, tables), encoding="utf-8")
    os.replace(tmp, path)
