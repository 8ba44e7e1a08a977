"""The `tsproxy` command: serve, keys, and the data pipeline's jobs."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Sequence

from tsproxy import __version__, config, logs
from tsproxy.errors import ConfigError

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
        "key ring file (tsproxy keys init); a dev ring is generated for file:// backends",
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
    ("--log-level", "log_level", "debug, info, warning, error"),
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
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from tsproxy import server

    cli = {dest: getattr(args, dest, None) for _, dest, _ in SERVE_FLAGS}
    cli["encryption"] = args.encryption
    cli["anonymous"] = args.anonymous
    cli["allow_insecure_key_ring"] = args.allow_insecure_key_ring
    cfg = config.load(cli, config_file=args.config)
    logs.setup(cfg.log_level)

    def ready() -> None:
        host, port = cfg.listen
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
        lines = [f"tsproxy {__version__} serving S3 on {url} (backend {cfg.backend})"]
        if cfg.dev_mode:
            cred = cfg.credentials[0]
            lines += [
                "development defaults in use (local directory, dev credentials, generated dev key ring):",
                f"  export AWS_ACCESS_KEY_ID={cred.access_key} AWS_SECRET_ACCESS_KEY={cred.secret_key}",
                f"  aws --endpoint-url {url} s3 mb s3://demo && aws --endpoint-url {url} s3 cp README.md s3://demo/",
            ]
        if cfg.metrics_listen:
            lines.append(
                f"metrics and health on http://{cfg.metrics_listen[0]}:{cfg.metrics_listen[1]}/metrics"
            )
        print("\n".join(lines), flush=True)

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(server.run(cfg, ready=ready))
    return 0


# The pipeline's commands pull in pyarrow and pyspark: imported only when asked for, so that `serve`
# starts fast and small.
PIPELINE_COMMANDS = {
    "export": ("tsproxy.spark.cli", "export tiered Kafka segments to Parquet (on Spark)"),
    "jobs": ("tsproxy.jobs.cli", "bulk maintenance on Spark: rewrap, verify, inventory, migrate"),
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
