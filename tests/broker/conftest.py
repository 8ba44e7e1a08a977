"""Hooks of the real-broker tests (every test here is `slow`). Their fixtures, `stack` and `dataset`, are
in tests/broker/fixtures.py, registered in tests/conftest.py so the Connect tests share the one broker.

A failing test that used the stack gets the end of the broker's and tsproxy's logs in its report.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

from tests.broker.fixtures import Stack


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and "stack" in getattr(item, "fixturenames", ()):
        request = getattr(item, "_request", None)
        fixture_def = (getattr(request, "_fixture_defs", None) or {}).get("stack")
        cached = getattr(fixture_def, "cached_result", None)
        running = cached[0] if cached else None
        if isinstance(running, Stack):
            report.sections.append(("broker and tsproxy logs (end)", running.logs()))
    return report
