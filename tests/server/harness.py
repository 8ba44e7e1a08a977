"""Run a real tsproxy server in a background thread, for tests that drive it with real S3 clients."""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import boto3
from aiohttp import web
from botocore.config import Config as BotoConfig

from tests.support.ports import free_port
from tsproxy import config as tsconfig
from tsproxy.server import Proxy, create_metrics_app, create_runner

ACCESS_KEY = "test-access"
SECRET_KEY = "test-secret-key-0123456789"


class RunningProxy:
    """A started tsproxy: `.endpoint`, `.client()`, `.proxy` (the live Proxy object) and `.stop()`."""

    def __init__(self, settings: Mapping[str, Any], env: Mapping[str, str] | None = None) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        values = {
            "listen": f"127.0.0.1:{self.port}",
            "metrics_listen": f"127.0.0.1:{self.metrics_port}",
            **settings,
        }
        environment = {"TSPROXY_ACCESS_KEY": ACCESS_KEY, "TSPROXY_SECRET_KEY": SECRET_KEY, **(env or {})}
        self.cfg = tsconfig.load(values, env=environment)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}"
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="tsproxy-test")
        self._thread.start()
        self.proxy: Proxy = self.call(self._start())

    def call(self, coro: Any, timeout: float = 120) -> Any:
        """Run a coroutine on the server's loop and wait for its result."""
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    async def _start(self) -> Proxy:
        proxy = Proxy(self.cfg)
        await proxy.start()
        self._runner = create_runner(proxy, shutdown_timeout=5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        self._metrics_runner = web.AppRunner(create_metrics_app(proxy), access_log=None)
        await self._metrics_runner.setup()
        await web.TCPSite(self._metrics_runner, "127.0.0.1", self.metrics_port).start()
        return proxy

    async def _stop(self) -> None:
        await self._runner.cleanup()
        await self._metrics_runner.cleanup()
        await self.proxy.stop()

    def stop(self) -> None:
        try:
            self.call(self._stop())
        except TimeoutError:
            # A stop that hangs is a bug in the server: say which tasks it is waiting on.
            stacks = self.call(_task_stacks(), timeout=10)
            raise TimeoutError(f"tsproxy did not stop; its tasks:\n{stacks}") from None
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client with its default (current) checksum and signing settings."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
            config=BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, **config),
        )


async def _task_stacks() -> str:
    """The stack of every task on the running loop but this one, for a stop that hangs."""
    out = io.StringIO()
    for task in asyncio.all_tasks():
        if task is not asyncio.current_task():
            task.print_stack(file=out)
    return out.getvalue()


def start_local(tmp: Path, **settings: Any) -> RunningProxy:
    return RunningProxy(
        {
            "backend": f"file://{tmp / 'data'}",
            "cache_dir": str(tmp / "cache"),
            "key_ring": str(tmp / "ring.json"),
            **settings,
        },
        env={},
    )
