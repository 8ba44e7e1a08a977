"""`tsproxy keys`, driven through its argparse registration and handler."""

from __future__ import annotations

import argparse
import io
import json
import stat
from pathlib import Path

from tsproxy import cli_keys
from tsproxy.format import KeyRing


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
    assert keys("remove", "--key-ring", ring, "first")[0] == 0

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
