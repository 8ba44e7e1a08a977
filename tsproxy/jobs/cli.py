"""`tsproxy jobs <name>`: the maintenance jobs on Spark, from the command line or spark-submit.

    tsproxy jobs rewrap --config tsproxy.toml --bucket tiered
    spark-submit --master spark://host:7077 tsproxy/jobs/cli.py verify --config tsproxy.toml --bucket tiered

Backend, key ring and transform settings come from the same configuration `tsproxy serve` reads
(TOML file, TSPROXY_* variables, the flags below). Exit status: 0 when all is well, 1 when the job found
problems (or, for rewrap, objects left on old KEKs), 2 for bad configuration or a missing 'spark' extra.

The jobs that write (rewrap, migrate, inventory --delete-orphans) are dry runs unless given --apply:
they print what they would do and change nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from tsproxy import config, defaults
from tsproxy.errors import ConfigError, KeyRingError, S3Error

CONFIG_FLAGS = (
    ("--backend", "backend", "file:///path or http(s)://host:port of the object store"),
    ("--backend-region", "backend_region", "region of the S3 backend"),
    ("--backend-bucket", "backend_bucket", "client buckets are mapped under this one backend bucket"),
    ("--backend-prefix", "backend_prefix", "key prefix inside --backend-bucket"),
    ("--key-ring", "key_ring", "key ring file; every executor must be able to read it at this path"),
    (
        "--chunk-size",
        "chunk_size",
        f"chunk size of objects migrate writes (default {config.show('chunk_size')})",
    ),
    ("--compression", "compression", "off, on or auto, for objects migrate writes"),
)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML config file, as for `tsproxy serve`")
    for flag, dest, text in CONFIG_FLAGS:
        p.add_argument(flag, dest=dest, help=text)
    p.add_argument(
        "--no-encryption",
        dest="encryption",
        action="store_const",
        const=False,
        help="the data is not encrypted: no key ring needed (migrate then writes it unencrypted)",
    )
    p.add_argument("--bucket", required=True, help="the client bucket to work on")
    p.add_argument("--prefix", default="", help="only keys under this prefix")
    p.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument(
        "--output",
        help="output directory (default ./tsproxy-jobs/<job>-<time>); on a cluster, "
        "a path every executor can write",
    )
    p.add_argument("--partitions", type=int, default=0, help="Spark partitions (default: from the listing)")
    p.add_argument(
        "--rate", type=float, default=0.0, help="backend requests a second per executor (0: no limit)"
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=defaults.JOB_CONCURRENCY,
        help=f"objects in flight per task (default {defaults.JOB_CONCURRENCY})",
    )
    p.add_argument("--progress-every", type=float, default=10.0, help="seconds between progress lines")
    p.add_argument(
        "--stale-after",
        help=f"multipart uploads idle this long are stale (default {defaults.JOB_STALE_AFTER / 3600:g}h)",
    )


def _apply_flag(p: argparse.ArgumentParser, text: str) -> None:
    p.add_argument("--apply", action="store_true", help=text)


def register(subparsers: Any) -> None:
    """Add the `jobs` command and its sub-commands to an argparse subparsers object."""
    jobs = subparsers.add_parser(
        "jobs",
        help="bulk maintenance on Spark: rewrap, verify, inventory, migrate",
        description="Bulk maintenance jobs on Spark, directly against the backend.",
    )
    sub = jobs.add_subparsers(dest="job", required=True, metavar="JOB")

    p = sub.add_parser(
        "rewrap", help="re-wrap every object's data key with the active KEK (no data re-upload)"
    )
    _common(p)
    _apply_flag(p, "rewrap (default: dry run, only count what would be rewrapped)")
    # Before --apply existed, rewrap wrote unless --dry-run; the flag is still accepted (and changes nothing).
    p.add_argument("--dry-run", action="store_true", help=argparse.SUPPRESS)
    p = sub.add_parser("verify", help="read every object and check every chunk and MD5")
    _common(p)
    p.add_argument(
        "--no-passthrough-md5",
        dest="passthrough_md5",
        action="store_false",
        help="do not read objects tsproxy did not write",
    )
    p = sub.add_parser("inventory", help="objects, bytes, KEKs per topic partition and prefix; orphans")
    _common(p)
    p.add_argument(
        "--live-topics", help="topic ids or names that still exist: comma list or @FILE (one a line)"
    )
    p.add_argument(
        "--layout-prefix", default="", help="key prefix of the tiered layout (the RSM's key.prefix)"
    )
    p.add_argument("--prefix-depth", type=int, default=1, help="path levels per prefix group (default 1)")
    p.add_argument(
        "--delete-orphans",
        action="store_true",
        help="delete orphans and stale uploads (dry run unless --apply)",
    )
    _apply_flag(p, "with --delete-orphans: really delete (default: dry run, list what would go)")
    p.add_argument("--force", action="store_true", help="delete even if every Kafka object is an orphan")
    p = sub.add_parser("migrate", help="turn objects tsproxy did not write into tsproxy objects, in place")
    _common(p)
    _apply_flag(p, "really migrate (default: dry run, list what would change)")
    p.set_defaults(concurrency=4)
    jobs.set_defaults(func=run)


def _live_topics(value: str | None) -> frozenset[str] | None:
    if value is None:
        return None
    if value.startswith("@"):
        try:
            with open(value[1:], encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise ConfigError(f"--live-topics: cannot read {value[1:]}: {e.strerror}") from None
        return frozenset(line.strip() for line in text.splitlines() if line.strip())
    return frozenset(v.strip() for v in value.split(",") if v.strip())


def options_from_args(args: argparse.Namespace) -> Any:
    """JobOptions from the configuration sources and the flags."""
    from tsproxy.jobs.options import JobOptions

    cli = {dest: getattr(args, dest, None) for _, dest, _ in CONFIG_FLAGS}
    cli["encryption"] = getattr(args, "encryption", None)
    cli["anonymous"] = True  # jobs serve nobody: the server's client credentials are not needed
    cfg = config.load(cli, config_file=args.config)
    try:
        stale_after = (
            defaults.JOB_STALE_AFTER if args.stale_after is None else config.parse_duration(args.stale_after)
        )
    except ValueError as e:
        raise ConfigError(f"--stale-after: {e}") from None
    try:
        return JobOptions.from_config(
            cfg,
            args.bucket,
            prefix=args.prefix,
            rate=args.rate,
            concurrency=args.concurrency,
            stale_after=stale_after,
        )
    except ValueError as e:
        raise ConfigError(f"jobs: {e}") from None


def run(args: argparse.Namespace) -> int:
    """Run the job the arguments name; print its summary; return the exit status."""
    from tsproxy.spark import missing_extra

    hint = missing_extra("jobs")
    if hint is not None:
        print(hint, file=sys.stderr)
        return 2
    from tsproxy.spark.session import spark_session

    try:
        if args.job == "rewrap" and args.apply and args.dry_run:
            raise ConfigError("rewrap: --apply and --dry-run contradict each other")
        if args.job == "inventory" and args.apply and not args.delete_orphans:
            raise ConfigError("inventory: --apply only applies with --delete-orphans")
        options = options_from_args(args)
        options.load_ring()  # a missing or broken key ring should fail before Spark starts
        spark = spark_session(args.master, app_name=f"tsproxy-{args.job}")
        common = {"output": args.output, "partitions": args.partitions, "progress_every": args.progress_every}
        if args.job == "rewrap":
            from tsproxy.jobs.rewrap import rewrap

            r = rewrap(spark, options, dry_run=not args.apply, **common)
            print(r.text())
            return 0 if r.ok or not args.apply else 1
        if args.job == "verify":
            from tsproxy.jobs.verify import verify

            v = verify(spark, options, check_passthrough=args.passthrough_md5, **common)
            print(v.text())
            return 0 if v.ok else 1
        if args.job == "inventory":
            from tsproxy.jobs.inventory import inventory

            i = inventory(
                spark,
                options,
                live_topics=_live_topics(args.live_topics),
                layout_prefix=args.layout_prefix,
                prefix_depth=args.prefix_depth,
                delete_orphans=args.delete_orphans,
                apply=args.apply,
                force=args.force,
                **common,
            )
            print(i.text())
            return 1 if i.cleanup is not None and i.cleanup.failures else 0
        if args.job == "migrate":
            from tsproxy.jobs.migrate import migrate

            m = migrate(spark, options, apply=args.apply, **common)
            print(m.text())
            return 0 if m.ok else 1
        raise ConfigError(f"unknown job {args.job!r}")
    except (ConfigError, KeyRingError) as e:
        print(f"tsproxy jobs: {e}", file=sys.stderr)
        return 2
    except S3Error as e:  # the driver's listing or cleanup could not reach the backend
        print(f"tsproxy jobs: backend: {e.code}: {e.message}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for `spark-submit tsproxy/jobs/cli.py <job> ...`."""
    parser = argparse.ArgumentParser(prog="tsproxy-jobs")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["jobs", *(sys.argv[1:] if argv is None else argv)])
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
