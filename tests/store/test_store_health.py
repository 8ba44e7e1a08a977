"""The store's up/down state as a table of outcomes: which failures say the store does not serve (and so
count towards marking it down), which are answers, and how probes and trial requests bring it back.
The network tests (tests/network/test_store_answers.py) play the same against a real SeaweedFS."""

from __future__ import annotations

import pytest

from tsproxy import errors
from tsproxy.store.base import StoreFault
from tsproxy.store.health import BackendHealth, fails_store
from tsproxy.store.s3errors import BackendRefused


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _health() -> tuple[BackendHealth, list[bool], Clock]:
    states: list[bool] = []
    clock = Clock()
    return BackendHealth(states.append, trip_after=3, trial_every=2.0, clock=clock), states, clock


@pytest.mark.parametrize(
    ("error", "down"),
    [
        (errors.ServiceUnavailable("The storage backend could not be reached."), True),
        (BackendRefused("SignatureDoesNotMatch"), True),
        (StoreFault(500, "InternalError"), True),
        (StoreFault(502, "502"), True),
        (StoreFault(504, "GatewayTimeout"), True),
        (errors.SlowDown(), False),  # throttling: the store serves, but is busy
        (errors.NotImplemented_(), False),
        (errors.NoSuchKey(), False),
        (errors.PreconditionFailed(), False),
        (errors.InternalError("local object file is truncated"), False),  # one object, not the store
    ],
)
def test_which_failures_say_the_store_does_not_serve(error: errors.S3Error, down: bool) -> None:
    assert fails_store(error) is down
    health, states, _ = _health()
    for _ in range(3):
        health.outcome(error)
    assert health.up is not down and states[-1] is not down


def test_server_errors_trip_after_three_in_a_row_and_any_answer_resets_the_count() -> None:
    health, _, _ = _health()
    fault = StoreFault(500, "InternalError")
    health.outcome(fault)
    health.outcome(fault)
    health.outcome(errors.NoSuchKey())  # an answer: the count starts again
    health.outcome(fault)
    health.outcome(fault)
    assert health.up
    health.outcome(fault)
    assert not health.up and health.reason == "it answers 500 InternalError"
    with pytest.raises(errors.ServiceUnavailable) as refused:
        health.admit()
    assert "it answers 500 InternalError" in refused.value.message


def test_a_server_error_no_longer_brings_a_down_store_back() -> None:
    health, states, clock = _health()
    health.probed("backend http://store answers 500: it is reachable but does not serve requests")
    assert states[-1] is False
    clock.now += 2.0
    health.admit()  # a trial goes through ...
    health.outcome(StoreFault(500, "InternalError"))  # ... and gets a server error: still down
    assert not health.up and states[-1] is False
    clock.now += 2.0
    health.admit()
    health.outcome(None)  # a trial served: up
    assert health.up and states[-1] is True


def test_a_passing_probe_does_not_outweigh_requests_failing_since_the_probe_before() -> None:
    """The probes ask about the bucket; a store can answer that while every object request fails."""
    health, _, clock = _health()
    health.probed(None)
    for _ in range(3):
        clock.now += 0.1
        health.outcome(StoreFault(500, "InternalError"))
    assert not health.up
    clock.now += 10.0
    health.probed(None)  # a request failed since the probe before: still down
    assert not health.up
    clock.now += 1.0
    health.admit()
    health.outcome(StoreFault(500, "InternalError"))  # a trial fails
    clock.now += 9.0
    health.probed(None)
    assert not health.up
    clock.now += 10.0
    health.probed(None)  # nothing failed since the probe before: up
    assert health.up


def test_a_probe_that_reaches_a_store_that_could_not_be_reached_brings_it_back_at_once() -> None:
    health, _, clock = _health()
    health.probed("backend http://store: connection refused")
    assert not health.up
    clock.now += 10.0
    health.probed(None)
    assert health.up
    unreachable = errors.ServiceUnavailable("The storage backend could not be reached.")
    for _ in range(3):
        clock.now += 0.1
        health.outcome(unreachable)
    assert not health.up
    clock.now += 1.0
    health.probed(None)  # it answers now: not a server error, so the probe says it is back
    assert health.up
