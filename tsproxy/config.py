"""One validated configuration object, from defaults < TOML file < environment < command line.

Nothing else in tsproxy reads environment variables. Every bad value stops startup with one line that
says which setting, where it came from, and what is wrong.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tsproxy.errors import ConfigError

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


def _parse_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value)
    return tuple(v.strip() for v in str(value).split(",") if v.strip())


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str = field(repr=False)


@dataclass(frozen=True)
class Config:
    """Every setting of `tsproxy serve`; see docs/CONFIG.md and `tsproxy serve --help`."""

    listen: tuple[str, int] = ("127.0.0.1", 9000)
    metrics_listen: tuple[str, int] | None = ("127.0.0.1", 9102)
    backend: str = "file://./tsproxy-data"
    backend_region: str | None = None
    backend_path_style: bool = True
    backend_part_size: int = 25 << 20
    backend_access_key: str | None = None
    backend_secret_key: str | None = field(default=None, repr=False)
    backend_bucket: str | None = None
    backend_prefix: str = ""
    backend_max_attempts: int = 5
    key_ring: Path | None = None
    key_ring_check: float = 30.0  # seconds between looks at the key ring file for changes; 0: SIGHUP only
    chunk_size: int = 4 << 20
    compression: str = "auto"
    compression_level: int = 1
    encryption: bool = True
    cache_dir: Path | None = Path("./tsproxy-cache")
    cache_size: int = 1 << 30
    cache_encrypt: bool = False
    memory_cache_size: int = 32 << 20  # decoded chunks kept in memory in front of the disk cache
    prefetch: int = 16 << 20
    metadata_ttl: float = 5.0
    credentials: tuple[Credentials, ...] = ()
    anonymous: bool = False
    region: str = "us-east-1"
    virtual_host_suffixes: tuple[str, ...] = ()
    log_level: str = "info"
    shutdown_grace: float = 30.0
    transform_threads: int = 0  # 0: one per core, at least 2
    max_clock_skew: float = 900.0
    access_log: bool = True  # one JSON line per client request (logger tsproxy.access)
    backend_check: float = 10.0  # seconds between backend probes; 0: only the one at start
    # Set by `load` when the embedded defaults are in use (dev key ring and credentials).
    dev_mode: bool = False
    # Set by `load` when no key ring was named and the dev ring next to the data directory is used;
    # only then may tsproxy create a key ring file.
    dev_key_ring: bool = False
    # Where each setting came from ("--chunk-size", "$TSPROXY_CACHE_DIR", a TOML file), for messages.
    origins: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def origin(self, name: str) -> str:
        """Where setting `name` came from: a flag, an environment variable, a file, or "default"."""
        return self.origins.get(name, "default")

    @property
    def local_backend(self) -> bool:
        return self.backend.startswith("file:")

    def backend_path(self) -> Path:
        """The root directory of a file:// backend ('file://./x' is relative to the working directory)."""
        rest = self.backend[len("file://") :] if self.backend.startswith("file://") else self.backend[5:]
        return Path(rest).expanduser()


# setting -> (parser, cli flag or None)
_PARSERS: dict[str, Any] = {
    "listen": parse_hostport,
    "metrics_listen": lambda v: None if str(v).strip().lower() in ("", "off", "none") else parse_hostport(v),
    "backend": str,
    "backend_region": str,
    "backend_path_style": parse_bool,
    "backend_part_size": parse_size,
    "backend_access_key": str,
    "backend_secret_key": str,
    "backend_bucket": str,
    "backend_prefix": str,
    "backend_max_attempts": int,
    "key_ring": lambda v: Path(str(v)).expanduser(),
    "key_ring_check": parse_duration,
    "chunk_size": parse_size,
    "compression": str,
    "compression_level": int,
    "encryption": parse_bool,
    "cache_dir": lambda v: (
        None if str(v).strip().lower() in ("", "off", "none") else Path(str(v)).expanduser()
    ),
    "cache_size": parse_size,
    "cache_encrypt": parse_bool,
    "memory_cache_size": parse_size,
    "prefetch": parse_size,
    "metadata_ttl": parse_duration,
    "anonymous": parse_bool,
    "region": str,
    "virtual_host_suffixes": _parse_list,
    "log_level": str,
    "shutdown_grace": parse_duration,
    "transform_threads": int,
    "max_clock_skew": parse_duration,
    "access_log": parse_bool,
    "backend_check": parse_duration,
}
SETTINGS = tuple(_PARSERS)


def _validate(cfg: Config, where: Mapping[str, str]) -> None:
    def fail(name: str, why: str) -> None:
        raise ConfigError(f"config: {name} ({where.get(name, 'default')}): {why}")

    if not (64 << 10) <= cfg.chunk_size <= (64 << 20):
        fail("chunk_size", "must be between 64KiB and 64MiB")
    if cfg.compression not in ("off", "on", "auto"):
        fail("compression", f"{cfg.compression!r} is not one of off, on, auto")
    if not 1 <= cfg.compression_level <= 22:
        fail("compression_level", "must be between 1 and 22")
    if not cfg.backend.startswith(("file:", "http://", "https://")):
        fail("backend", f"{cfg.backend!r} is not file:///path or http(s)://host:port")
    if cfg.backend_part_size < (5 << 20) or cfg.backend_part_size > (5 << 30):
        fail("backend_part_size", "must be between 5MiB and 5GiB (S3 part size limits)")
    if cfg.backend_check < 0:
        fail("backend_check", "must not be negative (0 probes the backend only at start)")
    if cfg.key_ring_check < 0:
        fail("key_ring_check", "must not be negative (0 turns the periodic check off)")
    if cfg.backend_max_attempts < 1:
        fail("backend_max_attempts", "must be at least 1")
    if not 0 <= cfg.memory_cache_size <= (4 << 30):
        fail("memory_cache_size", "must be between 0 and 4GiB")
    if cfg.prefetch > (1 << 30):
        fail("prefetch", "must be at most 1GiB")
    if cfg.cache_dir is not None and cfg.cache_size < 4 * cfg.chunk_size:
        fail("cache_size", f"must hold at least 4 chunks ({4 * cfg.chunk_size} bytes)")
    if cfg.log_level.lower() not in ("debug", "info", "warning", "error"):
        fail("log_level", "must be debug, info, warning or error")
    if bool(cfg.backend_access_key) != bool(cfg.backend_secret_key):
        fail("backend_access_key", "backend_access_key and backend_secret_key go together")
    if cfg.backend_prefix and not cfg.backend_bucket:
        fail("backend_prefix", "needs backend_bucket")
    if cfg.listen == cfg.metrics_listen:
        fail("metrics_listen", "must differ from listen")
    for c in cfg.credentials:
        if not c.access_key or not c.secret_key:
            fail("credentials", "every credential needs access_key and secret_key")


def _validate_backend_url(url: str, origin: str) -> None:
    """An S3 endpoint is scheme://host[:port]; a path there usually is a bucket put in the wrong place."""

    def fail(name: str, why: str) -> None:
        raise ConfigError(f"config: {name} ({origin}): {why}")

    if not url.startswith(("http://", "https://")):
        return
    rest = url.split("://", 1)[1]
    host, _, path = rest.partition("/")
    if not host:
        fail("backend", f"{url!r} names no host")
    path = path.strip("/")
    if path:
        first = path.split("/", 1)[0]
        fail(
            "backend",
            f"{url!r} has a path ('/{path}'); the backend URL is scheme://host:port only. To keep every "
            f"client bucket in one backend bucket, set backend_bucket = {first!r} "
            f"(--backend-bucket {first})",
        )
    if "?" in rest or "#" in rest:
        fail("backend", f"{url!r} has a query or fragment; the backend URL is scheme://host:port only")


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

    `cli` holds only the options the user gave (None values are ignored). Raises ConfigError.
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
                raise ConfigError(f"config: unknown setting {name!r} in {path}")
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

    cfg = Config(**parsed, credentials=tuple(credentials))
    _validate_backend_url(cfg.backend, where.get("backend", "default"))
    dev = False
    if not cfg.credentials and not cfg.anonymous:
        if not cfg.local_backend:
            raise ConfigError(
                "config: credentials: set TSPROXY_ACCESS_KEY/TSPROXY_SECRET_KEY or [[credentials]] "
                "(dev credentials are only used with the embedded file:// backend)"
            )
        cfg = _replace(cfg, credentials=(Credentials(DEV_ACCESS_KEY, DEV_SECRET_KEY),))
        dev = True
    if cfg.encryption and cfg.key_ring is None:
        if not cfg.local_backend:
            raise ConfigError(
                "config: key_ring: required with encryption on a remote backend (make one with "
                "`tsproxy keys init --key-ring FILE`, or set encryption = false)"
            )
        root = cfg.backend_path()
        cfg = _replace(cfg, key_ring=root.parent / f"{root.name}-dev-keyring.json", dev_key_ring=True)
        dev = True
    cfg = _replace(cfg, dev_mode=dev, origins=dict(where))
    _validate(cfg, where)
    return cfg


def _replace(cfg: Config, **changes: Any) -> Config:
    current = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    current.update(changes)
    return Config(**current)
