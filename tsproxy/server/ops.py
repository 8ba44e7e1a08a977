"""The operations endpoints on their own port: /metrics, /healthz, /readyz.

/readyz speaks only of tsproxy itself (started, key ring loaded, cache open), never of the object
store: in the sidecar layout a failing readiness probe makes the broker's pod NotReady, and an
object-store outage must not take brokers out of service. The store's state is `tsproxy_backend_up`
and the TsproxyBackendDown alert; requests that need the store fail fast with 503 and Retry-After.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tsproxy.server.exchange import Served


def create_metrics_app(proxy: Served) -> web.Application:
    """The operations application: Prometheus metrics, liveness and readiness."""

    async def metrics(request: web.Request) -> web.Response:
        if proxy.cache is not None:
            proxy.metrics.cache_size.set(proxy.cache.size_bytes())
        proxy.metrics.cache_limit.set(proxy.cfg.cache_size if proxy.cache is not None else 0)
        proxy.metrics.event_loop_tasks.set(len(asyncio.all_tasks()))
        body = generate_latest(proxy.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        problems = []
        if not proxy.ready:
            problems.append("starting" if not proxy.draining else "shutting down")
        if proxy.cfg.encryption and proxy.keyring is None:
            problems.append("key ring not loaded")
        if proxy.cfg.cache_dir is not None and proxy.cache is None:
            problems.append("chunk cache not open")
        if problems:
            return web.json_response({"status": "unready", "problems": problems}, status=503)
        return web.json_response({"status": "ready"})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app
