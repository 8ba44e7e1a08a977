"""Every shell command the README and docs/ show is run here as written, or named below with the reason
it cannot run on a test machine (and the test that covers it instead). A command added to the docs
without either fails `test_every_command_is_run_or_excused`.

The commands run through bash, one session per document in document order (so an `export` in one
block holds for the next, as in a reader's shell), in one directory beside one `tsproxy serve` started
with its defaults from that directory, the way `make run` starts it, except for its ports: it gets
free ones, and the commands' `127.0.0.1:9000` and `127.0.0.1:9102` are replaced by them; a command
that talks to the default port without naming it (`tsproxy demo`) is first written out with the
default it means (IMPLICIT_DEFAULTS), then given the port the same way. That is the only change to
what the docs say. The directory holds what a reader has there: the repository's
README.md and its `.venv` (a link to the environment running the tests); the PATH is a user's
(tests/support/as_user.py) plus the aws cli's directory.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy.deploy_tools import REPO, find_tool
from tests.support.as_user import BIN, ENTRY_POINT, serving_as_user, user_env

DOCUMENTS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
PROGRAMS = ("tsproxy", "aws", "spark-submit", "make", "pip", "docker", "kubectl", "curl", ".", "export")
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.S | re.M)

# Commands that do not run here, by a pattern of their text, with the reason and where they are covered.
EXCUSED: list[tuple[str, str]] = [
    (r"^make run\b", "what this test stands in for: tsproxy serve with its defaults, on free ports"),
    (r"^make test\b", "what runs this test"),
    (r"^pip install 'tsproxy\[", "installs a release from PyPI; the tests run this tree, installed by make"),
    (r"^tsproxy export .*--output /archive/", "writes to /archive on the machine; the demo's export "
     "(README, docs/PIPELINE.md) runs the same command with an output in the reader's directory"),
    (r"^spark-submit --master spark://", "needs a Spark cluster at that address: tests/jobs/test_submit.py "
     "and tests/spark/test_cluster.py submit the same entry points to a standalone cluster"),
]  # fmt: skip


@dataclass(frozen=True)
class Command:
    document: str
    text: str  # as written, continuation lines included

    @property
    def excuse(self) -> str | None:
        flat = " ".join(self.text.replace("\\\n", " ").split())
        return next((why for pattern, why in EXCUSED if re.search(pattern, flat)), None)


def commands(document: str) -> list[Command]:
    """The shell commands of a document: every line of an sh/bash/shell block, and of a plain block
    whose every line starts with a program (a plain block of output or a diagram has other lines)."""
    found = []
    for lang, body in FENCE.findall((REPO / document).read_text()):
        lines = _joined(body)
        if not lines:
            continue
        if lang in ("sh", "bash", "shell") or (
            lang == "" and all(line.split()[0] in PROGRAMS for line in lines)
        ):
            found += [Command(document, line) for line in lines]
    return found


def _joined(body: str) -> list[str]:
    out: list[str] = []
    pending = ""
    for line in body.splitlines():
        if pending:
            pending += "\n" + line
        elif line.strip() and not line.lstrip().startswith("#"):
            pending = line
        else:
            continue
        if not line.endswith("\\"):
            out.append(pending)
            pending = ""
    return out


ALL = [c for d in DOCUMENTS for c in commands(d)]


def test_the_docs_have_commands() -> None:
    """The extraction itself: the tour's commands are among those found."""
    texts = [c.text for c in ALL if c.document == "README.md"]
    assert "tsproxy demo" in texts
    assert "tsproxy jobs verify --bucket demo-tiered --output demo-verify" in texts
    assert any(c.document == "docs/JOBS.md" for c in ALL) and any(c.excuse for c in ALL)


# -- the documents' context -------------------------------------------------------------------------------


def _legacy_bucket(cwd: Path) -> None:
    """docs/JOBS.md migrates a bucket of objects tsproxy did not write: put some in the store."""
    from tsproxy.store.local import LocalBackend

    async def fill() -> None:
        backend = LocalBackend(cwd / "tsproxy-data", fsync=False)
        await backend.start()
        await backend.create_bucket("legacy")
        for n in range(3):
            await backend.put("legacy", f"orders-0/{n:020d}.log", os.urandom(50_000))
        await backend.close()

    asyncio.run(fill())


def _jobs_context(cwd: Path, endpoint: str) -> None:
    """What docs/JOBS.md's examples presume: the server's tsproxy.toml, a bucket of tiered segments
    (`tiered`), one of objects from before tsproxy (`legacy`), and the list of live topics."""
    (cwd / "tsproxy.toml").write_text(
        'backend = "file://./tsproxy-data"\nkey_ring = "tsproxy-data-dev-keyring.json"\n'
    )
    demo = [str(ENTRY_POINT), "demo", "--endpoint", endpoint, "--bucket", "tiered", "--records", "2000"]
    subprocess.run(demo, cwd=cwd, env=user_env(), check=True, capture_output=True, timeout=300)
    _legacy_bucket(cwd)
    (cwd / "live-topic-ids.txt").write_text("orders\n")


# Commands whose default endpoint is tsproxy's default port, spelt out so that the port can be replaced.
IMPLICIT_DEFAULTS = {"tsproxy demo": "tsproxy demo --endpoint http://127.0.0.1:9000"}


def spelt_out(text: str) -> str:
    return IMPLICIT_DEFAULTS.get(text, text)


PREPARE: dict[str, Callable[[Path, str], None]] = {"docs/JOBS.md": _jobs_context}


@pytest.fixture(scope="module")
def reader_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, int]]:
    cwd = tmp_path_factory.mktemp("reader")
    (cwd / "README.md").write_bytes((REPO / "README.md").read_bytes())
    (cwd / ".venv").symlink_to(BIN.parent)
    with serving_as_user(cwd) as (_, port, metrics_port):
        yield cwd, port, metrics_port


def _session_env() -> dict[str, str]:
    aws = find_tool("aws") or str(REPO / ".tools" / "awscli" / "bin" / "aws")
    env = user_env()
    env["PATH"] = os.pathsep.join([str(BIN), str(Path(aws).parent), env["PATH"]])
    return env


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("document", [d for d in DOCUMENTS if any(not c.excuse for c in commands(d))])
def test_every_command_is_run_or_excused(document: str, reader_directory: tuple[Path, int, int]) -> None:
    cwd, port, metrics_port = reader_directory
    endpoint = f"http://127.0.0.1:{port}"
    if document in PREPARE:
        PREPARE[document](cwd, endpoint)
    runnable = [spelt_out(c.text) for c in commands(document) if not c.excuse]
    script = "set -eo pipefail\n" + "\n".join(runnable) + "\n"
    script = script.replace("127.0.0.1:9000", f"127.0.0.1:{port}").replace(
        "127.0.0.1:9102", f"127.0.0.1:{metrics_port}"
    )
    done = subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=_session_env(), capture_output=True, text=True, timeout=3000
    )
    assert done.returncode == 0, f"{document}: {script}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
