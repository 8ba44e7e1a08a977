"""An operator's first starts, through the installed `tsproxy` entry point with a user's environment:
a mistake is one line and leaves nothing behind, a config file's typo gets a suggestion and its
relative paths are the file's, and one cache directory serves one instance."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.as_user import ENTRY_POINT, run_tsproxy, user_env
from tests.support.ports import free_port
from tsproxy.format import KeyRing


def _ports() -> list[str]:
    return ["--listen", f"127.0.0.1:{free_port()}", "--metrics-listen", f"127.0.0.1:{free_port()}"]


def test_an_unusable_cache_dir_is_one_line_and_leaves_nothing_behind(tmp_path: Path) -> None:
    done = run_tsproxy(["serve", *_ports(), "--cache-dir", "/proc/nope"], tmp_path, timeout=60)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("tsproxy: cache_dir (--cache-dir): ") and "/proc/nope" in line
    assert done.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no development key ring, no data directory


def test_a_typo_in_the_config_file_gets_a_suggestion(tmp_path: Path) -> None:
    (tmp_path / "tsproxy.toml").write_text('chunk_sise = "1MiB"\n')
    done = run_tsproxy(["serve", *_ports(), "--config", "tsproxy.toml"], tmp_path, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "tsproxy: config: unknown setting 'chunk_sise' in tsproxy.toml (did you mean 'chunk_size'?)"
    ]


def test_a_relative_key_ring_is_the_config_files_neighbour(tmp_path: Path) -> None:
    conf = tmp_path / "etc"
    conf.mkdir()
    ring = KeyRing.new(key_id="kek-beside-the-file")
    ring.save(conf / "ring.json")
    os.chmod(conf / "ring.json", 0o600)
    (conf / "tsproxy.toml").write_text('key_ring = "ring.json"\nbackend = "file:///nonexistent-here"\n')
    done = run_tsproxy(["serve", "--check", *_ports(), "--config", "etc/tsproxy.toml"], tmp_path, timeout=60)
    lines = done.stdout.splitlines()
    assert "ok   key_ring: etc/ring.json: 1 key(s), active kek-beside-the-file" in lines, done.stdout
    # The working directory's own ring.json is not what a file in etc/ means.
    (tmp_path / "ring.json").write_text("not a ring")
    again = run_tsproxy(["serve", "--check", *_ports(), "--config", "etc/tsproxy.toml"], tmp_path, timeout=60)
    assert "ok   key_ring: etc/ring.json: 1 key(s), active kek-beside-the-file" in again.stdout.splitlines()


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _serve(cwd: Path, procs: list[subprocess.Popen[str]], *args: str) -> subprocess.Popen[str]:
    """`tsproxy serve` (entry point, user's environment), returned once its start line is out."""
    proc = subprocess.Popen(
        [str(ENTRY_POINT), "serve", *_ports(), "--backend-check", "0", *args],
        cwd=cwd,
        env=user_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    procs.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line and json.loads(line)["msg"] == "tsproxy serving S3", "tsproxy did not start"
    return proc


def test_one_instance_per_cache_directory(tmp_path: Path, started: list[subprocess.Popen[str]]) -> None:
    first = _serve(tmp_path, started)
    second = run_tsproxy(["serve", *_ports(), "--backend", "file://./other-data"], tmp_path, timeout=60)
    assert second.returncode == 2
    assert second.stderr.strip().splitlines() == [
        f"tsproxy: cache_dir (default): tsproxy-cache is in use by another tsproxy (pid {first.pid}); "
        "give each instance a cache_dir of its own"
    ]
    assert not (tmp_path / "other-data").exists() and not (tmp_path / "other-data-dev-keyring.json").exists()
    # Another cache directory is another instance's to use.
    _serve(tmp_path, started, "--cache-dir", "cache-2", "--backend", "file://./other-data")
    # The lock goes with its process, however it ends.
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    _serve(tmp_path, started)
