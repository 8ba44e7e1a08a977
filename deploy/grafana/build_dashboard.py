"""Build deploy/grafana/tsproxy.json, the tsproxy Grafana dashboard, from the panel list below.

The JSON is committed (operators import it as it is); this script is its source, so that every query
gets the same `$job`/`$instance` selector and the same datasource variable. After editing, run

    python deploy/grafana/build_dashboard.py

and commit both files; tests/deploy/test_dashboard.py fails while they disagree.

Every expression must return data once tsproxy has served a short workload. The series it reads are primed
at zero (tsproxy/metrics.py), so sums and rates exist from the first scrape; ratios divide by
clamp_min(..., 1e-9) so that a zero denominator gives 0, not an empty result.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("tsproxy.json")
UID = "tsproxy-overview"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# The selector every query carries; the template variables below fill it in.
SEL = 'job=~"$job", instance=~"$instance"'
RATE = "[$__rate_interval]"
# A denominator that is never zero, so ratios of idle counters read 0 instead of vanishing.
EPS = "1e-9"
INSTANCES = 'label_values(tsproxy_requests_total{job=~"$job"}, instance)'


def rate(metric: str, extra: str = "", by: str = "") -> str:
    """sum [by (...)] (rate(metric{SEL[, extra]}[$__rate_interval]))."""
    labels = SEL + (", " + extra if extra else "")
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{{{labels}}}{RATE}))"


def ratio(numerator: str, denominator: str) -> str:
    return f"{numerator}\n/\nclamp_min({denominator}, {EPS})"


def share(metric: str, subset: str) -> str:
    """The part of metric's rate that matches subset, as a fraction of all of it."""
    return ratio(rate(metric, subset), rate(metric))


def total(metric: str) -> str:
    """sum(metric{SEL}): a gauge, or a counter's value since the processes started."""
    return f"sum({metric}{{{SEL}}})"


def quantile(q: float, metric: str, by: str = "", extra: str = "") -> str:
    grouping = "le" + (", " + by if by else "")
    return f"histogram_quantile({q}, {rate(metric + '_bucket', extra, grouping)})"


@dataclass
class Target:
    expr: str
    legend: str


@dataclass
class Panel:
    title: str
    description: str
    targets: list[Target]
    unit: str = "short"
    kind: str = "timeseries"  # or "stat"
    width: int = 8
    height: int = 8
    stack: bool = False
    extra_defaults: dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    title: str
    panels: list[Panel]


ROWS: list[Row] = [
    Row(
        "Overview",
        [
            Panel(
                "Instances up",
                "Scrape targets of the selected jobs that answered their last scrape.",
                [Target(f"sum(up{{{SEL}}})", "up")],
                kind="stat",
                width=4,
                height=4,
            ),
            Panel(
                "Client requests/s",
                "All S3 requests from clients, every operation and status.",
                [Target(rate("tsproxy_requests_total"), "requests/s")],
                unit="reqps",
                kind="stat",
                width=4,
                height=4,
            ),
            Panel(
                "Client error ratio (5xx)",
                "Share of client requests answered with a 5xx status.",
                [
                    Target(
                        share("tsproxy_requests_total", 'status=~"5.."'),
                        "5xx ratio",
                    )
                ],
                unit="percentunit",
                kind="stat",
                width=4,
                height=4,
            ),
            Panel(
                "Integrity errors (dashboard range)",
                "Stored data that failed authentication or a checksum within the dashboard's time range "
                "(increase, so a restart does not reset it). Anything above zero needs a look: see "
                "docs/OPERATIONS.md.",
                [
                    Target(
                        f"sum(increase(tsproxy_integrity_errors_total{{{SEL}}}[$__range]))",
                        "integrity errors",
                    )
                ],
                kind="stat",
                width=4,
                height=4,
                extra_defaults={
                    "thresholds": {
                        "mode": "absolute",
                        "steps": [{"color": "green", "value": None}, {"color": "red", "value": 1}],
                    }
                },
            ),
            Panel(
                "Stored / original bytes (lifetime)",
                "Bytes written to the backend per original byte stored, since the processes started "
                "(compression and encryption overhead together).",
                [
                    Target(
                        ratio(
                            total("tsproxy_transform_stored_bytes_total"),
                            total("tsproxy_transform_original_bytes_total"),
                        ),
                        "stored/original",
                    )
                ],
                unit="percentunit",
                kind="stat",
                width=4,
                height=4,
            ),
            Panel(
                "Janitor",
                "Leftovers of crashed or abandoned uploads removed in the last hour, by kind, and janitor "
                "runs that hit an error (see docs/OPERATIONS.md, Leftovers and the janitor).",
                [
                    Target(
                        f"sum by (kind) (increase(tsproxy_janitor_removed_total{{{SEL}}}[1h]))",
                        "removed ({{kind}})",
                    ),
                    Target(
                        f'sum(increase(tsproxy_janitor_runs_total{{{SEL}, outcome="error"}}[1h]))',
                        "failed runs",
                    ),
                ],
                unit="short",
            ),
            Panel(
                "Cache fill",
                "Chunk cache bytes on disk as a share of the configured size.",
                [
                    Target(
                        ratio(total("tsproxy_cache_size_bytes"), total("tsproxy_cache_limit_bytes")),
                        "fill",
                    )
                ],
                unit="percentunit",
                kind="stat",
                width=4,
                height=4,
            ),
        ],
    ),
    Row(
        "Client requests",
        [
            Panel(
                "Requests by operation",
                "Client S3 requests per second, by operation.",
                [Target(rate("tsproxy_requests_total", by="operation"), "{{operation}}")],
                unit="reqps",
                stack=True,
            ),
            Panel(
                "Errors by status",
                "Client requests answered with a 4xx or 5xx status, per second, by status.",
                [Target(rate("tsproxy_requests_total", 'status=~"[45].."', by="status"), "{{status}}")],
                unit="reqps",
                stack=True,
            ),
            Panel(
                "Error ratio",
                "Share of client requests with a 5xx (server-side) and a 4xx (client-side) status.",
                [
                    Target(
                        share("tsproxy_requests_total", 'status=~"5.."'),
                        "5xx",
                    ),
                    Target(
                        share("tsproxy_requests_total", 'status=~"4.."'),
                        "4xx",
                    ),
                ],
                unit="percentunit",
            ),
            Panel(
                "Latency percentiles (all operations)",
                "Client request latency, first byte in to last byte out.",
                [
                    Target(quantile(0.5, "tsproxy_request_duration_seconds"), "p50"),
                    Target(quantile(0.9, "tsproxy_request_duration_seconds"), "p90"),
                    Target(quantile(0.99, "tsproxy_request_duration_seconds"), "p99"),
                ],
                unit="s",
            ),
            Panel(
                "p99 latency by operation",
                "99th percentile of client request latency, per operation.",
                [Target(quantile(0.99, "tsproxy_request_duration_seconds", by="operation"), "{{operation}}")],
                unit="s",
            ),
            Panel(
                "In-flight work",
                "Client requests being served and client part uploads being received right now.",
                [
                    Target(total("tsproxy_requests_in_flight"), "requests in flight"),
                    Target(total("tsproxy_multipart_uploads_in_progress"), "multipart uploads in progress"),
                    Target(total("tsproxy_event_loop_tasks"), "event loop tasks"),
                ],
            ),
            Panel(
                "Client connections",
                "Open client connections, connections refused at the max_connections limit, and clients "
                "cut off for stalling (header: request headers not sent in time; body: RequestTimeout).",
                [
                    Target(total("tsproxy_connections_open"), "open"),
                    Target(rate("tsproxy_connections_refused_total"), "refused/s"),
                    Target(rate("tsproxy_connections_evicted_total"), "evicted (unauthenticated)/s"),
                    Target(rate("tsproxy_client_timeouts_total", by="kind"), "timeouts/s ({{kind}})"),
                ],
            ),
        ],
    ),
    Row(
        "Bytes and transform",
        [
            Panel(
                "Client vs backend bytes",
                "Original bytes to and from clients against stored bytes to and from the backend.",
                [
                    Target(rate("tsproxy_client_received_bytes_total"), "client → tsproxy"),
                    Target(rate("tsproxy_client_sent_bytes_total"), "tsproxy → client"),
                    Target(rate("tsproxy_backend_sent_bytes_total"), "tsproxy → backend"),
                    Target(rate("tsproxy_backend_received_bytes_total"), "backend → tsproxy"),
                ],
                unit="Bps",
            ),
            Panel(
                "Compression ratio (stored / original)",
                "Stored bytes per original byte for the chunks written in the interval: below 1 is a saving.",
                [
                    Target(
                        ratio(
                            rate("tsproxy_transform_stored_bytes_total"),
                            rate("tsproxy_transform_original_bytes_total"),
                        ),
                        "stored/original",
                    )
                ],
                unit="percentunit",
            ),
            Panel(
                "Transform CPU",
                "CPU cores busy compressing, encrypting, decrypting and decompressing, by direction.",
                [Target(rate("tsproxy_transform_cpu_seconds_total", by="direction"), "{{direction}}")],
                unit="short",
                stack=True,
            ),
            Panel(
                "Memory given back",
                "Times per second the free memory kept for the next upload part went back to the system "
                "after a quiet spell (malloc_idle_release), by result: released, or none to give back.",
                [Target(rate("tsproxy_memory_releases_total", by="result"), "{{result}}")],
                unit="ops",
            ),
        ],
    ),
    Row(
        "Cache and prefetch",
        [
            Panel(
                "Cache hit ratio",
                "Chunk cache lookups that hit, by count and by bytes; manifest cache hit ratio.",
                [
                    Target(
                        share("tsproxy_cache_requests_total", 'result="hit"'),
                        "chunks",
                    ),
                    Target(
                        share("tsproxy_cache_bytes_total", 'result="hit"'),
                        "bytes",
                    ),
                    Target(
                        share("tsproxy_manifest_cache_requests_total", 'result="hit"'),
                        "manifests",
                    ),
                    Target(
                        share("tsproxy_catalog_lookups_total", 'result="hit"'),
                        "listed from catalog",
                    ),
                ],
                unit="percentunit",
            ),
            Panel(
                "Size catalog",
                "Catalog flushes, compactions, failed flushes and damaged catalog objects per second. "
                "Failures cost only speed: listings fall back to a HEAD per object.",
                [Target(rate("tsproxy_catalog_events_total", by="event"), "{{event}}")],
                unit="ops",
            ),
            Panel(
                "Cache fill",
                "Bytes held by the chunk cache on disk against its configured size.",
                [
                    Target(total("tsproxy_cache_size_bytes"), "size"),
                    Target(total("tsproxy_cache_limit_bytes"), "limit"),
                ],
                unit="bytes",
            ),
            Panel(
                "Evictions and corruption",
                "Chunks evicted to stay within the cache size, entries refetched after a failed checksum, "
                "chunks left uncached while the disk was behind, and reads that joined a download "
                "already under way.",
                [
                    Target(rate("tsproxy_cache_evictions_total"), "evictions/s"),
                    Target(rate("tsproxy_cache_skipped_total"), "skipped/s"),
                    Target(rate("tsproxy_cache_corrupt_total"), "corrupt/s"),
                    Target(rate("tsproxy_singleflight_joins_total"), "single-flight joins/s"),
                ],
                unit="ops",
            ),
            Panel(
                "Prefetch chunks",
                "Prefetched chunks per second: issued, used by a reader, wasted (evicted unread).",
                [Target(rate("tsproxy_prefetch_chunks_total", by="state"), "{{state}}")],
                unit="ops",
            ),
            Panel(
                "Prefetch usefulness",
                "Share of prefetched chunks that a reader used, and share evicted unread.",
                [
                    Target(
                        ratio(
                            rate("tsproxy_prefetch_chunks_total", 'state="used"'),
                            rate("tsproxy_prefetch_chunks_total", 'state="issued"'),
                        ),
                        "used / issued",
                    ),
                    Target(
                        ratio(
                            rate("tsproxy_prefetch_chunks_total", 'state="wasted"'),
                            rate("tsproxy_prefetch_chunks_total", 'state="issued"'),
                        ),
                        "wasted / issued",
                    ),
                ],
                unit="percentunit",
            ),
        ],
    ),
    Row(
        "Backend",
        [
            Panel(
                "Backend requests per client request",
                "Backend requests tsproxy made for each client request: cache, prefetch and coalescing "
                "keep it low; retries push it up.",
                [
                    Target(
                        ratio(rate("tsproxy_backend_requests_total"), rate("tsproxy_requests_total")), "ratio"
                    )
                ],
            ),
            Panel(
                "Backend requests by operation",
                "Backend requests per second, by operation and outcome.",
                [
                    Target(
                        rate("tsproxy_backend_requests_total", by="operation, outcome"),
                        "{{operation}} {{outcome}}",
                    )
                ],
                unit="reqps",
                stack=True,
            ),
            Panel(
                "Backend errors and retries",
                "Backend requests that ended in an error, and retried attempts, per second.",
                [
                    Target(
                        rate("tsproxy_backend_requests_total", 'outcome!~"ok|not_found"', by="outcome"),
                        "failed {{outcome}}",
                    ),
                    Target(rate("tsproxy_backend_retries_total", by="operation"), "retry {{operation}}"),
                ],
                unit="reqps",
            ),
            Panel(
                "Backend latency percentiles",
                "Backend request latency over every operation.",
                [
                    Target(quantile(0.5, "tsproxy_backend_request_duration_seconds"), "p50"),
                    Target(quantile(0.9, "tsproxy_backend_request_duration_seconds"), "p90"),
                    Target(quantile(0.99, "tsproxy_backend_request_duration_seconds"), "p99"),
                ],
                unit="s",
            ),
            Panel(
                "Integrity errors",
                "Stored data that failed authentication or a checksum, per second.",
                [Target(rate("tsproxy_integrity_errors_total"), "integrity errors/s")],
                unit="ops",
            ),
            Panel(
                "Versions running",
                "Instances by tsproxy version and Python version: during a rollout, two rows.",
                [
                    Target(
                        f"count by (version, python) (tsproxy_build_info{{{SEL}}})",
                        "{{version}} (Python {{python}})",
                    )
                ],
                kind="stat",
                width=6,
                height=8,
            ),
            Panel(
                "Active keys in use",
                "How many different active key-encryption keys the selected instances report. More than "
                "one outside a rotation means some instance did not pick up the new ring: objects it "
                "writes are wrapped by the old key (see docs/OPERATIONS.md, key rotation).",
                [
                    Target(
                        f"count(count by (kek_id) (tsproxy_key_ring_active_info{{{SEL}}} == 1))",
                        "active keys",
                    )
                ],
                kind="stat",
                width=6,
                height=8,
                extra_defaults={
                    "thresholds": {
                        "mode": "absolute",
                        "steps": [{"color": "green", "value": None}, {"color": "red", "value": 2}],
                    }
                },
            ),
            Panel(
                "Key ring",
                "Keys on each instance's loaded key ring, its active key, and reloads of the ring file "
                "since the processes started. During a rotation every instance must show the new ring "
                "before the next step; a failed reload keeps the previous ring (see docs/OPERATIONS.md).",
                [
                    Target(f"sum by (instance) (tsproxy_key_ring_keys{{{SEL}}})", "keys {{instance}}"),
                    Target(
                        f"max by (instance, kek_id) (tsproxy_key_ring_active_info{{{SEL}}})",
                        "active {{kek_id}} {{instance}}",
                    ),
                    Target(
                        f"sum by (outcome) (tsproxy_key_ring_reloads_total{{{SEL}}})", "reloads {{outcome}}"
                    ),
                ],
            ),
            Panel(
                "Object store up",
                "1 while the object store serves tsproxy, 0 while it does not: unreachable, refusing "
                "tsproxy's credentials, or answering server errors (5xx) (from the probes and request "
                "outcomes). At 0, uploads and uncached reads get a fast 503 "
                "with Retry-After while readiness stays up; TsproxyBackendDown fires after 2 minutes "
                "(see docs/OPERATIONS.md).",
                [Target(f"min by (instance) (tsproxy_backend_up{{{SEL}}})", "{{instance}}")],
                width=10,
                extra_defaults={"min": 0, "max": 1},
            ),
            Panel(
                "Served stale during an outage",
                "Objects resolved from a manifest past metadata_ttl because the store could not be asked "
                "whether they changed, and how far past it (p99); bounded by metadata_stale_if_error "
                "(see docs/OPERATIONS.md).",
                [
                    Target(rate("tsproxy_manifest_stale_served_total"), "served stale/s"),
                    Target(quantile(0.99, "tsproxy_manifest_stale_seconds"), "p99 seconds past metadata_ttl"),
                ],
            ),
        ],
    ),
]


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": True,
            "stacking": {"mode": "normal" if panel.stack else "none", "group": "A"},
        }
        options: dict[str, Any] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    else:
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
        }
    defaults.update(panel.extra_defaults)
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": [
            {
                "datasource": DATASOURCE,
                "refId": chr(ord("A") + i),
                "expr": t.expr,
                "legendFormat": t.legend,
                "range": True,
                "editorMode": "code",
            }
            for i, t in enumerate(panel.targets)
        ],
    }


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,  # on time range change: new pods show up without a reload
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
    }


def build() -> dict[str, Any]:
    """The dashboard as a JSON-ready dict."""
    panels: list[dict[str, Any]] = []
    next_id = 1
    y = 0
    for row in ROWS:
        panels.append(
            {
                "id": next_id,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        next_id += 1
        y += 1
        x = 0
        line_height = 0
        for panel in row.panels:
            if x + panel.width > 24:
                x, y, line_height = 0, y + line_height, 0
            panels.append(_panel_json(panel, next_id, x, y))
            next_id += 1
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return {
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
            {"type": "panel", "id": "stat", "name": "Stat", "version": ""},
        ],
        "uid": UID,
        "title": "tsproxy",
        "description": "tsproxy, the S3 storage sidecar for Kafka tiered storage: requests, bytes, cache, "
        "prefetch and backend health. Metrics are described in tsproxy/metrics.py; "
        "what to do about them in docs/OPERATIONS.md.",
        "tags": ["tsproxy", "kafka", "s3"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "links": [],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "refresh": 1,
                    "current": {},
                    "hide": 0,
                    "includeAll": False,
                    "multi": False,
                    "regex": "",
                },
                _variable("job", "Job", "label_values(tsproxy_requests_total, job)"),
                _variable("instance", "Instance", INSTANCES),
            ]
        },
        "panels": panels,
    }


def render() -> str:
    """The dashboard file's exact text."""
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    OUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
