"""`tsproxy export`: tiered Kafka segments to Parquet, on Spark (local[*] by default, or any master).

The main CLI adds the command with `register(subparsers)`; `export_main.py` runs the same command
under spark-submit. Exit codes: 0 done, 1 the export failed (missing objects, wrong keys, corrupt
data: one line says which), 2 bad options or a missing 'spark' extra (one line says what to install).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tsproxy import defaults
from tsproxy.errors import ConfigError, TsproxyError

from .options import PARTITION_BY, OptionError, StoreOptions, parse_read_options

# Import-light: the main CLI loads this module for every command, so pyarrow and pyspark are only
# imported once an export actually runs.
if TYPE_CHECKING:
    from .export import ExportJob, ExportSummary


def add_export_arguments(p: argparse.ArgumentParser, *, with_master: bool = True) -> None:
    """The export's flags (shared by `tsproxy export` and the spark-submit entry)."""
    src = p.add_argument_group("source (where the tiered segments are)")
    src.add_argument("--endpoint", help="S3 endpoint: a tsproxy, or the backend itself with --key-ring")
    src.add_argument("--bucket", required=True, help="bucket holding the tiered segments")
    src.add_argument(
        "--prefix", default="", help="key prefix of the tiered storage (the plugin's key.prefix)"
    )
    src.add_argument("--layout", default="aiven", help="aiven (RemoteStorageManager keys) or logdir")
    topics = src.add_mutually_exclusive_group(required=True)
    topics.add_argument("--topics", help="comma-separated topics")
    topics.add_argument("--topic-pattern", help="regular expression of topics")
    src.add_argument("--region", default=defaults.REGION, help=f"(default {defaults.REGION})")
    src.add_argument("--access-key", help="access key (default: the standard AWS credential chain)")
    src.add_argument("--secret-key", help="secret key (with --access-key)")
    src.add_argument(
        "--key-ring", help="read directly from the backend and decode tsproxy objects with this ring"
    )
    src.add_argument(
        "--skip-corrupt", action="store_true", help="skip corrupt record batches instead of failing"
    )
    src.add_argument(
        "--isolation-level",
        choices=("read_uncommitted", "read_committed"),
        default="read_uncommitted",
        help="read_committed leaves out the records of aborted transactions (default read_uncommitted, "
        "like a Kafka consumer)",
    )
    out = p.add_argument_group("output")
    out.add_argument(
        "--output", required=True, help="a directory (local or cluster filesystem) or s3://bucket/prefix"
    )
    out.add_argument("--output-endpoint", help="S3 endpoint of an s3:// output (default: --endpoint)")
    out.add_argument("--output-region", help="region of an s3:// output (default: --region)")
    out.add_argument("--output-access-key", help="access key of an s3:// output (default: --access-key)")
    out.add_argument("--output-secret-key", help="secret key of an s3:// output (default: --secret-key)")
    out.add_argument(
        "--partition-by",
        choices=PARTITION_BY,
        default="partition",
        help="topic=/partition=/ directories, or hourly year=/month=/day=/hour=/ (UTC)",
    )
    out.add_argument("--full", action="store_true", help="export every segment again, not only new ones")
    out.add_argument("--compression-level", type=int, help="zstd level of the Parquet files")
    out.add_argument("--json", metavar="FILE", help="also write the summary as JSON to FILE")
    run = p.add_argument_group("spark")
    if with_master:
        run.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    run.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting (repeatable)"
    )
    run.add_argument("--progress-seconds", type=float, default=10.0, help="seconds between progress lines")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `export` command to the main CLI."""
    p = subparsers.add_parser(
        "export",
        help="export tiered Kafka segments to Parquet (on Spark)",
        description="Export tiered Kafka segments to Parquet files, one per segment, like the Kafka Connect "
        "S3 sink lays them out. Reruns replace files instead of duplicating them; only segments not yet "
        "exported are exported unless --full.",
    )
    add_export_arguments(p)
    p.set_defaults(func=run_command)


def job_from_args(args: argparse.Namespace) -> ExportJob:
    """The validated job; OptionError (a ConfigError) on bad flags."""
    from .export import ExportJob

    given = {
        "bucket": args.bucket, "prefix": args.prefix, "layout": args.layout, "region": args.region,
        "skipCorrupt": str(args.skip_corrupt), "endpoint": args.endpoint, "topics": args.topics,
        "topicPattern": args.topic_pattern, "accessKey": args.access_key, "secretKey": args.secret_key,
        "keyRing": args.key_ring, "isolationLevel": args.isolation_level,
    }  # fmt: skip
    source = {name: value for name, value in given.items() if value is not None}
    try:
        read = parse_read_options(source)
    except OptionError as e:
        raise OptionError(as_flags(str(e))) from None
    output_store = None
    if args.output.startswith("s3://"):
        access = args.output_access_key or read.store.access_key
        secret = args.output_secret_key or read.store.secret_key
        if (args.output_access_key is None) != (args.output_secret_key is None):
            raise OptionError("export: give both --output-access-key and --output-secret-key, or neither")
        output_store = StoreOptions(
            bucket=args.output[5:].partition("/")[0],
            endpoint=(args.output_endpoint or read.store.endpoint),
            region=args.output_region or read.store.region,
            access_key=access,
            secret_key=secret,
        )
    if args.compression_level is not None and not 1 <= args.compression_level <= 22:
        raise OptionError("export: --compression-level must be 1..22")
    return ExportJob(
        source=read,
        output=args.output,
        output_store=output_store,
        partition_by=args.partition_by,
        incremental=not args.full,
        compression_level=args.compression_level,
    )


def _conf(pairs: Sequence[str]) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise OptionError(f"export: --conf wants KEY=VALUE, not {pair!r}")
        conf[key.strip()] = value
    return conf


def run_command(args: argparse.Namespace, spark: Any | None = None) -> int:
    """Run the export described by parsed flags; prints progress to stderr and the summary to stdout."""
    from . import missing_extra

    hint = missing_extra("export")
    if hint is not None:
        print(hint, file=sys.stderr)
        return 2
    from .export import run_export

    job = job_from_args(args)
    conf = _conf(args.conf)
    own = spark is None
    if own:
        from .session import spark_session

        spark = spark_session(getattr(args, "master", None), "tsproxy export", conf, with_source=False)
    try:
        summary = run_export(job, spark, progress_seconds=args.progress_seconds)
    except ConfigError:
        raise
    except Exception as e:
        print(f"tsproxy export: failed: {explain(e)}", file=sys.stderr)
        return 1
    finally:
        if own and spark is not None:
            spark.stop()
    _report(summary, args.json)
    return 0


def _report(summary: ExportSummary, json_path: str | None) -> None:
    print(summary.table(), flush=True)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(summary.as_dict(), f, indent=2)
            f.write("\n")


# The last line of a Python traceback that names one of our errors, inside a Spark error's text.
_OUR_ERROR = re.compile(r"^(tsproxy\.[\w.]+): (.+)$", re.MULTILINE)


# The data source's option names that its messages use, as this command's flags (the export passes
# its flags to the source as these options).
OPTION_FLAGS = {
    "accessKey": "--access-key",
    "secretKey": "--secret-key",
    "keyRing": "--key-ring",
    "skipCorrupt": "--skip-corrupt",
    "topicPattern": "--topic-pattern",
    "isolationLevel": "--isolation-level",
}
_OPTION_NAME = re.compile(r"'?\b(" + "|".join(OPTION_FLAGS) + r")\b'?")


def explain(e: BaseException) -> str:
    """One line for an export failure: our own error's message, even from inside a Spark task failure,
    naming the command's flags where the data source's message names its options."""
    if isinstance(e, TsproxyError):
        line = f"{type(e).__name__}: {e}"
    elif found := _OUR_ERROR.findall(str(e)):
        name, message = found[-1]
        line = f"{name.rsplit('.', 1)[-1]}: {message.strip()}"
    else:
        first = str(e).strip().splitlines()
        line = f"{type(e).__name__}: {first[0] if first else ''}"
    return as_flags(line)


def as_flags(message: str) -> str:
    """A data source message with its option names replaced by the export's flags."""
    return _OPTION_NAME.sub(lambda m: OPTION_FLAGS[m.group(1)], message)


def submit_main(argv: Sequence[str] | None = None) -> int:
    """Entry for spark-submit: the master and resources come from spark-submit itself."""
    parser = argparse.ArgumentParser(prog="export_main.py", description="tsproxy export under spark-submit")
    add_export_arguments(parser, with_master=False)
    args = parser.parse_args(argv)
    try:
        return run_command(args)
    except ConfigError as e:
        print(f"tsproxy export: {e}", file=sys.stderr)
        return 2


__all__ = [
    "add_export_arguments",
    "explain",
    "job_from_args",
    "register",
    "run_command",
    "submit_main",
]
