"""Fixtures shared by every test folder. The machinery lives in tests/support/; this file only wires it.

- `seaweed` (session): a real SeaweedFS, see tests/support/seaweed.py.
- `seaweed_bucket`: a fresh, empty bucket in it, removed with its contents afterwards.
- `local_backend`: a started LocalBackend in a temporary directory.
- `seaweed_backend`: a started S3Backend on `seaweed` (fast backoff for tests).
- `backend`: each of the two, for contract tests (parametrized "local" / "seaweed").
- `faulty_proxy`: a started FaultyProxy in front of `seaweed`, see tests/support/faulty_proxy.py.
- `default_ports_held` (session, autouse): tsproxy's default ports are taken for the whole run, as a
  `make run` beside `make test` takes them, so a test that binds one without saying so fails here.
- `stack`, `dataset` (session): the real broker, its tsproxy and its tiered topics
  (tests/broker/fixtures.py), defined here once so tests/broker and tests/connect share one broker.

A failed test that used `seaweed` gets the end of the SeaweedFS log in its report.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest

# `tests.support` is imported as a package from the repository root, also when pytest is started as
# a script (`.venv/bin/pytest`) rather than with `python -m pytest` (which puts the cwd on sys.path).
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.broker.fixtures import dataset, stack  # noqa: E402, F401 (registered here, once)
from tests.support.faulty_proxy import FaultyProxy  # noqa: E402
from tests.support.ports import hold_default_ports  # noqa: E402
from tests.support.seaweed import SeaweedFS  # noqa: E402
from tsproxy.store.base import Backend  # noqa: E402
from tsproxy.store.local import LocalBackend  # noqa: E402
from tsproxy.store.s3 import S3Backend  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def default_ports_held() -> Iterator[list[tuple[str, int]]]:
    """Listen on tsproxy's default ports (those still free) while the tests run: no test may need them."""
    with hold_default_ports() as held:
        yield held


@pytest.fixture(scope="session")
def seaweed() -> Iterator[SeaweedFS]:
    """One SeaweedFS for the whole run (about 4 s to start)."""
    weed = SeaweedFS.start()
    try:
        yield weed
    finally:
        weed.stop()


@pytest.fixture
def seaweed_bucket(seaweed: SeaweedFS) -> Iterator[str]:
    """A fresh bucket in `seaweed`; emptied and deleted after the test."""
    name = seaweed.new_bucket()
    yield name
    seaweed.remove_bucket(name)


@pytest.fixture
async def local_backend(tmp_path: Path) -> AsyncIterator[LocalBackend]:
    """A started LocalBackend rooted in the test's temporary directory (no fsync, for speed)."""
    backend = LocalBackend(tmp_path / "store", fsync=False)
    await backend.start()
    yield backend
    await backend.close()


@pytest.fixture
async def seaweed_backend(seaweed: SeaweedFS) -> AsyncIterator[S3Backend]:
    """A started S3Backend on `seaweed`, retrying with millisecond backoff."""
    backend = S3Backend(**seaweed.backend_options(backoff_base=0.005, backoff_cap=0.05))
    await backend.start()
    yield backend
    await backend.close()


@pytest.fixture(params=["local", "seaweed"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each backend in turn: the contract tests run once per backend (a sync fixture, so that it can
    ask for the async ones by name)."""
    started: Backend = request.getfixturevalue(f"{request.param}_backend")
    return started


@pytest.fixture
async def faulty_proxy(seaweed: SeaweedFS) -> AsyncIterator[FaultyProxy]:
    """A FaultyProxy in front of `seaweed`; point clients at `faulty_proxy.endpoint`."""
    proxy = FaultyProxy(seaweed.endpoint)
    await proxy.start()
    yield proxy
    await proxy.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        _attach_seaweed_log(item, report)
    return report


def _attach_seaweed_log(item: pytest.Item, report: pytest.TestReport) -> None:
    used = set(getattr(item, "fixturenames", ()))
    # Fixtures asked for with request.getfixturevalue() do not appear in fixturenames.
    used.update(getattr(getattr(item, "_request", None), "_fixture_defs", {}) or {})
    if "seaweed" not in used:
        return
    weed = getattr(item, "funcargs", {}).get("seaweed")
    if weed is None:
        request = getattr(item, "_request", None)
        fixture_def = (getattr(request, "_fixture_defs", None) or {}).get("seaweed")
        cached = getattr(fixture_def, "cached_result", None)
        weed = cached[0] if cached else None
    if isinstance(weed, SeaweedFS):
        report.sections.append(("SeaweedFS log (end)", f"{weed.log_path}\n{weed.log_tail(60)}"))
