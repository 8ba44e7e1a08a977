"""`tsproxy keys`: manage a key ring file (init, add, activate, list, remove).

Rotation is: `keys add`, then `keys activate` the new id (new objects use it at once), run the rewrap
job so old objects move to it, and only then `keys remove` the old one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from tsproxy.errors import KeyRingError
from tsproxy.format.keyring import AES_KW, KINDS, KeyRing


def register(subparsers: Any) -> None:
    """Add the `keys` command and its actions to an argparse subparsers object."""
    keys = subparsers.add_parser(
        "keys",
        help="manage the key ring (KEKs that wrap each object's data key)",
        description="Manage a key ring file: named key-encryption keys, one of them active.",
    )
    actions = keys.add_subparsers(dest="keys_action", required=True, metavar="ACTION")

    def action(name: str, text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = actions.add_parser(name, help=text, description=text)
        p.add_argument("--key-ring", required=True, metavar="FILE", help="the key ring file")
        return p

    p = action("init", "create a key ring file holding one new active key")
    p.add_argument("--kind", choices=KINDS, default=AES_KW, help=f"key kind (default {AES_KW})")
    p.add_argument("--id", dest="key_id", help="key id (default kek-YYYYMMDD-random)")
    p = action("add", "generate a new key; it wraps nothing until activated")
    p.add_argument("--kind", choices=KINDS, default=AES_KW, help=f"key kind (default {AES_KW})")
    p.add_argument("--id", dest="key_id", help="key id (default kek-YYYYMMDD-random)")
    p.add_argument("--activate", action="store_true", help="also make it the active key")
    p = action("activate", "make a key the one that wraps new objects' data keys")
    p.add_argument("key_id", metavar="KEY_ID")
    p = action("list", "show the keys (never their material)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p = action("remove", "drop a key (objects it wraps become unreadable; the active key is refused)")
    p.add_argument("key_id", metavar="KEY_ID")
    keys.set_defaults(func=run)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Carry out one `keys` action; 0 on success, 1 when the key ring refuses or cannot be used."""
    out = out or sys.stdout
    err = err or sys.stderr
    path = Path(args.key_ring)
    try:
        if args.keys_action == "init":
            if path.exists():
                raise KeyRingError(f"key ring {path}: already exists; use `keys add` to add a key to it")
            ring = KeyRing.new(args.kind, args.key_id)
            ring.save(path)
            print(f"created {path} with active key {ring.active_id} ({args.kind})", file=out)
            return 0
        ring = KeyRing.load(path)
        if args.keys_action == "add":
            key_id = ring.add(args.kind, args.key_id)
            if args.activate:
                ring.activate(key_id)
            ring.save(path)
            print(f"added {key_id} ({args.kind}){', now active' if args.activate else ''}", file=out)
        elif args.keys_action == "activate":
            ring.activate(args.key_id)
            ring.save(path)
            print(f"{args.key_id} is now the active key", file=out)
        elif args.keys_action == "remove":
            ring.remove(args.key_id)
            ring.save(path)
            print(f"removed {args.key_id}", file=out)
        elif args.keys_action == "list":
            _print_keys(ring.describe(), args.json, out)
        else:
            raise KeyRingError(f"unknown keys action {args.keys_action!r}")
    except KeyRingError as e:
        print(f"tsproxy keys: {e}", file=err)
        return 1
    return 0


def _print_keys(keys: list[dict[str, Any]], as_json: bool, out: TextIO) -> None:
    if as_json:
        json.dump(keys, out, indent=2)
        out.write("\n")
        return
    width = max(len("ID"), *(len(k["id"]) for k in keys))
    print(f"  {'ID':<{width}}  {'KIND':<16}  CREATED", file=out)
    for k in keys:
        mark = "*" if k["active"] else " "
        print(f"{mark} {k['id']:<{width}}  {k['kind']:<16}  {k['created']}", file=out)
