"""Start-up checks of what tsproxy owns on its node: the key ring, the cache directory, the ports.

Each failure is a `ConfigError` whose message is one line naming the setting, where it came from and
the file or port at fault, so `tsproxy serve` exits 2 with that line instead of a traceback.
`check` runs all of them without changing anything (no ring generated, no cache created, no port
kept) and then probes the backend: that is `tsproxy serve --check`.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
from pathlib import Path

from tsproxy import errors
from tsproxy.config import Config
from tsproxy.errors import ConfigError
from tsproxy.format import KeyRing
from tsproxy.format.keyring import InsecureKeyRing, check_private
from tsproxy.server.probes import Finding, probe
from tsproxy.service import Namespace
from tsproxy.store.base import Backend

log = logging.getLogger("tsproxy.server")

# What `Proxy.key_ring_state` says, and the banner with it.
RING_NAMED = "loaded"
RING_DEV_GENERATED = "generated: development ring, no key_ring named"
RING_DEV_EXISTING = "loaded: development ring, no key_ring named"


def _name(cfg: Config, setting: str) -> str:
    return f"{setting} ({cfg.origin(setting)})"


def load_keyring(cfg: Config) -> tuple[KeyRing, str]:
    """The key ring to use and how it came to be (a RING_* value); ConfigError if it cannot be had.

    A ring is generated only when none was named (the development default next to a file://
    backend); a named file that is missing is an error, never created.
    """
    path = cfg.key_ring
    assert path is not None
    try:
        if cfg.dev_key_ring and not path.exists():
            ring = KeyRing.new()
            path.parent.mkdir(parents=True, exist_ok=True)
            ring.save(path)
            log.warning("generated a development key ring", extra={"fields": {"path": str(path)}})
            return ring, RING_DEV_GENERATED
        ring = read_keyring(cfg, path)
    except InsecureKeyRing:
        raise  # already one line naming the file and its mode
    except errors.KeyRingError as e:
        raise ConfigError(f"{_name(cfg, 'key_ring')}: {e}") from e
    except OSError as e:
        raise ConfigError(f"{_name(cfg, 'key_ring')}: key ring {path}: {e.strerror or e}") from e
    return ring, RING_DEV_EXISTING if cfg.dev_key_ring else RING_NAMED


def read_keyring(cfg: Config, path: Path) -> KeyRing:
    """Load the ring, refusing a file others may access unless allow_insecure_key_ring says otherwise."""
    try:
        check_private(path)
    except InsecureKeyRing as e:
        if not cfg.allow_insecure_key_ring:
            raise
        log.warning("key ring accessible to others, accepted", extra={"fields": {"reason": str(e)}})
    return KeyRing.load(path)


def cache_dir_problem(path: Path, *, create: bool) -> str | None:
    """Why `path` cannot hold the chunk cache, or None. With `create`, make the directory."""
    if path.exists() and not path.is_dir():
        return f"{path} is not a directory"
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return f"cannot create {path}: {e.strerror or e}"
    # The nearest directory that exists must let us write (it is where the cache or its parents go).
    nearest = path
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    if not nearest.is_dir():
        return f"cannot create {path}: {nearest} is not a directory"
    if not os.access(nearest, os.W_OK | os.X_OK):
        return f"{nearest} is not writable"
    return None


def cache_error(cfg: Config, error: BaseException) -> ConfigError:
    """The one line for a cache directory that could not be opened (sqlite, diskcache, the OS)."""
    reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return ConfigError(f"{_name(cfg, 'cache_dir')}: cannot use {cfg.cache_dir} as the chunk cache: {reason}")


def generates_keyring(cfg: Config) -> bool:
    """Whether the start will generate the development key ring (none named, none there yet)."""
    ring = cfg.key_ring
    return bool(cfg.encryption and cfg.dev_key_ring and ring is not None and not ring.exists())


LOCK_NAME = "tsproxy.lock"


class CacheDirLock:
    """One tsproxy per cache directory: an exclusive lock on a file in it, held while the server runs.

    Two instances on one cache would each evict and count the other's entries as their own. The lock
    is the kernel's (flock), so it goes with the process, however it ends; the file holds the holder's
    process id for the message a second instance prints.
    """

    def __init__(self, cfg: Config, directory: Path) -> None:
        self.cfg = cfg
        self.path = directory / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock; ConfigError (one line) when another process holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                why = f"cannot lock {self.path}: {e.strerror}"
                raise ConfigError(f"{_name(self.cfg, 'cache_dir')}: {why}") from e
            who = f"another tsproxy (pid {holder})" if holder.isdigit() else "another tsproxy"
            raise ConfigError(
                f"{_name(self.cfg, 'cache_dir')}: {self.path.parent} is in use by {who}; "
                "give each instance a cache_dir of its own"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def still_held(self) -> bool:
        """Whether the locked file is still the directory's (a damaged cache is moved aside or emptied)."""
        if self._fd is None:
            return False
        try:
            return os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the lock goes with the descriptor; the file stays for the next start
            self._fd = None


def check_cache_dir(cfg: Config, *, create: bool) -> None:
    if cfg.cache_dir is None:
        return
    problem = cache_dir_problem(cfg.cache_dir, create=create)
    if problem is not None:
        raise ConfigError(f"{_name(cfg, 'cache_dir')}: {problem}")


def port_error(cfg: Config, setting: str, address: tuple[str, int], error: OSError) -> ConfigError:
    host, port = address
    if error.errno == errno.EADDRINUSE:
        why = "the port is already in use"
    elif error.errno == errno.EACCES:
        why = "permission denied (ports below 1024 need privileges)"
    elif error.errno == errno.EADDRNOTAVAIL:
        why = f"{host} is not an address of this machine"
    else:
        why = error.strerror or str(error)
    return ConfigError(f"{_name(cfg, setting)}: cannot listen on {host}:{port}: {why}")


def check_ports(cfg: Config, settings: tuple[str, ...] = ("listen", "metrics_listen")) -> None:
    """Bind each port for a moment, as the server will, so a port in use is one line before start."""
    for setting in settings:
        address: tuple[str, int] | None = getattr(cfg, setting)
        if address is None or address[1] == 0:
            continue
        try:
            infos = socket.getaddrinfo(address[0] or None, address[1], type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            raise ConfigError(f"{_name(cfg, setting)}: cannot resolve {address[0]}: {e.strerror}") from e
        for family, kind, proto, _, sockaddr in infos[:1]:
            with socket.socket(family, kind, proto) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds
                try:
                    s.bind(sockaddr)
                except OSError as e:
                    raise port_error(cfg, setting, address, e) from e


def _key_ring_finding(cfg: Config) -> Finding:
    if not cfg.encryption:
        return Finding("key_ring", True, "encryption is off; no key ring needed")
    path = cfg.key_ring
    assert path is not None
    if cfg.dev_key_ring and not path.exists():
        return Finding("key_ring", True, f"none named; a development ring will be generated at {path}")
    try:
        ring = read_keyring(cfg, path)
    except InsecureKeyRing:
        raise  # already one line naming the file and its mode
    except errors.KeyRingError as e:
        return Finding("key_ring", False, f"{_name(cfg, 'key_ring')}: {e}")
    ids = ring.ids()
    return Finding("key_ring", True, f"{path}: {len(ids)} key(s), active {ring.active_id}")


def _cache_finding(cfg: Config) -> Finding:
    if cfg.cache_dir is None:
        return Finding("cache_dir", True, "the chunk cache is off")
    problem = cache_dir_problem(cfg.cache_dir, create=False)
    if problem is not None:
        return Finding("cache_dir", False, f"{_name(cfg, 'cache_dir')}: {problem}")
    return Finding("cache_dir", True, f"{cfg.cache_dir} is usable")


def _port_findings(cfg: Config) -> list[Finding]:
    out = []
    for setting in ("listen", "metrics_listen"):
        address: tuple[str, int] | None = getattr(cfg, setting)
        if address is None:
            continue
        try:
            check_ports(cfg, (setting,))
        except ConfigError as e:
            out.append(Finding(setting, False, str(e)))
        else:
            out.append(Finding(setting, True, f"{address[0]}:{address[1]} is free"))
    return out


async def check(cfg: Config, backend: Backend) -> list[Finding]:
    """Every start-up check, then the backend probes; changes nothing (see the module docstring)."""
    findings = [_key_ring_finding(cfg), _cache_finding(cfg), *_port_findings(cfg)]
    root = cfg.backend_path() if cfg.local_backend else None
    if root is not None and not root.exists():  # starting the local backend would create it
        problem = cache_dir_problem(root, create=False)
        message = problem or f"{root} does not exist yet; it will be created"
        return [*findings, Finding("backend", problem is None, message)]
    try:
        await backend.start()
        findings += await probe(backend, Namespace(cfg.backend_bucket, cfg.backend_prefix), cfg.backend)
    finally:
        await backend.close()
    return findings
