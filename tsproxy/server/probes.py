"""The object store behind tsproxy: probes of it, whether it is up, and failing fast while it is not.

`probe` asks the store, through the `Backend` interface, what a first request would find out too late:
is it reachable, does TLS match, are tsproxy's credentials accepted, does the mapped bucket exist, can an
object be written, read and deleted in the reserved namespace. Each answer is a `Finding`, one line.
`tsproxy serve --check` prints them; `serve` logs the failed ones at start and keeps going, because the
store may come back and the broker beside tsproxy must not be taken down with it.

A probe's `failure` sets the store's up/down state (`store.health.BackendHealth`, the
`tsproxy_backend_up` gauge), which request outcomes move too (`store.health.GuardedBackend`). A store
that answers a probe with a server error (500, 502, 504: `StoreFault`; 503) is down: it answers, but
does not serve.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from typing import Any

from tsproxy import errors
from tsproxy.service.namespace import Location, Namespace
from tsproxy.service.uploads.layout import Layout, probe_name
from tsproxy.store.base import Backend, StoreFault, buckets_of
from tsproxy.store.s3errors import BackendRefused

log = logging.getLogger("tsproxy.backend")

PROBE_TIMEOUT = 10.0  # seconds for each probe step


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
    if isinstance(error, StoreFault):
        return Finding(
            "serving",
            False,
            f"backend {endpoint} answers {error.answer}: it is reachable but does not serve requests",
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


async def _probe_location(backend: Backend, namespace: Namespace, buckets: list[str]) -> Location | None:
    """Where the probe object goes: the reserved namespace, where no client can name it, of the
    backend bucket, else of a bucket that already holds tsproxy's own objects. Never another bucket:
    a store shared with other applications has buckets tsproxy has no business writing into."""
    layout = Layout(namespace)
    top = layout.mapped_reserved()
    if top is not None:
        return Location(top.bucket, top.key + probe_name())
    for bucket in buckets[:PROBE_BUCKETS_LOOKED_AT]:
        home = layout.reserved(bucket)
        try:
            page = await _step(backend.list(home.bucket, prefix=home.key, max_keys=1))
        except Exception:  # another region, or no right to list it: not tsproxy's
            continue
        if page.objects or page.common_prefixes:
            return Location(home.bucket, home.key + probe_name())
    return None


async def _probe_object(backend: Backend, namespace: Namespace, buckets: list[str], endpoint: str) -> Finding:
    where = await _probe_location(backend, namespace, buckets)
    if where is None:
        return Finding(
            "objects",
            True,
            "no bucket holds tsproxy's objects yet; write probe skipped (with backend_bucket set, it "
            "writes there)",
        )
    body = f"tsproxy probe {where.key.rpartition('/')[2]}".encode()
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


def failure(findings: list[Finding]) -> str | None:
    """What makes the store unusable, from a probe's findings (unreachable, refusing tsproxy or lacking
    its bucket: not a failed write probe), or None."""
    failed = [f for f in findings if not f.ok and f.check != "objects"]
    return failed[0].message if failed else None
