"""The Grafana dashboard: importable structure, queries on tsproxy's real series, data after a workload.

`dashboard_queries(path)` gives every panel query with the template variables filled in, ready for a
real Prometheus (a live test can import it from here).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from deploy_tools import (
    DEPLOY,
    Sample,
    exported_names,
    fresh_metrics,
    require_tool,
    samples,
    selectors,
    tsproxy_names,
)

from tsproxy.metrics import Metrics

DASHBOARD = DEPLOY / "grafana" / "tsproxy.json"
BUILDER = DEPLOY / "grafana" / "build_dashboard.py"

# What Grafana puts in place of its variables; "all instances" is the regex .*.
SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "$__interval": "1m",
    "$__range": "1h",
    "${job}": ".*",
    "${instance}": ".*",
    "$job": ".*",
    "$instance": ".*",
}


def _load(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def _targets(dashboard: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(p, t) for p in _panels(dashboard) for t in p.get("targets", [])]


def dashboard_queries(path: Path = DASHBOARD) -> list[str]:
    """Every panel query of the dashboard at `path`, with the template variables substituted."""
    queries = []
    for _, target in _targets(_load(path)):
        expr = target["expr"]
        # Longest names first, so $__rate_interval is not read as $__rate followed by text.
        for name in sorted(SUBSTITUTIONS, key=len, reverse=True):
            expr = expr.replace(name, SUBSTITUTIONS[name])
        assert "$" not in expr, f"unsubstituted variable in {expr!r}"
        queries.append(expr)
    return queries


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_dashboard", BUILDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Dataclasses look their module up in sys.modules while the module runs.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return _load(DASHBOARD)


def test_committed_json_matches_its_builder() -> None:
    assert DASHBOARD.read_text(encoding="utf-8") == _builder().render(), (
        "deploy/grafana/tsproxy.json is stale: run `python deploy/grafana/build_dashboard.py`"
    )


def test_importable_structure(dashboard: dict[str, Any]) -> None:
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    assert dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert len(variables) == len(dashboard["templating"]["list"]), "variable names must be unique"
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    for name in ("job", "instance"):
        v = variables[name]
        assert v["type"] == "query" and v["includeAll"] and v["allValue"] == ".*"
        assert v["datasource"]["uid"] == "${datasource}"
    for panel in _panels(dashboard):
        if panel["type"] == "row":
            continue
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["title"] and panel["description"], panel["id"]


def test_panels_do_not_overlap(dashboard: dict[str, Any]) -> None:
    taken: set[tuple[int, int]] = set()
    for panel in _panels(dashboard):
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_every_query_uses_the_datasource_variable_and_selects_job_and_instance(
    dashboard: dict[str, Any],
) -> None:
    targets = _targets(dashboard)
    assert len(targets) >= 30
    for panel, target in targets:
        assert target["datasource"]["uid"] == "${datasource}", panel["title"]
        found = selectors(target["expr"])
        assert found, target["expr"]
        for metric, matchers in found:
            assert matchers.get("job") == ("=~", "$job"), f'{panel["title"]}: {metric} lacks job=~"$job"'
            assert matchers.get("instance") == ("=~", "$instance"), (
                f"{panel['title']}: {metric} lacks $instance"
            )
        # A metric written without a selector would escape the job/instance filter.
        assert tsproxy_names(target["expr"]) == {m for m, _ in found if m.startswith("tsproxy_")}, target[
            "expr"
        ]


def test_queries_name_only_series_tsproxy_exports(dashboard: dict[str, Any]) -> None:
    names = exported_names()
    exported = list(samples(fresh_metrics()))
    for panel, target in _targets(dashboard):
        for metric, matchers in selectors(target["expr"]):
            if not metric.startswith("tsproxy_"):
                assert metric == "up", metric
                continue
            assert metric in names, f"{panel['title']}: tsproxy exports no {metric}"
            for label, (op, value) in matchers.items():
                if label in ("job", "instance") or op.startswith("!"):
                    continue
                values = {s.labels.get(label) for s in exported if s.name == metric}
                hit = value in values if op == "=" else any(v and re.fullmatch(value, v) for v in values)
                assert hit, f"{panel['title']}: no {metric} sample has {label}{op}{value!r} (has {values})"


def test_every_tsproxy_series_has_a_panel(dashboard: dict[str, Any]) -> None:
    used = set().union(*(tsproxy_names(t["expr"]) for _, t in _targets(dashboard)))
    families = {re.sub(r"_(bucket|count|sum)$", "", n) for n in exported_names()}
    missing = {f for f in families if not any(u == f or u.startswith(f + "_") for u in used)}
    assert not missing, f"series without a panel: {sorted(missing)}"


def test_dashboard_queries_substitutes_every_variable() -> None:
    queries = dashboard_queries()
    assert len(queries) == len(_targets(_load(DASHBOARD)))
    for q in queries:
        assert 'job=~".*"' in q and 'instance=~".*"' in q, q
        assert "rate(" not in q or "[1m]" in q, q


# -- every query returns data once tsproxy has served a short workload --------------------------------------

JOB, INSTANCE = "tsproxy", "127.0.0.1:9102"
WORKLOAD_AT = 5  # minutes: zeros before (a freshly started tsproxy), the workload's totals from then on


def _short_workload(m: Metrics) -> None:
    """What a few uploads and ranged reads leave in the metrics; error-type counters stay at zero."""
    for op, status, n, seconds in (
        ("CreateBucket", "200", 1, 0.01),
        ("PutObject", "200", 3, 0.2),
        ("CreateMultipartUpload", "200", 1, 0.01),
        ("UploadPart", "200", 2, 0.3),
        ("CompleteMultipartUpload", "200", 1, 0.05),
        ("HeadObject", "200", 4, 0.002),
        ("GetObject", "206", 12, 0.03),
        ("ListObjectsV2", "200", 2, 0.01),
        ("GetObject", "404", 1, 0.002),
    ):
        m.requests.labels(op, status).inc(n)
        for _ in range(n):
            m.request_seconds.labels(op).observe(seconds)
    m.client_bytes_in.inc(40 << 20)
    m.client_bytes_out.inc(48 << 20)
    for op, n in (("PutObject", 3), ("CreateMultipartUpload", 1), ("UploadPart", 3), ("GetObject", 9),
                  ("HeadObject", 5), ("ListObjectsV2", 2), ("CompleteMultipartUpload", 1)):  # fmt: skip
        m.backend_requests.labels(op, "ok").inc(n)
        for _ in range(n):
            m.backend_seconds.labels(op).observe(0.04)
    m.backend_bytes_out.inc(22 << 20)
    m.backend_bytes_in.inc(18 << 20)
    m.transform_original_bytes.inc(40 << 20)
    m.transform_stored_bytes.inc(22 << 20)
    m.transform_cpu_seconds.labels("store").inc(0.4)
    m.transform_cpu_seconds.labels("read").inc(0.2)
    m.cache_requests.labels("hit").inc(7)
    m.cache_requests.labels("miss").inc(5)
    m.cache_bytes.labels("hit").inc(28 << 20)
    m.cache_bytes.labels("miss").inc(20 << 20)
    m.cache_size.set(36 << 20)
    m.cache_limit.set(1 << 30)
    m.prefetch_chunks.labels("issued").inc(4)
    m.prefetch_chunks.labels("used").inc(3)
    m.manifest_cache.labels("hit").inc(10)
    m.manifest_cache.labels("miss").inc(2)


def _series_line(s: Sample, values: str) -> dict[str, str]:
    labels = {**s.labels, "job": JOB, "instance": INSTANCE}
    body = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{s.name}{{{body}}}", "values": values}


def _input_series() -> list[dict[str, str]]:
    before = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples(fresh_metrics())}
    m = fresh_metrics()
    _short_workload(m)
    series = [{"series": f'up{{instance="{INSTANCE}", job="{JOB}"}}', "values": "1x10"}]
    for s in samples(m):
        start = before[(s.name, tuple(sorted(s.labels.items())))]
        values = " ".join([repr(start)] * WORKLOAD_AT + [repr(s.value)] * 6)
        series.append(_series_line(s, values))
    return series


def test_every_query_returns_data_after_a_short_workload(tmp_path: Path) -> None:
    """promtool evaluates absent(query) for each panel query right after the workload: none may fire.

    A canary alert on a series nobody exports must fire, which shows absent() notices an empty result.
    """
    promtool = require_tool("promtool", "Debian package prometheus")
    queries = dashboard_queries()
    rules = [{"alert": f"Empty{i}", "expr": f"absent({q})"} for i, q in enumerate(queries)]
    rules.append(
        {"alert": "Canary", "expr": 'absent(sum(rate(tsproxy_no_such_series_total{job=~".*"}[1m])))'}
    )
    (tmp_path / "queries.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    eval_time = f"{WORKLOAD_AT}m"
    tests: list[dict[str, Any]] = [
        {"eval_time": eval_time, "alertname": r["alert"], "exp_alerts": []} for r in rules[:-1]
    ]
    tests.append({"eval_time": eval_time, "alertname": "Canary", "exp_alerts": [{"exp_labels": {}}]})
    suite = {
        "rule_files": ["queries.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": _input_series(), "alert_rule_test": tests}],
    }
    (tmp_path / "queries_test.yml").write_text(yaml.safe_dump(suite, width=1000))
    run = subprocess.run(
        [promtool, "test", "rules", "queries_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = run.stdout + run.stderr
    empty = sorted({int(n) for n in re.findall(r"alertname: Empty(\d+),", output)})
    assert not empty, "queries with no data after a workload:\n" + "\n".join(queries[i] for i in empty)
    assert run.returncode == 0, output[-4000:]
