"""How many tsproxy modules one request crosses, and how often a lower room calls into a higher one.

A real tsproxy (in this process, on a real SeaweedFS, or on the embedded backend with --backend local)
serves a 12 MiB PutObject and then a cold ranged GetObject (a fresh object: no manifest, no chunk
cached) while a profile hook on every thread notes each tsproxy function that runs. For each request
the table gives:

- modules: the tsproxy modules whose code ran (the request's path through the code);
- upward calls: calls whose caller sits in a lower room than the function it calls (rooms as in
  docs/ARCHITECTURE.md: server > service > cache > store > format, kafka > s3 > the base modules);
- upward resumptions: the same for a generator or coroutine resumed by a lower room (a store reading a
  body the service makes, for instance), counted apart because the data flows down while the frame
  goes up.

The transform pool (`tsproxy.pool`) is a runner, like asyncio's event loop: the functions it runs were
handed to it from above, so its calls into them are counted as modules crossed but not as upward calls.

    python benchmarks/modules.py [--backend seaweed|local] [--json PATH] [--verbose]
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import kafka_like  # noqa: E402

PACKAGE = str(ROOT / "tsproxy") + "/"
PUT_SIZE = 12 << 20
RANGE = "bytes=5000000-6048575"  # 1 MiB from the middle of the object

# The rooms, from the top down (docs/ARCHITECTURE.md); a module outside every package room is a base
# module (errors, metrics, logs, pool, defaults, config).
LEVELS = {"server": 6, "jobs": 6, "spark": 6, "service": 5, "cache": 4, "store": 3, "format": 2, "kafka": 2}
LEVELS["s3"] = 1
BASE = 0
RUNNERS = frozenset({"tsproxy.pool"})  # run what they are handed (see the module docstring)
_GENERATORS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def module_of(filename: str) -> str | None:
    """The dotted tsproxy module a source file is, or None for code outside tsproxy."""
    if not filename.startswith(PACKAGE):
        return None
    parts = filename[len(PACKAGE) :].removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["tsproxy", *parts])


def level_of(module: str) -> int:
    """The level of a module's room: its package's (the package's own __init__ too), else BASE."""
    parts = module.split(".")
    return LEVELS.get(parts[1], BASE) if len(parts) > 1 else BASE


class Recorder:
    """A profile hook that, while on, notes the modules run and the upward calls between rooms."""

    def __init__(self) -> None:
        self.on = False
        self.modules: Counter[str] = Counter()
        self.upward: Counter[tuple[str, str]] = Counter()
        self.resumed_upward: Counter[tuple[str, str]] = Counter()
        self._started: dict[int, FrameType] = {}  # generator frames seen, kept so no id is reused
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self.modules.clear()
            self.upward.clear()
            self.resumed_upward.clear()
            self._started.clear()

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event != "call":
            return
        callee = module_of(frame.f_code.co_filename)
        if callee is None:
            return
        resumed = False
        if frame.f_code.co_flags & _GENERATORS:
            with self._lock:
                resumed = id(frame) in self._started
                self._started[id(frame)] = frame
        caller_frame = frame.f_back
        caller = module_of(caller_frame.f_code.co_filename) if caller_frame is not None else None
        with self._lock:
            self.modules[callee] += 1
            if caller is not None and caller not in RUNNERS and level_of(caller) < level_of(callee):
                (self.resumed_upward if resumed else self.upward)[(caller, callee)] += 1

    def result(self) -> dict[str, Any]:
        with self._lock:
            return {
                "modules": sorted(self.modules),
                "module_count": len(self.modules),
                "upward_calls": sum(self.upward.values()),
                "upward": {f"{a} -> {b}": n for (a, b), n in sorted(self.upward.items())},
                "upward_resumptions": sum(self.resumed_upward.values()),
                "resumed_upward": {f"{a} -> {b}": n for (a, b), n in sorted(self.resumed_upward.items())},
            }


def measure(backend: str) -> dict[str, dict[str, Any]]:
    from tests.server.harness import RunningProxy
    from tests.support.seaweed import running_seaweed
    from tsproxy.format import KeyRing

    recorder = Recorder()
    # Every thread the proxy starts from here on (its event loop, the transform pool) runs the hook.
    threading.setprofile(recorder.hook)
    sys.setprofile(recorder.hook)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tsp-modules-") as tmp_dir:
        tmp = Path(tmp_dir)
        ring = tmp / "ring.json"
        KeyRing.new().save(ring)
        settings: dict[str, Any] = {"cache_dir": str(tmp / "cache"), "key_ring": str(ring)}
        weed_cm = running_seaweed() if backend == "seaweed" else None
        weed = weed_cm.__enter__() if weed_cm is not None else None
        try:
            if weed is None:
                settings["backend"] = f"file://{tmp / 'data'}"
            else:
                settings.update(
                    backend=weed.endpoint,
                    backend_access_key=weed.access_key,
                    backend_secret_key=weed.secret_key,
                )
            proxy = RunningProxy(settings)
            try:
                client = proxy.client()
                bucket = f"m-{uuid.uuid4().hex[:12]}"
                client.create_bucket(Bucket=bucket)
                body = kafka_like(PUT_SIZE)
                client.put_object(Bucket=bucket, Key="warm", Body=body)  # imports and first-use paths
                client.get_object(Bucket=bucket, Key="warm", Range=RANGE)["Body"].read()
                time.sleep(0.2)
                for name, request in (
                    ("PUT 12 MiB", lambda: client.put_object(Bucket=bucket, Key="object", Body=body)),
                    (
                        "cold ranged GET",
                        lambda: client.get_object(Bucket=bucket, Key="object", Range=RANGE)["Body"].read(),
                    ),
                ):
                    recorder.reset()
                    recorder.on = True
                    request()
                    time.sleep(0.2)  # background work the request started (prefetch) is its too
                    recorder.on = False
                    results[name] = recorder.result()
            finally:
                proxy.stop()
        finally:
            threading.setprofile(None)  # type: ignore[arg-type]
            sys.setprofile(None)
            if weed_cm is not None:
                weed_cm.__exit__(None, None, None)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=["seaweed", "local"], default="seaweed")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--verbose", action="store_true", help="list the modules and upward calls")
    args = parser.parse_args()
    results = measure(args.backend)
    print(f"{'request':<18} {'modules':>8} {'upward calls':>13} {'upward resumptions':>19}")
    for name, r in results.items():
        print(f"{name:<18} {r['module_count']:>8} {r['upward_calls']:>13} {r['upward_resumptions']:>19}")
    if args.verbose:
        for name, r in results.items():
            print(f"\n{name}: {', '.join(m.removeprefix('tsproxy.') for m in r['modules'])}")
            for edge, n in {**r["upward"], **r["resumed_upward"]}.items():
                print(f"  {n:>5}  {edge}")
    if args.json:
        args.json.write_text(json.dumps({"backend": args.backend, "requests": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
