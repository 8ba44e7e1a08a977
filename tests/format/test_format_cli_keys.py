"""`tsproxy keys`, driven through its argparse registration and handler, and as a real command."""

from __future__ import annotations

import argparse
import io
import json
import os
import pty
import re
import stat
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import tsproxy
from tsproxy import cli_keys
from tsproxy.format import KeyRing

TREE = Path(tsproxy.__file__).resolve().parent.parent


def keys(*argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="tsproxy")
    cli_keys.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["keys", *argv])
    out, err = io.StringIO(), io.StringIO()
    code = args.func(args, out, err)
    return code, out.getvalue(), err.getvalue()


def test_rotation_workflow(tmp_path: Path) -> None:
    ring = str(tmp_path / "ring.json")
    code, out, _ = keys("init", "--key-ring", ring, "--id", "first")
    assert code == 0 and "first" in out
    assert stat.S_IMODE((tmp_path / "ring.json").stat().st_mode) == 0o600

    assert keys("add", "--key-ring", ring, "--id", "second")[0] == 0
    assert KeyRing.load(ring).active_id == "first"
    code, _, err = keys("remove", "--key-ring", ring, "first")
    assert code == 1 and "active" in err
    assert keys("activate", "--key-ring", ring, "second")[0] == 0
    assert keys("remove", "--key-ring", ring, "first", "--yes")[0] == 0

    code, out, _ = keys("list", "--key-ring", ring, "--json")
    listed = json.loads(out)
    assert [(k["id"], k["active"]) for k in listed] == [("second", True)]
    code, out, _ = keys("list", "--key-ring", ring)
    assert code == 0 and "* second" in out and "aes-256-kw" in out


def test_add_and_activate_at_once(tmp_path: Path) -> None:
    ring = str(tmp_path / "ring.json")
    keys("init", "--key-ring", ring)
    code, out, _ = keys("add", "--key-ring", ring, "--activate")
    assert code == 0 and "now active" in out
    assert len(KeyRing.load(ring).ids()) == 2


def test_refusals_exit_1_with_a_message(tmp_path: Path) -> None:
    ring = str(tmp_path / "ring.json")
    assert keys("list", "--key-ring", ring)[0:1] == (1,)
    keys("init", "--key-ring", ring)
    code, _, err = keys("init", "--key-ring", ring)
    assert code == 1 and "already exists" in err
    code, _, err = keys("activate", "--key-ring", ring, "ghost")
    assert code == 1 and "ghost" in err
    code, _, err = keys("add", "--key-ring", ring, "--id", "bad id")
    assert code == 1 and "key id" in err


# -- which ring, and removing a key with care: the real `tsproxy keys` in a subprocess ----------------


def tsproxy_keys(
    cwd: Path, *argv: str, env: dict[str, str] | None = None, answer: bytes | None = None
) -> tuple[int, str, str]:
    """Run `tsproxy keys ARGV`; with `answer`, stdin is a terminal that types it."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TSPROXY_")}
    clean["PYTHONPATH"] = str(TREE)
    command = [sys.executable, "-m", "tsproxy.cli", "keys", *argv]
    if answer is None:
        done = subprocess.run(
            command, cwd=cwd, env={**clean, **(env or {})}, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        return done.returncode, done.stdout, done.stderr
    terminal, stdin = pty.openpty()
    try:
        proc = subprocess.Popen(
            command, cwd=cwd, env={**clean, **(env or {})}, stdin=stdin,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        os.close(stdin)
        os.write(terminal, answer)
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(terminal)
    return proc.returncode, out, err


def _two_key_ring(path: Path) -> bytes:
    ring = KeyRing.new(key_id="old")
    ring.add(key_id="new")
    ring.activate("new")
    ring.save(path)
    return path.read_bytes()


def _backups(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.bak-*"))


def test_the_ring_comes_from_the_config_or_the_environment(tmp_path: Path) -> None:
    ring = tmp_path / "ring.json"
    _two_key_ring(ring)
    (tmp_path / "tsproxy.toml").write_text(f'backend = "http://127.0.0.1:1"\nkey_ring = "{ring}"\n')
    code, out, err = tsproxy_keys(tmp_path, "list", "--config", str(tmp_path / "tsproxy.toml"))
    assert code == 0 and "* new" in out and "old" in out, err
    code, out, _ = tsproxy_keys(tmp_path, "list", env={"TSPROXY_KEY_RING": str(ring)})
    assert code == 0 and "* new" in out
    code, out, _ = tsproxy_keys(tmp_path, "add", "--id", "third", env={"TSPROXY_KEY_RING": str(ring)})
    assert code == 0 and str(ring) in out and "third" in KeyRing.load(ring).ids()
    # --key-ring wins over both.
    other = tmp_path / "other.json"
    KeyRing.new(key_id="elsewhere").save(other)
    code, out, _ = tsproxy_keys(
        tmp_path, "list", "--key-ring", str(other), "--config", str(tmp_path / "tsproxy.toml"),
        env={"TSPROXY_KEY_RING": str(ring)},
    )  # fmt: skip
    assert code == 0 and "elsewhere" in out and "new" not in out


def test_no_ring_named_anywhere_is_refused_in_one_line(tmp_path: Path) -> None:
    # The embedded file:// defaults would make the server generate a dev ring: `keys` does not guess it.
    code, out, err = tsproxy_keys(tmp_path, "list")
    assert code == 2 and out == ""
    assert err.splitlines() == [
        "tsproxy keys: no key ring given: pass --key-ring FILE, or set key_ring in --config FILE or "
        "$TSPROXY_KEY_RING"
    ]
    (tmp_path / "bad.toml").write_text("key_ring = [1]\nnonsense = 1\n")
    code, _, err = tsproxy_keys(tmp_path, "list", "--config", str(tmp_path / "bad.toml"))
    assert code == 2 and len(err.splitlines()) == 1 and "nonsense" in err


def test_remove_without_a_terminal_needs_yes(tmp_path: Path) -> None:
    ring = tmp_path / "ring.json"
    before = _two_key_ring(ring)
    code, out, err = tsproxy_keys(tmp_path, "remove", "old", "--key-ring", str(ring))
    assert code == 2 and out == ""
    assert err.splitlines() == ["tsproxy keys: remove old: not confirmed (no terminal to ask on; pass --yes "
                                "to remove it)"]  # fmt: skip
    assert ring.read_bytes() == before and _backups(ring) == []

    code, out, err = tsproxy_keys(tmp_path, "remove", "old", "--key-ring", str(ring), "--yes")
    assert code == 0, err
    assert KeyRing.load(ring).ids() == ["new"]
    [saved] = _backups(ring)
    assert saved.read_bytes() == before and str(saved) in out
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert re.fullmatch(r"ring\.json\.bak-\d{8}T\d{6}Z", saved.name)
    assert KeyRing.load(saved).ids() == ["old", "new"]  # the removed key can still be put back from it


def test_remove_on_a_terminal_asks(tmp_path: Path) -> None:
    ring = tmp_path / "ring.json"
    before = _two_key_ring(ring)
    code, _, err = tsproxy_keys(tmp_path, "remove", "old", "--key-ring", str(ring), answer=b"n\n")
    assert code == 1 and "remove key old from" in err and "[y/N]" in err and "not removed" in err
    assert ring.read_bytes() == before and _backups(ring) == []
    # The active key is refused before anything is asked.
    code, _, err = tsproxy_keys(tmp_path, "remove", "new", "--key-ring", str(ring), answer=b"y\n")
    assert code == 1 and "active" in err and "[y/N]" not in err

    code, out, err = tsproxy_keys(tmp_path, "remove", "old", "--key-ring", str(ring), answer=b"y\n")
    assert code == 0 and "removed old" in out, err
    assert KeyRing.load(ring).ids() == ["new"]
    assert [p.read_bytes() for p in _backups(ring)] == [before]


def test_backups_never_overwrite_each_other(tmp_path: Path) -> None:
    ring = tmp_path / "ring.json"
    first = _two_key_ring(ring)
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    a = cli_keys.backup(ring, at)
    ring.write_bytes(b"changed")
    b = cli_keys.backup(ring, at)
    assert (a.name, b.name) == ("ring.json.bak-20260102T030405Z", "ring.json.bak-20260102T030405Z-1")
    assert (a.read_bytes(), b.read_bytes()) == (first, b"changed")
