"""The `tsproxy` command: serve, keys, and the data pipeline's jobs."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TypeVar

from tsproxy import __version__, config, logs, memory
from tsproxy.errors import ConfigError

T = TypeVar("T")

SERVE_FLAGS = (
    ("--listen", "listen", f"HOST:PORT of the S3 API (default {config.show('listen')})"),
    (
        "--metrics-listen",
        "metrics_listen",
        f"HOST:PORT for /metrics, /healthz, /readyz (default {config.show('metrics_listen')}; 'off')",
    ),
    (
        "--backend",
        "backend",
        f"file:///path (default {config.show('backend').removeprefix('file://')}) "
        "or http(s)://host:port of an S3 store",
    ),
    ("--backend-region", "backend_region", "region of the S3 backend"),
    ("--backend-bucket", "backend_bucket", "map every client bucket under this one backend bucket"),
    ("--backend-prefix", "backend_prefix", "key prefix inside --backend-bucket"),
    (
        "--backend-part-size",
        "backend_part_size",
        f"multipart part size for backend uploads (default {config.show('backend_part_size')})",
    ),
    (
        "--key-ring",
        "key_ring",
        "key ring file (tsproxy keys init); never created: a dev ring is generated only when no ring "
        "is named and the backend is file://",
    ),
    ("--chunk-size", "chunk_size", f"chunk size, 64KiB..64MiB (default {config.show('chunk_size')})"),
    (
        "--compression",
        "compression",
        f"off, on or auto (default {config.show('compression')}; "
        "auto: skip already-compressed Kafka segments)",
    ),
    ("--compression-level", "compression_level", f"zstd level (default {config.show('compression_level')})"),
    (
        "--format-version",
        "format_version",
        f"stored format version of new objects, 1 or 2 (default {config.show('format_version')}; "
        "1 while some instance only reads 1)",
    ),
    (
        "--cache-dir",
        "cache_dir",
        f"chunk cache directory (default {config.show('cache_dir')}; 'off' disables it)",
    ),
    ("--cache-size", "cache_size", f"chunk cache size (default {config.show('cache_size')})"),
    (
        "--prefetch",
        "prefetch",
        f"bytes read ahead of a forward-moving reader (default {config.show('prefetch')})",
    ),
    ("--region", "region", f"region this endpoint reports (default {config.show('region')})"),
    ("--log-level", "log_level", "debug, info, warning, error (debug adds tracebacks to start-up errors)"),
    (
        "--access-log",
        "access_log",
        f"on or off: one JSON line per client request (default {config.show('access_log')})",
    ),
    (
        "--backend-check",
        "backend_check",
        f"seconds between backend probes (default {config.show('backend_check')}; 0: only at start)",
    ),
)


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the S3 endpoint", description="Run the tsproxy S3 endpoint.")
    p.add_argument("--config", help="TOML config file (same keys as the flags, with underscores)")
    for flag, dest, text in SERVE_FLAGS:
        p.add_argument(flag, dest=dest, help=text)
    p.add_argument(
        "--no-encryption",
        dest="encryption",
        action="store_const",
        const=False,
        help="store chunks unencrypted",
    )
    p.add_argument(
        "--allow-insecure-key-ring",
        dest="allow_insecure_key_ring",
        action="store_const",
        const=True,
        help="start even if group or others may read or write the key ring file",
    )
    p.add_argument(
        "--anonymous", dest="anonymous", action="store_const", const=True, help="accept unsigned requests"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="run the start-up checks and probe the backend, print one line per finding, exit 0 or 2",
    )
    p.set_defaults(func=_serve)


class StartupFailed(ConfigError):
    """Something unexpected stopped the start: still one line (the traceback comes at debug level)."""


def _serve(args: argparse.Namespace) -> int:
    from tsproxy import server

    cli = {dest: getattr(args, dest, None) for _, dest, _ in SERVE_FLAGS}
    cli["encryption"] = args.encryption
    cli["anonymous"] = args.anonymous
    cli["allow_insecure_key_ring"] = args.allow_insecure_key_ring
    cfg = config.load(cli, config_file=args.config)
    logs.setup(cfg.log_level)
    debug = cfg.log_level.lower() == "debug"
    if args.check:
        findings = _starting(lambda: asyncio.run(server.check(cfg)), debug)
        for finding in findings:
            print(finding.line(), flush=True)
        return 0 if all(f.ok for f in findings) else 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    # Before any thread starts allocating (see tsproxy/memory.py).
    if cfg.malloc_mmap_threshold:
        memory.fix_mmap_threshold(cfg.malloc_mmap_threshold)
    if cfg.malloc_trim_threshold:
        memory.fix_trim_threshold(cfg.malloc_trim_threshold)
    if cfg.malloc_arenas:
        memory.limit_arenas(cfg.malloc_arenas)
    started: list[bool] = []
    _starting(lambda: asyncio.run(server.run(cfg, ready=lambda: started.append(True))), debug, started)
    return 0


def _starting(step: Callable[[], T], debug: bool, started: Sequence[bool] = ()) -> T:
    """Run `step`; an error before the server started becomes one line (ConfigError), exit 2."""
    try:
        return step()
    except Exception as e:
        if started:  # a failure while serving is not a start-up mistake
            raise
        if debug:
            traceback.print_exception(e, file=sys.stderr)
        if isinstance(e, ConfigError):
            raise
        raise StartupFailed(f"start-up failed: {type(e).__name__}: {e}") from e


# The pipeline's commands pull in pyarrow and pyspark: imported only when asked for, so that `serve`
# starts fast and small (the demo's data writer too).
PIPELINE_COMMANDS = {
    "export": ("tsproxy.spark.cli", "export tiered Kafka segments to Parquet (on Spark)"),
    "jobs": ("tsproxy.jobs.cli", "bulk maintenance on Spark: rewrap, verify, inventory, migrate"),
    "demo": ("tsproxy.demo", "write sample Kafka tiered segments through a tsproxy, to try export and jobs"),
}


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tsproxy", description="S3-compatible storage sidecar for Kafka tiered storage"
    )
    parser.add_argument("--version", action="version", version=f"tsproxy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    from tsproxy import cli_keys

    cli_keys.register(sub)
    command = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, text) in PIPELINE_COMMANDS.items():
        if command == name:
            importlib.import_module(module).register(sub)
        else:
            sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"tsproxy: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
