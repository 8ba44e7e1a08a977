"""Run every conformance case against each target. tsproxy must pass them all (but the few named in
KNOWN_GAPS, strict xfails). SeaweedFS alone is run for comparison: the cases it is known to fail are
named in SEAWEEDFS_DIFFERS (strict xfails, so a SeaweedFS that starts passing one is noticed), and any
other case it fails fails the run: it would mean the case, or the SeaweedFS the tests run, changed."""

from __future__ import annotations

import pytest

from tests.conformance.cases import CASES, KNOWN_GAPS, RESULTS, SEAWEEDFS_DIFFERS, Target


@pytest.mark.parametrize("name", list(CASES))
def test_case(name: str, target: Target, request: pytest.FixtureRequest) -> None:
    target_name = request.node.callspec.params["target"]
    expected = KNOWN_GAPS if target_name == "tsproxy" else SEAWEEDFS_DIFFERS
    try:
        CASES[name](target)
    except Exception:
        RESULTS.setdefault(target_name, {})[name] = False
        if name in expected:
            pytest.xfail(f"known difference: {expected[name]}")
        raise
    RESULTS.setdefault(target_name, {})[name] = True
    if name in expected:
        pytest.fail(f"{TARGET_NAMES[target_name]} passes {name} now: remove it from its list of differences")


TARGET_NAMES = {"tsproxy": "tsproxy", "seaweedfs": "SeaweedFS"}
