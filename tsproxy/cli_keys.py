"""`tsproxy keys`: manage a key ring file (init, add, activate, list, remove).

Rotation is: `keys add`, then `keys activate` the new id (new objects use it at once), run the rewrap
job so old objects move to it, and only then `keys remove` the old one.

The ring file is the one the server uses: `--key-ring`, else `key_ring` from `--config` (or
$TSPROXY_CONFIG) or $TSPROXY_KEY_RING, read by the server's own configuration loader. `remove` asks
before it drops a key (or takes `--yes`) and first copies the ring to `<ring>.bak-<UTC time>`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from tsproxy import config
from tsproxy.errors import ConfigError, KeyRingError
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
        p.add_argument(
            "--key-ring",
            metavar="FILE",
            help="the key ring file (default: key_ring of --config, or $TSPROXY_KEY_RING)",
        )
        p.add_argument("--config", help="TOML config file, as for `tsproxy serve`: its key_ring is used")
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
    p = action(
        "remove",
        "drop a key (objects it wraps become unreadable; the active key is refused); asks first, "
        "and keeps a backup of the ring",
    )
    p.add_argument("key_id", metavar="KEY_ID")
    p.add_argument("--yes", action="store_true", help="do not ask (needed when not on a terminal)")
    keys.set_defaults(func=run)


def ring_path(args: argparse.Namespace) -> Path:
    """The key ring file: --key-ring, else the one the server's configuration names. ConfigError if none."""
    if args.key_ring:
        return Path(args.key_ring).expanduser()
    # The server's loader, so the file, $TSPROXY_CONFIG and $TSPROXY_KEY_RING mean what they mean there.
    # `keys` serves no client, hence anonymous: credentials are not its business.
    cfg = config.load({"anonymous": True}, config_file=args.config)
    if cfg.key_ring is None or cfg.dev_mode:
        raise ConfigError(
            "no key ring given: pass --key-ring FILE, or set key_ring in --config FILE or $TSPROXY_KEY_RING"
        )
    return cfg.key_ring


def backup(path: Path, when: datetime | None = None) -> Path:
    """Copy the ring file, byte for byte, to `<ring>.bak-<UTC time>` (mode 0600, never overwritten)."""
    stamp = (when or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise KeyRingError(f"key ring {path}: cannot read it to back it up: {e.strerror}") from None
    for n in range(100):
        target = path.with_name(f"{path.name}.bak-{stamp}{f'-{n}' if n else ''}")
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        except OSError as e:
            raise KeyRingError(f"key ring {path}: cannot write a backup beside it: {e.strerror}") from None
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return target
    raise KeyRingError(f"key ring {path}: too many backups named {path.name}.bak-{stamp}")


def _confirmed(args: argparse.Namespace, path: Path, stdin: TextIO, err: TextIO) -> bool | None:
    """True to go on, False when the user said no, None when there is nobody to ask (no terminal)."""
    if args.yes:
        return True
    if not stdin.isatty():
        return None
    err.write(
        f"remove key {args.key_id} from {path}? Objects it still wraps become unreadable "
        "(run the rewrap job first). [y/N] "
    )
    err.flush()
    return stdin.readline().strip().lower() in ("y", "yes")


def run(
    args: argparse.Namespace,
    out: TextIO | None = None,
    err: TextIO | None = None,
    stdin: TextIO | None = None,
) -> int:
    """Carry out one `keys` action; 0 on success, 1 when the key ring refuses or cannot be used (or a
    removal is declined), 2 when no key ring is named or a removal cannot be confirmed."""
    out = out or sys.stdout
    err = err or sys.stderr
    stdin = stdin or sys.stdin
    try:
        path = ring_path(args)
    except ConfigError as e:
        print(f"tsproxy keys: {e}", file=err)
        return 2
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
            now_active = ", now active" if args.activate else ""
            print(f"added {key_id} ({args.kind}) to {path}{now_active}", file=out)
        elif args.keys_action == "activate":
            ring.activate(args.key_id)
            ring.save(path)
            print(f"{args.key_id} is now the active key of {path}", file=out)
        elif args.keys_action == "remove":
            ring.remove(args.key_id)  # refusals (the active key, an unknown id) come before the question
            confirmed = _confirmed(args, path, stdin, err)
            if confirmed is None:
                why = "no terminal to ask on; pass --yes to remove it"
                print(f"tsproxy keys: remove {args.key_id}: not confirmed ({why})", file=err)
                return 2
            if not confirmed:
                print(f"tsproxy keys: {args.key_id} not removed", file=err)
                return 1
            saved = backup(path)
            ring.save(path)
            print(f"removed {args.key_id} from {path} (the ring before: {saved})", file=out)
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
