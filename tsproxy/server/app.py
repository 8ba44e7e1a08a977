"""A running tsproxy: what it holds (config, backend, key ring, cache, object service, metrics), its
start and stop, key ring reloads, backend probes, and `run`, which serves until told to stop.

Start-up mistakes (key ring, cache directory, ports) raise ConfigError with one line that names the
setting; backend problems are logged and shown by `tsproxy_backend_up`, never fatal (see probes).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web

from tsproxy import __version__, errors, logs
from tsproxy.cache.chunks import ChunkCache
from tsproxy.cache.reader import ChunkReader
from tsproxy.config import Config
from tsproxy.format import KeyRing
from tsproxy.memory import IdleRelease
from tsproxy.metrics import Metrics
from tsproxy.pool import PriorityPool
from tsproxy.server import startup
from tsproxy.server.connections import ConnectionGuard, S3Runner
from tsproxy.server.dispatch import create_app
from tsproxy.server.ops import create_metrics_app
from tsproxy.server.probes import Finding, failure, probe
from tsproxy.service import Namespace, ObjectService
from tsproxy.service.catalog import SizeCatalog
from tsproxy.service.janitor import Janitor
from tsproxy.service.uploads.layout import Layout
from tsproxy.store.base import Backend
from tsproxy.store.health import BackendHealth, GuardedBackend

log = logging.getLogger("tsproxy.server")

CATALOG_CLOSE_TIMEOUT = 10.0  # seconds a stop waits for the size catalog's last flush
RECORDS_CLOSE_TIMEOUT = 20.0  # seconds a stop waits for the held part records of multipart uploads


class Proxy:
    """Everything a running server holds: config, backend, key ring, cache, object service, metrics."""

    def __init__(
        self, cfg: Config, *, backend: Backend | None = None, metrics: Metrics | None = None
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics or Metrics()
        self.secrets: Mapping[str, str] = {c.access_key: c.secret_key for c in cfg.credentials}
        threads = cfg.transform_threads or max(2, os.cpu_count() or 2)
        self.executor = PriorityPool(threads, thread_name_prefix="transform")
        self.io_executor = ThreadPoolExecutor(4, thread_name_prefix="cache-io")
        # The backend as opened (probes use it) and guarded (everything else: fails fast while down).
        self.store = backend or _open_backend(cfg, self.metrics)
        self.health = BackendHealth(self.metrics.backend_is_up)
        self.backend: Backend = GuardedBackend(self.store, self.health)
        self.keyring: KeyRing | None = None
        self.key_ring_state: str | None = None
        self.cache: ChunkCache | None = None
        self.cache_lock: startup.CacheDirLock | None = None
        self.reader: ChunkReader | None = None
        self.service: ObjectService | None = None
        self.catalog: SizeCatalog | None = None
        self.ready = False
        self.draining = False
        self.uploads_in_flight = 0
        self._ring_stamp: tuple[int, int, int] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._prober: asyncio.Task[None] | None = None
        self.janitor: Janitor | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.idle: IdleRelease | None = None
        if cfg.malloc_idle_release > 0:
            releases = self.metrics.memory_releases
            self.idle = IdleRelease(
                cfg.malloc_idle_release,
                on_release=lambda released: releases.labels("released" if released else "none").inc(),
            )
        self._releaser: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Load the key ring, open the cache and the service; ConfigError (one line) on a mistake.

        The backend is probed in the background: a store that is down is logged, not fatal.
        """
        cfg = self.cfg
        logging.getLogger("tsproxy.access").disabled = not cfg.access_log
        # Check everything before creating anything: a refused key ring or cache directory leaves no trace,
        # and a development ring is generated only once the cache is open and locked.
        await asyncio.to_thread(startup.check_cache_dir, cfg, create=False)
        generate_ring = startup.generates_keyring(cfg)
        if cfg.encryption and cfg.key_ring is not None and not generate_ring:
            await self._load_keyring()
        await asyncio.to_thread(startup.check_cache_dir, cfg, create=True)
        caching = cfg.cache_settings()
        if caching.directory is not None:
            self.cache_lock = startup.CacheDirLock(cfg, caching.directory)
            await asyncio.to_thread(self.cache_lock.acquire)
            # Cached chunks are the stored bytes (sealed under their object's DEK when it is encrypted):
            # the cache needs no key of its own, whatever cache_encrypt says.
            try:
                self.cache = await asyncio.to_thread(
                    ChunkCache,
                    caching.directory,
                    caching.size,
                    executor=self.io_executor,
                    metrics=self.metrics,
                    direct_io=caching.direct_io,
                )
            except Exception as e:  # sqlite3 "unable to open database file" and kin
                raise startup.cache_error(cfg, e) from e
            if not self.cache_lock.still_held():  # a damaged cache was moved aside: lock the new one
                self.cache_lock.release()
                await asyncio.to_thread(self.cache_lock.acquire)
        if generate_ring:
            await self._load_keyring()
        await self.store.start()
        self.reader = ChunkReader(
            self.cache,
            self.executor,
            prefetch_bytes=caching.prefetch_bytes,
            memory_bytes=caching.memory_bytes,
            metrics=self.metrics,
        )
        namespace = Namespace(cfg.backend_bucket, cfg.backend_prefix)

        layout = Layout(namespace)

        def catalog_home(bucket: str) -> tuple[str, str]:
            home = layout.catalog(bucket)
            return home.bucket, home.key

        self.catalog = SizeCatalog(self.backend, catalog_home, on_event=self.metrics.catalog_event)
        self.catalog.start()
        self.service = ObjectService(
            self.backend,
            self.keyring,
            cfg.transform_settings(),
            self.reader,
            self.executor,
            namespace=namespace,
            metrics=self.metrics,
            part_size=cfg.backend_part_size,
            metadata_ttl=cfg.metadata_ttl,
            stale_if_error=cfg.metadata_stale_if_error,
            catalog=self.catalog,
            upload_records=cfg.upload_records,
            upload_record_delay=cfg.upload_record_delay,
        )
        self.service.start()
        if cfg.local_backend:
            await _ensure_local_root(cfg)
        if self.keyring is not None and cfg.key_ring_check > 0:
            self._watcher = asyncio.get_running_loop().create_task(self.watch_keyring())
        self._prober = asyncio.get_running_loop().create_task(self.watch_backend())
        if self.idle is not None:
            self._releaser = asyncio.get_running_loop().create_task(self.idle.run_forever())
        if cfg.janitor_interval > 0:
            self.janitor = Janitor(
                self.service,
                leftover_age=cfg.leftover_age,
                metrics=self.metrics,
            )
            self._sweeper = asyncio.get_running_loop().create_task(
                self.janitor.run_forever(cfg.janitor_interval)
            )
        self.ready = True

    async def _load_keyring(self) -> None:
        assert self.cfg.key_ring is not None
        self._ring_stamp = _file_stamp(self.cfg.key_ring)
        ring, self.key_ring_state = await asyncio.to_thread(startup.load_keyring, self.cfg)
        self.keyring = ring
        self.metrics.key_ring_loaded(ring.ids(), ring.active_id)

    async def stop(self) -> None:
        self.ready = False
        for task in (self._watcher, self._prober, self._sweeper, self._releaser):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.reader is not None:
            await self.reader.close()
        if self.service is not None:
            # Part records held for quiet uploads, so that another instance can complete them; after the
            # drain (no part arrives any more) and before the store closes. Bounded: the store may be down.
            try:
                left = await asyncio.wait_for(self.service.close(), RECORDS_CLOSE_TIMEOUT)
            except TimeoutError:
                left = self.service.pending.records_unwritten()
            if left:
                fields = {"records": left}
                log.warning(
                    "multipart part records not written at stop: the object store refused",
                    extra={"fields": fields},
                )
        if self.catalog is not None:
            # What was written since the last flush, for other instances; bounded, the store may be down.
            try:
                await asyncio.wait_for(self.catalog.close(), CATALOG_CLOSE_TIMEOUT)
            except TimeoutError:
                log.warning("size catalog not flushed at stop: the object store did not answer in time")
        await self.store.close()
        if self.cache is not None:
            await asyncio.to_thread(self.cache.close)
        if self.cache_lock is not None:
            self.cache_lock.release()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.io_executor.shutdown(wait=False, cancel_futures=True)

    async def reload_keyring(self, *, only_if_changed: bool = False) -> bool:
        """Read the key ring file again and use it from now on; True when a new ring is in use.

        The rotation steps (add, activate, remove) then need no restart: a Kubernetes Secret update
        or a SIGHUP is enough. A file that fails to load leaves the ring in use untouched (logged and
        counted). The chunk cache's at-rest key stays the one derived at startup.
        """
        path = self.cfg.key_ring
        if not self.cfg.encryption or path is None or self.service is None:
            return False
        stamp = _file_stamp(path)
        if only_if_changed and stamp == self._ring_stamp:
            return False
        try:
            ring = await asyncio.to_thread(startup.read_keyring, self.cfg, path)
        except (errors.KeyRingError, OSError) as e:
            if stamp != self._ring_stamp or not only_if_changed:
                why = {"fields": {"reason": str(e)}}
                log.error("key ring not reloaded, keeping the one in use", extra=why)
                self.metrics.key_ring_reloads.labels("error").inc()
            self._ring_stamp = stamp  # one complaint per change of the file, not one per check
            return False
        self._ring_stamp = stamp
        old = self.keyring
        self.keyring = ring
        self.service.replace_keyring(ring)
        self.metrics.key_ring_reloads.labels("ok").inc()
        self.metrics.key_ring_loaded(ring.ids(), ring.active_id)
        log.info(
            "key ring reloaded",
            extra={
                "fields": {
                    "keys": ",".join(ring.ids()),
                    "active": ring.active_id,
                    "previous_active": old.active_id if old is not None else None,
                }
            },
        )
        return True

    async def watch_keyring(self) -> None:
        """Look at the key ring file every key_ring_check seconds; reload it when it changed."""
        interval = self.cfg.key_ring_check
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reload_keyring(only_if_changed=True)
            except Exception:  # never let the watcher die silently
                log.exception("key ring check failed")

    async def probe_backend(self, *, write: bool) -> list[Finding]:
        """Probe the store (see probes.probe) and update its up/down state."""
        namespace = Namespace(self.cfg.backend_bucket, self.cfg.backend_prefix)
        findings = await probe(self.store, namespace, self.cfg.backend, write=write)
        self.health.probed(failure(findings))
        return findings

    async def watch_backend(self) -> None:
        """Probe the store at start, then every backend_check seconds.

        The probes here only read (reachable, TLS, credentials, bucket): a probe object written at every
        start would land in a client's bucket when no backend_bucket is set, and leave versions behind
        in a versioned bucket. `serve --check` adds the write-read-delete probe.
        """
        try:
            findings = await self.probe_backend(write=False)
            for finding in findings:
                if not finding.ok:
                    log.error(finding.message, extra={"fields": {"check": finding.check}})
            if all(f.ok for f in findings):
                log.info("object store probe passed", extra={"fields": {"backend": self.cfg.backend}})
        except Exception:
            log.exception("backend probe failed")
        interval = self.cfg.backend_check
        while interval > 0:
            await asyncio.sleep(interval)
            try:
                await self.probe_backend(write=False)
            except Exception:  # never let the prober die silently
                log.exception("backend probe failed")

    @property
    def objects(self) -> ObjectService:
        assert self.service is not None, "server not started"
        return self.service


def _open_backend(cfg: Config, metrics: Metrics) -> Backend:
    return cfg.backend_settings().open(metrics.backend_request)


def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is replaced or rewritten (follows symlinks, as Secret volumes use)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


async def _ensure_local_root(cfg: Config) -> None:
    await asyncio.to_thread(cfg.backend_path().mkdir, parents=True, exist_ok=True)


def create_runner(proxy: Proxy, **kwargs: Any) -> web.AppRunner:
    """The S3 application's runner, with the connection limit and header deadline of `proxy.cfg`."""
    guard = ConnectionGuard(
        proxy.metrics, header_timeout=proxy.cfg.header_timeout, max_connections=proxy.cfg.max_connections
    )
    return S3Runner(create_app(proxy), guard, access_log=None, **kwargs)


async def _bind(runner: web.AppRunner, cfg: Config, setting: str) -> None:
    address: tuple[str, int] = getattr(cfg, setting)
    await runner.setup()
    try:
        await web.TCPSite(runner, address[0], address[1], reuse_address=True).start()
    except OSError as e:
        raise startup.port_error(cfg, setting, address, e) from e


def banner(proxy: Proxy) -> dict[str, Any]:
    """What the start line says: where to connect, where the data goes, which key ring is in use."""
    cfg = proxy.cfg
    host, port = cfg.listen
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
    out: dict[str, Any] = {"version": __version__, "endpoint": url, "backend": cfg.backend}
    if cfg.backend_bucket:
        out["backend_bucket"] = cfg.backend_bucket
    out["encryption"] = cfg.encryption
    if cfg.encryption:
        out.update(key_ring=str(cfg.key_ring), key_ring_state=proxy.key_ring_state)
    out["cache_dir"] = str(cfg.cache_dir) if cfg.cache_dir is not None else "off"
    if cfg.metrics_listen:
        out["metrics"] = f"http://{cfg.metrics_listen[0]}:{cfg.metrics_listen[1]}/metrics"
    out["access_log"] = cfg.access_log
    if cfg.dev_mode:
        # The development defaults are public constants (README), so naming them leaks nothing.
        cred = cfg.credentials[0]
        out["development_defaults"] = (
            f"export AWS_ACCESS_KEY_ID={cred.access_key} AWS_SECRET_ACCESS_KEY={cred.secret_key}; "
            f"aws --endpoint-url {url} s3 mb s3://demo"
        )
    return out


def announce(proxy: Proxy) -> None:
    """The start line: one JSON log line on stdout (where the start banner has always gone)."""
    record = logging.LogRecord("tsproxy.server", logging.INFO, __file__, 0, "tsproxy serving S3", None, None)
    record.fields = banner(proxy)
    print(logs.JsonFormatter().format(record), flush=True)


async def check(cfg: Config) -> list[Finding]:
    """`tsproxy serve --check`: the start-up checks and the backend probes, changing nothing."""
    return await startup.check(cfg, _open_backend(cfg, Metrics()))


async def run(cfg: Config, *, ready: Callable[[], None] | None = None) -> None:
    """Serve until SIGTERM/SIGINT, then drain: stop accepting, let in-flight requests finish (grace).

    A start-up mistake raises ConfigError before anything is served.
    """
    startup.check_ports(cfg)
    proxy = Proxy(cfg)
    runners = []
    try:
        await proxy.start()
        main = create_runner(proxy, shutdown_timeout=cfg.shutdown_grace)
        runners.append(main)
        await _bind(main, cfg, "listen")
        if cfg.metrics_listen is not None:
            side = web.AppRunner(create_metrics_app(proxy), access_log=None)
            runners.append(side)
            await _bind(side, cfg, "metrics_listen")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        background: set[asyncio.Task[Any]] = set()

        def on_hup() -> None:
            task = loop.create_task(proxy.reload_keyring())
            background.add(task)
            task.add_done_callback(background.discard)

        loop.add_signal_handler(signal.SIGHUP, on_hup)
        announce(proxy)
        if ready is not None:
            ready()
        await stop.wait()
        log.info("shutting down", extra={"fields": {"grace_seconds": cfg.shutdown_grace}})
        proxy.draining = True
        proxy.ready = False
        # AppRunner.cleanup stops listening, then waits up to shutdown_timeout for in-flight handlers.
        await main.cleanup()
    finally:
        for r in reversed(runners):
            await r.cleanup()
        await proxy.stop()
