"""The object store behind tsproxy: probes of it, whether it is up, and failing fast while it is not.

`probe` asks the store, through the `Backend` interface, what a first request would find out too late:
is it reachable, does TLS match, are tsproxy's credentials accepted, does the mapped bucket exist, can an
object be written, read and deleted in the reserved namespace. Each answer is a `Finding`, one line.
`tsproxy serve --check` prints them; `serve` logs the failed ones at start and keeps going, because the
store may come back and the broker beside tsproxy must not be taken down with it.

`BackendHealth` holds the up/down state (the `tsproxy_backend_up` gauge). Probes set it; request
outcomes move it too: three requests in a row that end unavailable (after their retries) mark the store
down, any answer marks it up. While it is down, `GuardedBackend` answers 503 at once instead of letting
every request wait out its retries and timeouts, and lets one request through every few seconds to see
whether the store is back. Cached reads never reach the backend and go on.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from tsproxy import errors
from tsproxy.metrics import Metrics
from tsproxy.service.namespace import INTERNAL, Location, Namespace
from tsproxy.store.base import Backend, buckets_of
from tsproxy.store.s3errors import BackendRefused

log = logging.getLogger("tsproxy.backend")

PROBE_TIMEOUT = 10.0  # seconds for each probe step
TRIP_AFTER = 3  # consecutive unavailable outcomes that mark the store down
TRIAL_EVERY = 2.0  # seconds between requests let through while the store is down

# Backend operations that fail fast while the store is down (lifecycle and ping stay untouched).
GUARDED = frozenset(
    {
        "list_buckets",
        "create_bucket",
        "delete_bucket",
        "head_bucket",
        "head",
        "get",
        "get_bytes",
        "put",
        "delete",
        "delete_many",
        "list",
        "copy",
        "create_multipart",
        "upload_part",
        "upload_part_copy",
        "complete_multipart",
        "abort_multipart",
        "list_multipart_uploads",
        "list_parts",
    }
)


@dataclass(frozen=True)
class Finding:
    """One result of a check: what was checked, whether it passed, and a sentence for a person."""

    check: str
    ok: bool
    message: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.check}: {self.message}"


def _causes(error: BaseException) -> Iterator[BaseException]:
    """The error and what caused it, including the transport error botocore keeps in `kwargs`."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        nxt = current.__cause__ or current.__context__
        inner = getattr(current, "kwargs", {}).get("error") if nxt is None else None
        current = nxt if nxt is not None else (inner if isinstance(inner, BaseException) else None)


def explain(error: BaseException, endpoint: str) -> Finding:
    """A failed probe step as a finding that says what is wrong in the terms of the settings."""
    chain = list(_causes(error))
    text = " ".join(str(e) for e in chain)
    if any(isinstance(e, ssl.SSLError) for e in chain):
        if "WRONG_VERSION_NUMBER" in text or "wrong version number" in text:
            why = "the store does not speak TLS on that port (http:// instead of https://?)"
        elif "CERTIFICATE_VERIFY_FAILED" in text:
            why = "its certificate is not trusted"
        else:
            why = f"the TLS handshake failed ({chain[-1]})"
        return Finding("tls", False, f"backend {endpoint}: {why}")
    if any(isinstance(e, socket.gaierror) or "DNSError" in type(e).__name__ for e in chain):
        return Finding("reachable", False, f"backend {endpoint}: the host name does not resolve (DNS)")
    if any(isinstance(e, ConnectionRefusedError) for e in chain):
        return Finding("reachable", False, f"backend {endpoint}: connection refused")
    if any(isinstance(e, asyncio.TimeoutError | TimeoutError) for e in chain):
        return Finding("reachable", False, f"backend {endpoint}: no answer within {PROBE_TIMEOUT:g}s")
    if any(type(e).__name__ == "ServerDisconnectedError" for e in chain) and endpoint.startswith("http:"):
        return Finding(
            "reachable",
            False,
            f"backend {endpoint}: the store closed the connection without answering (https:// instead "
            "of http://?)",
        )
    if isinstance(error, BackendRefused | errors.AccessDenied):
        code = getattr(error, "backend_code", error.code)
        return Finding(
            "credentials",
            False,
            f"backend {endpoint} refused tsproxy's credentials ({code}): check backend_access_key and "
            "backend_secret_key",
        )
    if isinstance(error, errors.ServiceUnavailable):
        return Finding("reachable", False, f"backend {endpoint}: {error}")
    if isinstance(error, errors.S3Error):
        return Finding("backend", False, f"backend {endpoint} answered {error.code}: {error}")
    return Finding("backend", False, f"backend {endpoint}: {type(error).__name__}: {error}")


async def _step(operation: Awaitable[Any]) -> Any:
    return await asyncio.wait_for(operation, timeout=PROBE_TIMEOUT)


async def probe(
    backend: Backend, namespace: Namespace, endpoint: str, *, write: bool = True
) -> list[Finding]:
    """Check the store as a first request would; stop at the first failure that hides the rest."""
    findings: list[Finding] = []
    bucket = namespace.backend_bucket
    try:
        if bucket is not None:
            await _step(buckets_of(backend).head_bucket(bucket))
            buckets = [bucket]
        else:
            buckets = [name for name, _ in await _step(buckets_of(backend).list_buckets())]
    except errors.NoSuchBucket:
        return [
            Finding("reachable", True, f"backend {endpoint} answers"),
            Finding(
                "bucket",
                False,
                f"backend_bucket {bucket!r} does not exist in {endpoint}: create it, or fix backend_bucket",
            ),
        ]
    except Exception as e:
        return [explain(e, endpoint)]
    findings.append(Finding("reachable", True, f"backend {endpoint} answers"))
    if endpoint.startswith("https:"):
        findings.append(Finding("tls", True, "TLS handshake and certificate accepted"))
    if not endpoint.startswith("file:"):
        findings.append(Finding("credentials", True, "tsproxy's credentials are accepted"))
    if bucket is not None:
        findings.append(Finding("bucket", True, f"backend_bucket {bucket!r} exists"))
    if write:
        findings.append(await _probe_object(backend, namespace, buckets, endpoint))
    return findings


PROBE_BUCKETS_LOOKED_AT = 20  # buckets asked whether they hold tsproxy's objects, without backend_bucket


async def _probe_location(
    backend: Backend, namespace: Namespace, buckets: list[str], name: str
) -> Location | None:
    """Where the probe object goes: the reserved namespace, where no client can name it, of the
    backend bucket, else of a bucket that already holds tsproxy's own objects. Never another bucket:
    a store shared with other applications has buckets tsproxy has no business writing into."""
    if namespace.backend_bucket is not None:
        return Location(namespace.backend_bucket, f"{namespace.backend_prefix}{INTERNAL}{name}")
    for bucket in buckets[:PROBE_BUCKETS_LOOKED_AT]:
        home = namespace.internal(bucket, "")
        try:
            page = await _step(backend.list(home.bucket, prefix=home.key, max_keys=1))
        except Exception:  # another region, or no right to list it: not tsproxy's
            continue
        if page.objects or page.common_prefixes:
            return namespace.internal(bucket, name)
    return None


async def _probe_object(backend: Backend, namespace: Namespace, buckets: list[str], endpoint: str) -> Finding:
    name = f"probe-{secrets.token_hex(8)}"
    where = await _probe_location(backend, namespace, buckets, name)
    if where is None:
        return Finding(
            "objects",
            True,
            "no bucket holds tsproxy's objects yet; write probe skipped (with backend_bucket set, it "
            "writes there)",
        )
    body = f"tsproxy probe {name}".encode()
    step = "write"
    try:
        await _step(backend.put(where.bucket, where.key, body))
        step = "read"
        _, got = await _step(backend.get_bytes(where.bucket, where.key))
        if got != body:
            return Finding("objects", False, f"{where.bucket}/{where.key} read back different bytes")
        step = "delete"
        await _step(backend.delete(where.bucket, where.key))
    except Exception as e:
        found = explain(e, endpoint)
        return Finding("objects", False, f"cannot {step} {where.bucket}/{where.key}: {found.message}")
    return Finding("objects", True, f"wrote, read and deleted {where.bucket}/{where.key}")


def unavailable(reason: str) -> errors.S3Error:
    """The error clients get while the store is down."""
    return errors.ServiceUnavailable(
        f"The object store behind tsproxy is unavailable ({reason}); cached data is still served. "
        "Retry later."
    )


class BackendHealth:
    """Whether the object store is up, from probes and request outcomes; the `tsproxy_backend_up` gauge."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        trip_after: int = TRIP_AFTER,
        trial_every: float = TRIAL_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.trip_after = trip_after
        self.trial_every = trial_every
        self.clock = clock
        self.up = True
        self.reason = ""
        self._failures = 0
        self._last_trial = 0.0  # when the store went down, or the last trial request went through
        metrics.backend_up.set(1)

    def probed(self, findings: list[Finding]) -> None:
        """A probe's result: down if the store is unreachable, refuses tsproxy or lacks its bucket."""
        failed = [f for f in findings if not f.ok and f.check != "objects"]
        if failed:
            self._set(False, failed[0].message)
        else:
            self._set(True, "")

    def outcome(self, error: BaseException | None) -> None:
        """A backend request's outcome (after its retries)."""
        if error is None or not isinstance(error, errors.ServiceUnavailable):
            # Any answer but "unavailable" means the store is there (NoSuchKey is an answer).
            if error is None or isinstance(error, errors.S3Error):
                self._failures = 0
                self._set(True, "")
            return
        self._failures += 1
        if self._failures >= self.trip_after or not self.up:
            self._set(False, str(error.message).rstrip("."))

    def admit(self) -> None:
        """Raise the 503 clients get while the store is down, except for one trial now and then."""
        if self.up:
            return
        now = self.clock()
        if now - self._last_trial >= self.trial_every:
            self._last_trial = now
            return
        raise unavailable(self.reason)

    def _set(self, up: bool, reason: str) -> None:
        was = self.up
        self.up, self.reason = up, reason if not up else ""
        self.metrics.backend_up.set(1 if up else 0)
        if was and not up:
            self._last_trial = self.clock()
            log.error(
                "object store unavailable: uncached reads and writes fail fast with 503 until it is back",
                extra={"fields": {"reason": reason}},
            )
        elif up and not was:
            self._failures = 0
            log.warning("object store available again")


class GuardedBackend:
    """A backend that fails fast while the store is down and reports every outcome to `health`.

    A backend AccessDenied is tsproxy's problem, not the client's: it becomes BackendRefused (503).
    """

    def __init__(self, inner: Backend, health: BackendHealth) -> None:
        self.inner = inner
        self.health = health

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in GUARDED:
            return attr
        health = self.health

        async def guarded(*args: Any, **kwargs: Any) -> Any:
            health.admit()
            try:
                result = await attr(*args, **kwargs)
            except errors.AccessDenied as e:
                refused = BackendRefused("AccessDenied")
                health.outcome(refused)
                raise refused from e
            except errors.S3Error as e:
                health.outcome(e)
                raise
            health.outcome(None)
            return result

        return guarded

    @classmethod
    def wrap(cls, inner: Backend, health: BackendHealth) -> Backend:
        return cast(Backend, cls(inner, health))
