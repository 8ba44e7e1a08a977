"""One validated settings object, from defaults < TOML file < environment < command line.

`load` builds a `Config` once; what the parts of tsproxy need derives from it (`transform_settings()`,
`backend_settings()`, `cache_settings()`), and the jobs hold one too. Nothing else in tsproxy reads
environment variables. Every bad value stops startup with one line that says which setting, where it
came from, and what is wrong. Default values live in tsproxy/defaults.py.

Adding a setting: its default in defaults.py; a field of `Config` with
`metadata=parsed_by(parser, check)` (that alone makes its TOML key and its TSPROXY_<NAME> variable);
a flag in cli.py where one is wanted; a row in docs/CONFIG.md (tests/config holds the table to the
fields). A rule that involves several settings goes in `_validate`.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tsproxy import defaults
from tsproxy.errors import ConfigError
from tsproxy.format.settings import (
    COMPRESSION_MODES,
    MAX_CHUNK_SIZE,
    MAX_LEVEL,
    MIN_CHUNK_SIZE,
    MIN_LEVEL,
    CompressionMode,
    TransformSettings,
)

if TYPE_CHECKING:
    from tsproxy.cache.chunks import DirectIo
    from tsproxy.store.base import Backend
    from tsproxy.store.observe import OnRequest

ENV_PREFIX = "TSPROXY_"
DEV_ACCESS_KEY = "tsproxy-dev"
DEV_SECRET_KEY = "tsproxy-dev-secret-key"
# TSPROXY_* variables that are not settings: the config file, the client credentials, and the endpoint
# the examples in deploy/examples talk to (a client-side variable that may share a shell with serve).
_OTHER_ENV = frozenset({"CONFIG", "ACCESS_KEY", "SECRET_KEY", "ENDPOINT"})

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1 << 30,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1 << 40,
}
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}


def parse_size(value: Any) -> int:
    """'4MiB', '10GB', '65536' or an int -> bytes."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 4MiB")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"{value!r} is not a size (examples: 4MiB, 512KiB, 10GiB)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def parse_duration(value: Any) -> float:
    """'30s', '500ms', '2m' or a number of seconds -> seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|)\s*", str(value))
    if not m:
        raise ValueError(f"{value!r} is not a duration (examples: 30s, 500ms, 2m)")
    return float(m.group(1)) * _DURATION_UNITS[m.group(2)]


def parse_hostport(value: Any) -> tuple[str, int]:
    """'HOST:PORT', ':PORT' or '[::1]:PORT' -> (host, port)."""
    m = re.fullmatch(r"\[?([^\]]*?)\]?:(\d{1,5})", str(value).strip())
    if not m or not 0 <= int(m.group(2)) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT")
    return (m.group(1) or "0.0.0.0", int(m.group(2)))


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{value!r} is not a boolean (true/false)")


def parse_direct_io(value: Any) -> DirectIo:
    """`cache_direct_io`: auto, or a boolean."""
    if str(value).strip().lower() == "auto":
        return "auto"
    try:
        return parse_bool(value)
    except ValueError:
        raise ValueError(f"{value!r} is not auto, true or false") from None


def show_size(size: int) -> str:
    """Bytes in the largest binary unit that holds them whole: 4194304 -> '4MiB'."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def show_duration(seconds: float) -> str:
    """Seconds in the largest unit that holds them whole: 900 -> '15m'."""
    for unit, length in (("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds and seconds % length == 0:
            return f"{seconds / length:g}{unit}"
    return f"{seconds * 1000:g}ms"


def _parse_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value)
    return tuple(v.strip() for v in str(value).split(",") if v.strip())


def _is_off(value: Any) -> bool:
    return str(value).strip().lower() in ("", "off", "none")


def _parse_optional_hostport(value: Any) -> tuple[str, int] | None:
    return None if _is_off(value) else parse_hostport(value)


def _parse_path(value: Any) -> Path:
    return Path(str(value)).expanduser()


def _parse_optional_path(value: Any) -> Path | None:
    return None if _is_off(value) else _parse_path(value)


# A check takes a parsed value and returns what is wrong with it, or None.
Check = Callable[[Any], str | None]


def _between(low: float, high: float, why: str) -> Check:
    return lambda v: None if low <= v <= high else why


def _at_least(low: float, why: str) -> Check:
    return lambda v: None if v >= low else why


def _check_backend_url(url: str) -> str | None:
    from tsproxy.store import kind_of, url_forms  # the backends register their kinds as they load

    return None if kind_of(url) is not None else f"{url!r} is not {url_forms()}"


_check_part_size = _between(5 << 20, 5 << 30, "must be between 5MiB and 5GiB (S3 part size limits)")
_check_key_ring_check = _at_least(0, "must not be negative (0 turns the periodic check off)")
# The transform settings' own bounds (TransformSettings checks them too), said in config terms.
_check_chunk_size = _between(MIN_CHUNK_SIZE, MAX_CHUNK_SIZE, "must be between 64KiB and 64MiB")
_check_compression_level = _between(MIN_LEVEL, MAX_LEVEL, f"must be between {MIN_LEVEL} and {MAX_LEVEL}")


def _check_compression(mode: str) -> str | None:
    return None if mode in COMPRESSION_MODES else f"{mode!r} is not one of off, on, auto"


UPLOAD_RECORD_MODES = ("deferred", "eager")


def _check_upload_records(mode: str) -> str | None:
    return None if mode in UPLOAD_RECORD_MODES else f"{mode!r} is not one of deferred, eager"


def _check_log_level(level: str) -> str | None:
    if level.lower() in ("debug", "info", "warning", "error"):
        return None
    return "must be debug, info, warning or error"


def parsed_by(parse: Callable[[Any], Any], check: Check | None = None) -> dict[str, Any]:
    """The metadata that makes a field of `Config` a setting, read from TOML, TSPROXY_<NAME> and flags.

    `parse` turns text (or a TOML value) into the field's value; `check` (optional) says what is wrong
    with a parsed value on its own, and every Config runs it.
    """
    return {"parse": parse, "check": check}


def is_local_url(url: str) -> bool:
    """Whether a backend URL names an embedded backend (the local directory, file:)."""
    from tsproxy.store import kind_of

    kind = kind_of(url)
    return kind is not None and kind.embedded


def local_root(url: str) -> Path:
    """The root directory of a file: backend ('file://./x' is relative to the working directory)."""
    rest = url[len("file://") :] if url.startswith("file://") else url[5:]
    return Path(rest).expanduser()


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str = field(repr=False)


@dataclass(frozen=True)
class BackendSettings:
    """How to reach the object store behind tsproxy, and where client buckets live in it."""

    url: str  # a file: URL names an absolute directory here
    region: str | None = None
    path_style: bool = defaults.BACKEND_PATH_STYLE
    part_size: int = defaults.BACKEND_PART_SIZE
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    max_attempts: int = defaults.BACKEND_MAX_ATTEMPTS
    connect_timeout: float = defaults.BACKEND_CONNECT_TIMEOUT
    read_timeout: float = defaults.BACKEND_READ_TIMEOUT
    bucket: str | None = None  # every client bucket under this one backend bucket ...
    prefix: str = ""  # ... at <prefix><client bucket>/

    @property
    def local(self) -> bool:
        return is_local_url(self.url)

    def open(self, on_request: OnRequest | None = None) -> Backend:
        """A backend (not yet started) for these settings: its kind takes the settings it names."""
        from tsproxy.store import kind_of

        kind = kind_of(self.url)
        if kind is None:
            raise ValueError(f"no backend takes {self.url!r}")
        options = {name: getattr(self, name) for name in kind.options}
        return kind.open(self.url, on_request=on_request, **options)


@dataclass(frozen=True)
class CacheSettings:
    """The chunk cache on disk (directory None: none), the hot chunks in memory and prefetch."""

    directory: Path | None
    size: int
    encrypt: bool
    direct_io: DirectIo
    memory_bytes: int
    prefetch_bytes: int


@dataclass(frozen=True)
class Config:
    """Every setting of `tsproxy serve`, validated; see docs/CONFIG.md and `tsproxy serve --help`.

    Built by `load`; building one directly (`Config(...)`, `replace`) validates it too.
    """

    listen: tuple[str, int] = field(default=defaults.LISTEN, metadata=parsed_by(parse_hostport))
    metrics_listen: tuple[str, int] | None = field(
        default=defaults.METRICS_LISTEN, metadata=parsed_by(_parse_optional_hostport)
    )
    backend: str = field(default=defaults.BACKEND, metadata=parsed_by(str, _check_backend_url))
    backend_region: str | None = field(default=None, metadata=parsed_by(str))
    backend_path_style: bool = field(default=defaults.BACKEND_PATH_STYLE, metadata=parsed_by(parse_bool))
    backend_part_size: int = field(
        default=defaults.BACKEND_PART_SIZE, metadata=parsed_by(parse_size, _check_part_size)
    )
    backend_access_key: str | None = field(default=None, metadata=parsed_by(str))
    backend_secret_key: str | None = field(default=None, repr=False, metadata=parsed_by(str))
    backend_bucket: str | None = field(default=None, metadata=parsed_by(str))
    backend_prefix: str = field(default="", metadata=parsed_by(str))
    backend_max_attempts: int = field(
        default=defaults.BACKEND_MAX_ATTEMPTS, metadata=parsed_by(int, _at_least(1, "must be at least 1"))
    )
    # per attempt: a stalled store costs at most this much before the attempt is retried or given up
    backend_connect_timeout: float = field(
        default=defaults.BACKEND_CONNECT_TIMEOUT,
        metadata=parsed_by(parse_duration, _between(0.1, 600, "must be between 100ms and 10m")),
    )
    backend_read_timeout: float = field(
        default=defaults.BACKEND_READ_TIMEOUT,
        metadata=parsed_by(parse_duration, _between(0.1, 3600, "must be between 100ms and 1h")),
    )
    key_ring: Path | None = field(default=None, metadata=parsed_by(_parse_path))
    # seconds between looks at the key ring file for changes; 0: SIGHUP only
    key_ring_check: float = field(
        default=defaults.KEY_RING_CHECK, metadata=parsed_by(parse_duration, _check_key_ring_check)
    )
    # accept a key ring file that group or others may access (see docs/OPERATIONS.md)
    allow_insecure_key_ring: bool = field(
        default=defaults.ALLOW_INSECURE_KEY_RING, metadata=parsed_by(parse_bool)
    )
    chunk_size: int = field(default=defaults.CHUNK_SIZE, metadata=parsed_by(parse_size, _check_chunk_size))
    compression: CompressionMode = field(
        default=defaults.COMPRESSION, metadata=parsed_by(str, _check_compression)
    )
    compression_level: int = field(
        default=defaults.COMPRESSION_LEVEL, metadata=parsed_by(int, _check_compression_level)
    )
    encryption: bool = field(default=defaults.ENCRYPTION, metadata=parsed_by(parse_bool))
    # the stored format version new objects get (docs/FORMAT.md); 1 while some reader is older
    format_version: int = field(
        default=defaults.FORMAT_VERSION, metadata=parsed_by(int, _between(1, 2, "must be 1 or 2"))
    )
    cache_dir: Path | None = field(default=Path(defaults.CACHE_DIR), metadata=parsed_by(_parse_optional_path))
    cache_size: int = field(default=defaults.CACHE_SIZE, metadata=parsed_by(parse_size))
    cache_encrypt: bool = field(default=defaults.CACHE_ENCRYPT, metadata=parsed_by(parse_bool))
    # entry files written with O_DIRECT (cache.chunks): auto (a forward reader's chunks), true (all) or
    # false (none); buffered where the file system refuses it
    cache_direct_io: DirectIo = field(default=defaults.CACHE_DIRECT_IO, metadata=parsed_by(parse_direct_io))
    # decoded chunks kept in memory in front of the disk cache
    memory_cache_size: int = field(
        default=defaults.MEMORY_CACHE_SIZE,
        metadata=parsed_by(parse_size, _between(0, 4 << 30, "must be between 0 and 4GiB")),
    )
    # glibc's mmap threshold, fixed at start (tsproxy/memory.py); 0 leaves glibc's own
    malloc_mmap_threshold: int = field(
        default=defaults.MALLOC_MMAP_THRESHOLD,
        metadata=parsed_by(parse_size, _between(0, 32 << 20, "must be between 0 and 32MiB")),
    )
    # free memory glibc keeps at the top of a heap instead of giving it back (tsproxy/memory.py); 0: glibc's
    malloc_trim_threshold: int = field(
        default=defaults.MALLOC_TRIM_THRESHOLD,
        metadata=parsed_by(parse_size, _between(0, 1 << 30, "must be between 0 and 1GiB")),
    )
    # the most heaps glibc makes for threads (tsproxy/memory.py); 0: glibc's own
    malloc_arenas: int = field(
        default=defaults.MALLOC_ARENAS,
        metadata=parsed_by(int, _between(0, 1024, "must be between 0 and 1024")),
    )
    # seconds without a client request before the heaps' free memory goes back (tsproxy/memory.py); 0: never
    malloc_idle_release: float = field(
        default=defaults.MALLOC_IDLE_RELEASE,
        metadata=parsed_by(parse_duration, _at_least(0, "must not be negative (0 turns it off)")),
    )
    prefetch: int = field(
        default=defaults.PREFETCH,
        metadata=parsed_by(parse_size, _between(0, 1 << 30, "must be at most 1GiB")),
    )
    metadata_ttl: float = field(default=defaults.METADATA_TTL, metadata=parsed_by(parse_duration))
    metadata_stale_if_error: float = field(
        default=defaults.METADATA_STALE_IF_ERROR, metadata=parsed_by(parse_duration)
    )
    # Not a plain setting: [[credentials]] tables, or TSPROXY_ACCESS_KEY/TSPROXY_SECRET_KEY.
    credentials: tuple[Credentials, ...] = ()
    anonymous: bool = field(default=defaults.ANONYMOUS, metadata=parsed_by(parse_bool))
    region: str = field(default=defaults.REGION, metadata=parsed_by(str))
    virtual_host_suffixes: tuple[str, ...] = field(default=(), metadata=parsed_by(_parse_list))
    log_level: str = field(default=defaults.LOG_LEVEL, metadata=parsed_by(str, _check_log_level))
    shutdown_grace: float = field(default=defaults.SHUTDOWN_GRACE, metadata=parsed_by(parse_duration))
    # 0: one per core, at least 2
    transform_threads: int = field(default=defaults.TRANSFORM_THREADS, metadata=parsed_by(int))
    max_clock_skew: float = field(default=defaults.MAX_CLOCK_SKEW, metadata=parsed_by(parse_duration))
    header_timeout: float = field(default=defaults.HEADER_TIMEOUT, metadata=parsed_by(parse_duration))
    body_idle_timeout: float = field(default=defaults.BODY_IDLE_TIMEOUT, metadata=parsed_by(parse_duration))
    max_connections: int = field(default=defaults.MAX_CONNECTIONS, metadata=parsed_by(int))
    access_log: bool = field(default=defaults.ACCESS_LOG, metadata=parsed_by(parse_bool))
    # seconds between backend probes; 0: only the one at start
    backend_check: float = field(
        default=defaults.BACKEND_CHECK,
        metadata=parsed_by(
            parse_duration, _at_least(0, "must not be negative (0 probes the backend only at start)")
        ),
    )
    # how long an upload may sit untouched before the janitor removes what it left in the backend
    leftover_age: float = field(
        default=defaults.LEFTOVER_AGE,
        metadata=parsed_by(
            parse_duration, _at_least(1, "must be at least 1s (backend times are in seconds)")
        ),
    )
    # seconds between janitor runs (one runs at start); 0: no janitor
    janitor_interval: float = field(
        default=defaults.JANITOR_INTERVAL,
        metadata=parsed_by(parse_duration, _at_least(0, "must not be negative (0 turns the janitor off)")),
    )
    # when the record of a multipart part is written: "deferred" (once the upload is quiet) or "eager"
    upload_records: str = field(
        default=defaults.UPLOAD_RECORDS, metadata=parsed_by(str, _check_upload_records)
    )
    # seconds an upload must be quiet (no part arriving) before its deferred part records are written
    upload_record_delay: float = field(
        default=defaults.UPLOAD_RECORD_DELAY,
        metadata=parsed_by(parse_duration, _between(0.01, 600, "must be between 10ms and 10m")),
    )
    # Set by `load` when the embedded defaults are in use (dev key ring and credentials).
    dev_mode: bool = False
    # Set by `load` when no key ring was named and the dev ring next to the data directory is used;
    # only then may tsproxy create a key ring file.
    dev_key_ring: bool = False
    # Where each setting came from ("--chunk-size", "$TSPROXY_CHUNK_SIZE", a file), for error messages.
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        _validate(self)

    def origin(self, name: str) -> str:
        """Where setting `name` came from: a flag, an environment variable, a file, or "default"."""
        return self.sources.get(name, "default")

    @property
    def local_backend(self) -> bool:
        return is_local_url(self.backend)

    def backend_path(self) -> Path:
        """The root directory of a file:// backend ('file://./x' is relative to the working directory)."""
        return local_root(self.backend)

    def replace(self, **changes: Any) -> Config:
        """A copy with some values changed (parsed values, not text), validated again."""
        current = {f.name: getattr(self, f.name) for f in fields(self)}
        current.update(changes)
        return Config(**current)

    def transform_settings(self) -> TransformSettings:
        """How new objects are chunked, compressed and encrypted."""
        return TransformSettings(
            chunk_size=self.chunk_size,
            compression=self.compression,
            level=self.compression_level,
            encryption=self.encryption,
            format_version=self.format_version,
        )

    def backend_settings(self) -> BackendSettings:
        """How to reach the backend; a relative file: URL is resolved against the working directory."""
        url = self.backend
        if self.local_backend:
            url = "file://" + str(self.backend_path().resolve())
        return BackendSettings(
            url=url,
            region=self.backend_region,
            path_style=self.backend_path_style,
            part_size=self.backend_part_size,
            access_key=self.backend_access_key,
            secret_key=self.backend_secret_key,
            max_attempts=self.backend_max_attempts,
            connect_timeout=self.backend_connect_timeout,
            read_timeout=self.backend_read_timeout,
            bucket=self.backend_bucket,
            prefix=self.backend_prefix,
        )

    def cache_settings(self) -> CacheSettings:
        """The chunk cache, the in-memory hot chunks and prefetch."""
        return CacheSettings(
            directory=self.cache_dir,
            size=self.cache_size,
            encrypt=self.cache_encrypt,
            direct_io=self.cache_direct_io,
            memory_bytes=self.memory_cache_size,
            prefetch_bytes=self.prefetch,
        )


# The settings: every field of Config with a parser (credentials, dev_mode, dev_key_ring and sources
# are not).
_PARSERS: dict[str, Callable[[Any], Any]] = {
    f.name: f.metadata["parse"] for f in fields(Config) if "parse" in f.metadata
}
_CHECKS: dict[str, Check] = {
    f.name: f.metadata["check"] for f in fields(Config) if f.metadata.get("check") is not None
}
SETTINGS = tuple(_PARSERS)
DEFAULTS: Mapping[str, Any] = {f.name: f.default for f in fields(Config) if f.name in _PARSERS}


def show(name: str, value: Any = None) -> str:
    """A setting's value (its default when not given) as one writes it in TOML or a flag."""
    if value is None:
        value = DEFAULTS[name]
    parse = _PARSERS[name]
    if value is None:
        return "unset"
    if parse is parse_size:
        return show_size(value)
    if parse is parse_duration:
        return show_duration(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if parse in (parse_hostport, _parse_optional_hostport):
        return f"{value[0]}:{value[1]}"
    if isinstance(value, tuple):
        return ",".join(value) or "none"
    if isinstance(value, Path) and not value.is_absolute():
        return f"./{value}"
    return str(value)


def _validate(cfg: Config) -> None:
    def fail(name: str, why: str) -> None:
        raise ConfigError(f"config: {name} ({cfg.sources.get(name, 'default')}): {why}")

    for name, check in _CHECKS.items():
        why = check(getattr(cfg, name))
        if why is not None:
            fail(name, why)
    # Rules that involve more than one setting.
    if cfg.cache_dir is not None and cfg.cache_size < 4 * cfg.chunk_size:
        fail("cache_size", f"must hold at least 4 chunks ({4 * cfg.chunk_size} bytes)")
    if bool(cfg.backend_access_key) != bool(cfg.backend_secret_key):
        fail("backend_access_key", "backend_access_key and backend_secret_key go together")
    if cfg.backend_prefix and not cfg.backend_bucket:
        fail("backend_prefix", "needs backend_bucket")
    if cfg.listen == cfg.metrics_listen:
        fail("metrics_listen", "must differ from listen")
    for name in ("header_timeout", "body_idle_timeout"):
        if getattr(cfg, name) <= 0:
            fail(name, "must be greater than 0")
    if cfg.max_connections < 1:
        fail("max_connections", "must be at least 1")
    if cfg.upload_record_delay >= cfg.leftover_age:
        # else the janitor of another instance could take a quiet upload whose records are still held
        fail("upload_record_delay", f"must be shorter than leftover_age ({cfg.leftover_age:g}s)")
    for c in cfg.credentials:
        if not c.access_key or not c.secret_key:
            fail("credentials", "every credential needs access_key and secret_key")


def _validate_backend_url(url: str, origin: str) -> None:
    """What the backend's kind finds wrong with its URL (an S3 endpoint with a path, say)."""
    from tsproxy.store import kind_of

    kind = kind_of(url)
    why = kind.check(url) if kind is not None else None
    if why is not None:
        raise ConfigError(f"config: backend ({origin}): {why}")


# Paths a config file names, which are relative to the file's directory (as one reads the file).
_FILE_RELATIVE = frozenset({"key_ring"})


def _relative_to(directory: Path, value: str) -> str:
    """A path from a config file: relative ones joined to the file's directory ('ring.json' stays
    'ring.json' for a file in the working directory)."""
    path = Path(value).expanduser()
    return value if path.is_absolute() else str(directory / path)


def _unknown_environment(env: Mapping[str, str]) -> None:
    """A misspelt TSPROXY_* variable is an error, as an unknown key in the TOML file is."""
    known = {name.upper() for name in _PARSERS} | _OTHER_ENV
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX):
            continue
        name = var[len(ENV_PREFIX) :]
        if name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f" (did you mean ${ENV_PREFIX}{close[0]}?)" if close else ""
        raise ConfigError(f"config: unknown setting {var!r} in the environment{hint}")


def load(
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | os.PathLike[str] | None = None,
) -> Config:
    """Build the Config: defaults, then the TOML file, then TSPROXY_* variables, then command-line values.

    `cli` holds only the options the user gave (None values are ignored). `env` defaults to the
    process environment. Raises ConfigError.
    """
    env = dict(os.environ if env is None else env)
    _unknown_environment(env)
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    credentials: list[Credentials] = []

    path = config_file or env.get(ENV_PREFIX + "CONFIG")
    if path:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as e:
            raise ConfigError(f"config: cannot read config file {path}: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config: {path} is not valid TOML: {e}") from None
        for name, raw in data.items():
            if name == "credentials":
                if not isinstance(raw, list) or not all(isinstance(c, dict) for c in raw):
                    raise ConfigError(f"config: credentials ({path}): must be [[credentials]] tables")
                for c in raw:
                    credentials.append(
                        Credentials(str(c.get("access_key", "")), str(c.get("secret_key", "")))
                    )
                where["credentials"] = str(path)
                continue
            if name not in _PARSERS:
                close = difflib.get_close_matches(name, [*sorted(_PARSERS), "credentials"], n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"config: unknown setting {name!r} in {path}{hint}")
            if name in _FILE_RELATIVE and isinstance(raw, str) and not _is_off(raw):
                raw = _relative_to(Path(path).parent, raw)
            values[name], where[name] = raw, str(path)

    for name in _PARSERS:
        if ENV_PREFIX + name.upper() in env:
            values[name], where[name] = env[ENV_PREFIX + name.upper()], f"${ENV_PREFIX}{name.upper()}"
    if env.get(ENV_PREFIX + "ACCESS_KEY") or env.get(ENV_PREFIX + "SECRET_KEY"):
        credentials.insert(
            0, Credentials(env.get(ENV_PREFIX + "ACCESS_KEY", ""), env.get(ENV_PREFIX + "SECRET_KEY", ""))
        )
        where["credentials"] = f"${ENV_PREFIX}ACCESS_KEY/${ENV_PREFIX}SECRET_KEY"

    for name, raw in (cli or {}).items():
        if raw is not None:
            values[name], where[name] = raw, "--" + name.replace("_", "-")

    parsed: dict[str, Any] = {}
    for name, raw in values.items():
        try:
            parsed[name] = _PARSERS[name](raw)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"config: {name} ({where[name]}): {e}") from None
    parsed["credentials"] = tuple(credentials)
    _validate_backend_url(str(parsed.get("backend", DEFAULTS["backend"])), where.get("backend", "default"))
    parsed.update(_development_defaults(parsed))
    return Config(**parsed, sources=where)


def _development_defaults(parsed: Mapping[str, Any]) -> dict[str, Any]:
    """Dev credentials and a dev key ring, allowed only with the embedded file:// backend."""

    def value(name: str) -> Any:
        return parsed.get(name, DEFAULTS[name])

    out: dict[str, Any] = {}
    backend = value("backend")
    if not parsed["credentials"] and not value("anonymous"):
        if not is_local_url(backend):
            raise ConfigError(
                "config: credentials: set TSPROXY_ACCESS_KEY/TSPROXY_SECRET_KEY or [[credentials]] "
                "(dev credentials are only used with the embedded file:// backend)"
            )
        out["credentials"] = (Credentials(DEV_ACCESS_KEY, DEV_SECRET_KEY),)
    if value("encryption") and value("key_ring") is None:
        if not is_local_url(backend):
            raise ConfigError(
                "config: key_ring: required with encryption on a remote backend (make one with "
                "`tsproxy keys init --key-ring FILE`, or set encryption = false)"
            )
        root = local_root(backend)
        out["key_ring"] = root.parent / f"{root.name}-dev-keyring.json"
        out["dev_key_ring"] = True
    out["dev_mode"] = bool(out)
    return out
