"""Alert rules and scrape config: promtool checks and unit tests, and the rules' ties to metrics and docs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_tools import DEPLOY, REPO, exported_names, require_tool, selectors, tsproxy_names

PROMETHEUS = DEPLOY / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
ALERTS_TEST = PROMETHEUS / "alerts_test.yml"
OPERATIONS = REPO / "docs" / "OPERATIONS.md"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = require_tool("promtool", "Debian package prometheus")
    return subprocess.run([promtool, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=300)


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_promtool_check_rules() -> None:
    run = _promtool("check", "rules", ALERTS.name)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in run.stdout + run.stderr


def test_promtool_unit_tests() -> None:
    run = _promtool("test", "rules", ALERTS_TEST.name)
    assert run.returncode == 0, run.stdout + run.stderr


def test_promtool_unit_tests_fail_when_a_rule_changes(tmp_path: Path) -> None:
    """The unit tests pin thresholds: loosening one makes them fail (they are not vacuous)."""
    require_tool("promtool", "Debian package prometheus")
    changed = ALERTS.read_text(encoding="utf-8").replace("> 0.05", "> 0.5")
    assert changed != ALERTS.read_text(encoding="utf-8")
    (tmp_path / "alerts.yml").write_text(changed)
    (tmp_path / "alerts_test.yml").write_text(ALERTS_TEST.read_text(encoding="utf-8"))
    promtool = require_tool("promtool", "Debian package prometheus")
    run = subprocess.run(
        [promtool, "test", "rules", "alerts_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode != 0
    assert "TsproxyServerErrors" in run.stdout + run.stderr


def test_promtool_check_config() -> None:
    run = _promtool("check", "config", "prometheus.yml")
    assert run.returncode == 0, run.stdout + run.stderr


def test_scrape_config_matches_the_rules_job() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text(encoding="utf-8"))
    assert "alerts.yml" in config["rule_files"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["tsproxy"]["metrics_path"] == "/metrics"
    assert all(t.endswith(":9102") for c in jobs["tsproxy"]["static_configs"] for t in c["targets"])


def test_every_rule_reads_real_series_of_the_tsproxy_job() -> None:
    names = exported_names()
    for rule in _rules():
        expr = rule["expr"]
        for name in tsproxy_names(expr):
            assert name in names, f"{rule['alert']}: tsproxy exports no {name}"
        for metric, matchers in selectors(expr):
            assert matchers.get("job") == ("=", "tsproxy"), f'{rule["alert"]}: {metric} without job="tsproxy"'


def _anchors(markdown: str) -> set[str]:
    """GitHub-style anchors of the headings in a markdown text."""
    out = set()
    for title in re.findall(r"^#+\s+(.+?)\s*$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_every_alert_has_severity_summary_and_a_runbook_that_exists() -> None:
    anchors = _anchors(OPERATIONS.read_text(encoding="utf-8"))
    names = [rule["alert"] for rule in _rules()]
    assert len(names) == len(set(names))
    for rule in _rules():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "docs/OPERATIONS.md" and anchor in anchors, f"{rule['alert']}: no section #{anchor}"


@pytest.mark.parametrize("alert", [rule["alert"] for rule in _rules()])
def test_every_alert_is_shown_firing_in_the_unit_tests(alert: str) -> None:
    suite = yaml.safe_load(ALERTS_TEST.read_text(encoding="utf-8"))
    firing = [
        case
        for group in suite["tests"]
        for case in group.get("alert_rule_test", [])
        if case["alertname"] == alert and case.get("exp_alerts")
    ]
    assert firing, f"alerts_test.yml never shows {alert} firing"
