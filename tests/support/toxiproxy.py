"""toxiproxy, a real TCP proxy that puts a network between two loopback servers, for tests and benchmarks.

`make toxiproxy` (part of `make install-test`) builds Shopify's toxiproxy server from the Go module proxy
at a pinned version. This module starts it and speaks its HTTP API; nothing else::

    with Toxiproxy.start() as toxi:
        link = toxi.link("store", weed.endpoint)       # a proxy on a free loopback port
        backend = link.endpoint                          # "http://127.0.0.1:<port>": point clients here
        link.shape(latency_ms=30, jitter_ms=3, mb_per_s=20)
        name = link.add("reset_peer", timeout=200)       # a toxic; returns its name
        link.remove(name)
        link.disable()                                   # the store is gone: connections refused
        link.enable()
        toxi.reset()                                     # every link enabled, every toxic removed

What the toxics do (toxiproxy's own sources, toxics/*.go), on TCP streams, not HTTP requests:

- `latency` (ms, `jitter` ms): every piece of data waits that long after it arrived; data keeps
  flowing meanwhile, so it is a one-way delay, not a per-piece cost. On the `downstream` stream (the
  store's answers) it adds that much to every request's round trip.
- `bandwidth` (`rate` in KB/s, 1 KB = 1000 bytes): per connection and per direction.
- `limit_data` (`bytes`): the connection is closed once that many bytes went through it.
- `reset_peer` (`timeout` ms): once data arrives, the connection is reset (RST) after the timeout.
- `timeout` (`timeout` ms): data stops; the connection is closed after the timeout (0: never).
- `slow_close` (`delay` ms), `slicer`: delays the close; cuts data into small pieces.

Every toxic has a `stream` ("upstream": client to server, "downstream": server to client) and a
`toxicity` (the share of connections it applies to, drawn when it meets a connection).
Toxics apply to connections already open as well as to new ones. A disabled link closes its
connections and stops listening (a client then gets "connection refused"); enabled again it listens
on the same port.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.ports import HOST, free_low_port, free_port
from tests.support.seaweed import _die_with_parent

VERSION = "v2.12.0"  # the Makefile's TOXIPROXY_VERSION
START_TIMEOUT = 20.0
MB = 1_000_000  # link speeds are in MB/s of 10**6 bytes, as toxiproxy counts KB as 1000 bytes


def toxiproxy_binary() -> str:
    """The toxiproxy server: $TOXIPROXY_SERVER, else where `make toxiproxy` builds it, else on PATH."""
    given = os.environ.get("TOXIPROXY_SERVER")
    if given:
        return given
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    built = cache / "tsproxy-tools" / f"toxiproxy-{VERSION}" / "server"
    if built.is_file() and os.access(built, os.X_OK):
        return str(built)
    found = shutil.which("toxiproxy-server")
    if found is None:
        raise RuntimeError(f"toxiproxy server not found at {built}: run `make toxiproxy` (needs Go)")
    return found


def _kill_if_running(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()


class ToxiproxyError(RuntimeError):
    """The API refused a request; `status` is its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"toxiproxy answered {status}: {message}")
        self.status = status


@dataclass
class Toxiproxy:
    """A running toxiproxy server; `Toxiproxy.start()` makes one, `stop()` ends it."""

    api: str  # "http://127.0.0.1:<port>"
    process: subprocess.Popen[bytes] = field(repr=False)
    log_path: Path
    links: dict[str, Link] = field(default_factory=dict)

    @classmethod
    def start(cls, attempts: int = 3) -> Toxiproxy:
        """Start the server with its API on a free loopback port; retried with a new port if it lost
        the port to someone else in the meantime."""
        binary = toxiproxy_binary()
        failure = ""
        for _ in range(attempts):
            port = free_port()
            log = Path(tempfile.mkstemp(prefix="tsp-toxiproxy-", suffix=".log")[1])
            with open(log, "wb") as out:
                process = subprocess.Popen(
                    [binary, "-host", HOST, "-port", str(port)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env={**os.environ, "LOG_LEVEL": os.environ.get("TOXIPROXY_LOG_LEVEL", "warn")},
                    start_new_session=True,  # a Ctrl-C of the run is not delivered to it as well
                    preexec_fn=_die_with_parent(),  # nor does it outlive a run that is killed
                )
            atexit.register(_kill_if_running, process)
            server = cls(f"http://{HOST}:{port}", process, log)
            deadline = time.monotonic() + START_TIMEOUT
            while time.monotonic() < deadline and process.poll() is None:
                with contextlib.suppress(OSError):
                    server._call("GET", "/version")
                    return server
                time.sleep(0.05)
            failure = server.log_tail()
            server.stop()
        raise RuntimeError(f"toxiproxy did not start:\n{failure}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        with contextlib.suppress(OSError):
            self.log_path.unlink()

    def __enter__(self) -> Toxiproxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- the API

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.api + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read()
        except urllib.error.HTTPError as e:
            raise ToxiproxyError(e.code, e.read().decode(errors="replace")) from None
        return json.loads(text) if text.strip() else None

    def link(self, name: str, upstream: str) -> Link:
        """A new proxy named `name` to `upstream` ("http://host:port" or "host:port"), listening on a
        free port below the ephemeral range (see ports.free_low_port), another if that one was taken."""
        target = upstream.split("://", 1)[-1].rstrip("/")
        for attempt in range(5):
            wanted = {"name": name, "listen": f"{HOST}:{free_low_port()}", "upstream": target}
            try:
                made = self._call("POST", "/proxies", wanted)
                break
            except ToxiproxyError as e:
                if e.status == 409 or attempt == 4:  # 409: a proxy of that name exists
                    raise
        link = Link(self, name, made["listen"], target)
        self.links[name] = link
        return link

    def reset(self) -> None:
        """Every link enabled and every toxic removed."""
        self._call("POST", "/reset")

    def state(self) -> dict[str, Any]:
        """The server's own view: every proxy with its toxics, by name."""
        found: dict[str, Any] = self._call("GET", "/proxies")
        return found


@dataclass
class Link:
    """One proxy of a Toxiproxy: clients connect to `endpoint`, it connects to `upstream`."""

    server: Toxiproxy = field(repr=False)
    name: str
    listen: str  # "127.0.0.1:<port>"
    upstream: str  # "host:port"

    @property
    def endpoint(self) -> str:
        return f"http://{self.listen}"

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    def add(
        self,
        kind: str,
        *,
        stream: str = "downstream",
        name: str | None = None,
        toxicity: float = 1.0,
        **attributes: int,
    ) -> str:
        """Add a toxic of type `kind` with its `attributes` (see the module's notes); returns its name
        (by default "<kind>_<stream>", so one of each kind and stream unless named)."""
        if stream not in ("upstream", "downstream"):
            raise ValueError("stream is 'upstream' (client to server) or 'downstream' (server to client)")
        toxic = {
            "name": name or f"{kind}_{stream}",
            "type": kind,
            "stream": stream,
            "toxicity": toxicity,
            "attributes": attributes,
        }
        made = self.server._call("POST", f"/proxies/{self.name}/toxics", toxic)
        return str(made["name"])

    def remove(self, name: str) -> None:
        """Remove the toxic `name`."""
        self.server._call("DELETE", f"/proxies/{self.name}/toxics/{name}")

    def toxics(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.server._call("GET", f"/proxies/{self.name}/toxics")
        return found

    def clear(self) -> None:
        """Remove every toxic of this link."""
        for toxic in self.toxics():
            self.remove(toxic["name"])

    @contextlib.contextmanager
    def toxic(self, kind: str, **options: Any) -> Iterator[str]:
        """`with link.toxic("timeout", timeout=0):` — a toxic for the duration of a block."""
        name = self.add(kind, **options)
        try:
            yield name
        finally:
            with contextlib.suppress(ToxiproxyError):
                self.remove(name)

    def shape(self, latency_ms: float = 0, jitter_ms: float = 0, mb_per_s: float = 0) -> None:
        """A network like a remote store's: `latency_ms` (± `jitter_ms`) more on every round trip (on the
        answers), and each connection limited to `mb_per_s` (MB of 10**6 bytes) each way; 0 is none.
        Replaces what an earlier `shape` set."""
        for toxic in self.toxics():
            if toxic["name"] in ("latency_downstream", "bandwidth_downstream", "bandwidth_upstream"):
                self.remove(toxic["name"])
        if latency_ms > 0:
            self.add("latency", latency=round(latency_ms), jitter=round(jitter_ms))
        if mb_per_s > 0:
            rate = max(1, round(mb_per_s * MB / 1000))
            self.add("bandwidth", stream="downstream", rate=rate)
            self.add("bandwidth", stream="upstream", rate=rate)

    def disable(self) -> None:
        """Cut the link: open connections are closed and new ones refused."""
        self.server._call("POST", f"/proxies/{self.name}", {"enabled": False})

    def enable(self) -> None:
        self.server._call("POST", f"/proxies/{self.name}", {"enabled": True})

    def delete(self) -> None:
        self.server._call("DELETE", f"/proxies/{self.name}")
        self.server.links.pop(self.name, None)


@contextlib.contextmanager
def running_toxiproxy() -> Iterator[Toxiproxy]:
    """`with running_toxiproxy() as toxi:` — a toxiproxy server for the duration of a block."""
    server = Toxiproxy.start()
    try:
        yield server
    finally:
        server.stop()


__all__ = ["MB", "Link", "Toxiproxy", "ToxiproxyError", "running_toxiproxy", "toxiproxy_binary"]
