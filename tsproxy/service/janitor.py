"""The janitor: removes, at start and every `janitor_interval`, what crashed or abandoned work left behind.

`kill -9` (or a client that walks away) leaves backend multipart uploads, the state and part data of
client multipart uploads, probe objects and, in the embedded backend, files being written. The janitor
finds them in every client bucket it knows (see service.leftovers for what counts as left over) and
removes those untouched for `leftover_age`. It never touches a live upload: a client upload written to
within that age keeps all its objects, and a backend multipart upload under a live upload's prefix, or
at the key a live upload completes to, is left alone whatever its age; nor an upload this instance holds
part records of (service.uploads.pending), or its backend upload. An upload that no instance has written
anything of (its id carries a ticket, its records are held elsewhere or were lost in a crash) shows only
as its backend upload, which goes once initiated longer than `leftover_age` ago.

An idle upload is listed once more right before it goes, so a part that arrived since the sweep's listing
saves it. Every removal is idempotent, so replicas sweeping the same buckets only repeat each other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC

from tsproxy import errors
from tsproxy.metrics import Metrics
from tsproxy.s3.limits import MAX_DELETE_KEYS
from tsproxy.service import ObjectService
from tsproxy.service.leftovers import (
    Sweep,
    UploadLeftover,
    list_keys,
    plan_sweep,
    spare_completing,
)
from tsproxy.service.namespace import Location
from tsproxy.service.uploads.layout import PROBES, is_probe
from tsproxy.service.uploads.records import COMPLETED_UPLOAD_TTL, UploadState
from tsproxy.store.base import Backend, LeavesLeftovers, MultipartCapable, UploadInfo, multipart_of

log = logging.getLogger("tsproxy.janitor")


@dataclass
class JanitorRun:
    """What one run removed, by kind (metrics.JANITOR_KINDS), and what it could not."""

    removed: Counter[str] = field(default_factory=Counter)
    failures: list[tuple[str, str, str]] = field(default_factory=list)  # (what, error code, message)

    def count(self, kind: str, n: int) -> None:
        if n:
            self.removed[kind] += n

    def failed(self, what: str, e: BaseException) -> None:
        code = e.code if isinstance(e, errors.S3Error) else type(e).__name__
        self.failures.append((what, code, str(e)))


class Janitor:
    """Sweeps the leftovers of every client bucket of `service` (see the module docstring)."""

    def __init__(
        self,
        service: ObjectService,
        *,
        leftover_age: float,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.buckets = service.buckets
        self.uploads = service.uploads
        self.backend: Backend = service.backend
        self.ns = service.ns
        self.layout = service.layout
        self.age = leftover_age
        self.metrics = metrics
        self.clock = clock

    async def run_forever(self, interval: float) -> None:
        """Sweep now, then every `interval` seconds, until cancelled."""
        while True:
            try:
                await self.run_once()
            except Exception:  # a bug must not end the sweeps for good
                log.exception("janitor run failed")
                if self.metrics is not None:
                    self.metrics.janitor_runs.labels("error").inc()
            await asyncio.sleep(interval)

    async def run_once(self) -> JanitorRun:
        """One sweep over every bucket; failures are logged and counted, never raised."""
        run = JanitorRun()
        started = time.monotonic()
        now = self.clock()
        try:
            buckets = [name for name, _ in await self.buckets.list_buckets()]
        except Exception as e:
            run.failed("list of buckets", e)
            buckets = []
        for bucket in buckets:
            try:
                await self._sweep_bucket(bucket, now, run)
            except Exception as e:  # one bucket's trouble does not keep the others dirty
                run.failed(f"bucket {bucket}", e)
        top = self.layout.mapped_reserved()
        if top is not None:  # serve --check's probes of a mapped store
            try:
                await self._sweep_probes(top, now, run)
            except Exception as e:
                run.failed(f"{top.bucket}/{top.key}", e)
        if isinstance(self.backend, LeavesLeftovers):  # the embedded store's files being written
            try:
                run.count("temporary", await self.backend.remove_leftovers(now - self.age))
            except OSError as e:
                run.failed(f"{self.backend!r} temporary files", e)
        self._report(run, time.monotonic() - started)
        return run

    def _report(self, run: JanitorRun, seconds: float) -> None:
        if self.metrics is not None:
            for kind, n in run.removed.items():
                self.metrics.janitor_removed.labels(kind).inc(n)
            self.metrics.janitor_runs.labels("error" if run.failures else "ok").inc()
        for what, code, message in run.failures[:20]:
            fields = {"leftover": what, "error": code, "message": message}
            log.warning("janitor could not remove a leftover", extra={"fields": fields})
        summary = {"removed": dict(run.removed), "failures": len(run.failures), "seconds": round(seconds, 3)}
        level = logging.INFO if run.removed or run.failures else logging.DEBUG
        log.log(level, "janitor run", extra={"fields": summary})

    # -- one bucket ----------------------------------------------------------------------------------

    async def _sweep_bucket(self, bucket: str, now: float, run: JanitorRun) -> None:
        ns, backend = self.ns, self.backend
        root = ns.root(bucket)
        reserved = self.layout.reserved(bucket)
        internal = await list_keys(backend, reserved.bucket, reserved.key)
        # A backend without multipart uploads has none left over.
        multipart = backend if isinstance(backend, MultipartCapable) else None
        uploads = await multipart.list_multipart_uploads(root.bucket, root.key) if multipart else []
        sweep = plan_sweep(internal, root.key, uploads, now, self.age, COMPLETED_UPLOAD_TTL.total_seconds())
        # The uploads this instance holds records of are live, whatever the backend shows of them: their
        # objects, their backend uploads, and what is under their prefix or at their keys.
        held = self.uploads.pending.live(bucket)
        if held:
            names = {e.name for e in held}
            ids = {e.state.backend_upload for e in held}
            prefixes = tuple(self.layout.upload(bucket, e.name).key for e in held)
            keys = [ns.object(bucket, e.state.key).key for e in held]
            sweep = dataclasses.replace(
                sweep,
                uploads=tuple(u for u in sweep.uploads if u.upload_id not in names),
                backend_uploads=tuple(
                    u
                    for u in spare_completing(sweep.backend_uploads, keys)
                    if u.upload_id not in ids and not u.key.startswith(prefixes)
                ),
            )
        for upload in sweep.uploads:
            await self._remove_upload(bucket, root.bucket, upload, sweep.attached.get(upload.upload_id), run)
        await self._delete(root.bucket, list(sweep.completed), "upload_state", run)
        await self._delete(root.bucket, list(sweep.temporary), "temporary", run)
        await self._abort(bucket, root.bucket, await self._abortable(bucket, sweep), run)

    async def _abortable(self, bucket: str, sweep: Sweep) -> list[UploadInfo]:
        """The old backend uploads minus those at the key a live client upload completes to."""
        root = self.ns.root(bucket)
        at_keys = sweep.at_client_keys(root.key)
        if not at_keys or not sweep.live:
            return list(sweep.backend_uploads)
        live_keys: list[str] = []
        for upload in sweep.live:
            try:
                _, data = await self.backend.get_bytes(root.bucket, upload.state_key)
            except errors.NoSuchKey:
                continue  # no state: nothing can complete it
            live_keys.append(self.ns.object(bucket, UploadState.from_bytes(data).key).key)
        spared = spare_completing(at_keys, live_keys)
        return [u for u in sweep.backend_uploads if u not in at_keys or u in spared]

    async def _remove_upload(
        self,
        bucket: str,
        backend_bucket: str,
        seen: UploadLeftover,
        straight: UploadInfo | None,
        run: JanitorRun,
    ) -> None:
        """Remove an idle client upload: its state first (the upload is then gone), then the backend
        upload its parts went straight into (`straight`), then the rest."""
        listed = await list_keys(self.backend, backend_bucket, seen.prefix)
        if not listed:
            return
        upload = UploadLeftover(
            seen.upload_id, seen.prefix, len(listed), sum(i.size for i in listed),
            max(i.modified for i in listed), any(i.key == seen.state_key for i in listed),
            tuple(i.key for i in listed),
        )  # fmt: skip
        now = self.clock()
        if not upload.idle(now, self.age):  # touched since the sweep listed it: live after all
            return
        keys = list(upload.keys)
        # This instance's cached state would keep the upload alive here (UploadPart, ListParts) after
        # every other instance calls it gone.
        self.uploads.forget_upload(bucket, upload.upload_id)
        if upload.has_state:
            keys.remove(upload.state_key)
            await self._delete(backend_bucket, [upload.state_key], "upload_state", run)
        if straight is not None:
            await self._abort(bucket, backend_bucket, [straight], run)
        await self._delete(backend_bucket, keys, "upload_state", run)
        log.info(
            "janitor removed an abandoned multipart upload",
            extra={
                "fields": {
                    "bucket": bucket,
                    "upload_id": upload.upload_id,
                    "objects": upload.objects,
                    "bytes": upload.bytes,
                    "idle_seconds": round(now - upload.newest),
                }
            },
        )

    async def _sweep_probes(self, top: Location, now: float, run: JanitorRun) -> None:
        """The probes at the top of a mapped namespace (`top`: its reserved namespace)."""
        listed = await list_keys(self.backend, top.bucket, top.key + PROBES)
        old = [i.key for i in listed if is_probe(i.key[len(top.key) :]) and now - i.modified >= self.age]
        await self._delete(top.bucket, old, "temporary", run)

    async def _delete(self, backend_bucket: str, keys: list[str], kind: str, run: JanitorRun) -> None:
        for start in range(0, len(keys), MAX_DELETE_KEYS):
            batch = keys[start : start + MAX_DELETE_KEYS]
            failed = await self.backend.delete_many(backend_bucket, batch)
            run.count(kind, len(batch) - len(failed))
            run.failures += [(f"{backend_bucket}/{key}", code, msg) for key, code, msg in failed]

    async def _abort(
        self, bucket: str, backend_bucket: str, uploads: list[UploadInfo], run: JanitorRun
    ) -> None:
        if not uploads:
            return
        backend = multipart_of(self.backend)
        for u in uploads:
            try:
                await backend.abort_multipart(backend_bucket, u.key, u.upload_id)
            except errors.NoSuchUpload:
                continue  # completed or aborted meanwhile
            except Exception as e:
                run.failed(f"{backend_bucket}/{u.key} upload {u.upload_id}", e)
                continue
            run.count("backend_upload", 1)
            fields = {
                "bucket": bucket,
                "key": u.key,
                "upload_id": u.upload_id,
                "initiated": u.initiated.astimezone(UTC).isoformat(),
            }
            log.info("janitor aborted a backend multipart upload", extra={"fields": fields})
