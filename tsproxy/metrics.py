"""Prometheus metrics: every series tsproxy exports, registered in one place.

Each labelled series that operators alert on is created up front (see `Metrics.prime`) so it is present,
at zero, from the first scrape. Names follow Prometheus conventions: `tsproxy_` prefix, base units,
`_total` for counters, `_seconds` and `_bytes` for units.
"""

from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from tsproxy import __version__
from tsproxy.s3.operations import Operation

# A counter's `_created` series doubles every counter in a scrape and no panel or alert reads it.
disable_created_metrics()

# Latency buckets from 1 ms to 60 s: cache hits are sub-millisecond, cold multi-MiB reads take seconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# S3 operations the server knows; primed so that every (operation, status class) series exists.
OPERATIONS = tuple(op.value for op in Operation)
BACKEND_OPERATIONS = (
    "GetObject",
    "HeadObject",
    "PutObject",
    "DeleteObject",
    "ListObjectsV2",
    "CopyObject",
    "CreateMultipartUpload",
    "UploadPart",
    "UploadPartCopy",
    "CompleteMultipartUpload",
    "AbortMultipartUpload",
    "ListMultipartUploads",
    "ListParts",
    "CreateBucket",
    "DeleteBucket",
    "HeadBucket",
    "ListBuckets",
)

# Backend outcomes counted as "not_found" (answers, not failures).
NOT_FOUND = frozenset({"NoSuchKey", "NoSuchBucket", "NoSuchUpload"})
JANITOR_KINDS = ("backend_upload", "upload_state", "temporary")


class Metrics:
    """All tsproxy series on one registry (a fresh registry per server keeps tests independent)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        # Client side.
        self.requests = Counter(
            "tsproxy_requests_total",
            "Client S3 requests by operation and HTTP status.",
            ["operation", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "tsproxy_request_duration_seconds",
            "Client request latency, first byte in to last byte out.",
            ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.client_bytes_in = Counter(
            "tsproxy_client_received_bytes_total",
            "Object bytes received from clients (original bytes).",
            registry=r,
        )
        self.client_bytes_out = Counter(
            "tsproxy_client_sent_bytes_total", "Object bytes sent to clients (original bytes).", registry=r
        )
        self.in_flight = Gauge("tsproxy_requests_in_flight", "Client requests being served.", registry=r)
        self.multipart_in_progress = Gauge(
            "tsproxy_multipart_uploads_in_progress",
            "Client part uploads being received right now.",
            registry=r,
        )
        self.client_timeouts = Counter(
            "tsproxy_client_timeouts_total",
            "Client connections cut off for stalling: header (request headers not sent in time; the "
            "connection is closed) or body (the body stalled; 400 RequestTimeout).",
            ["kind"],
            registry=r,
        )
        self.connections_open = Gauge(
            "tsproxy_connections_open", "Client connections open on the S3 port.", registry=r
        )
        self.event_loop_tasks = Gauge(
            "tsproxy_event_loop_tasks",
            "asyncio tasks alive on the event loop at the scrape (a steady rise is a leak).",
            registry=r,
        )
        self.connections_refused = Counter(
            "tsproxy_connections_refused_total",
            "Client connections closed as they were accepted because max_connections were open.",
            registry=r,
        )
        self.connections_evicted = Counter(
            "tsproxy_connections_evicted_total",
            "Connections that had not yet authenticated a request, closed to make room for a new one.",
            registry=r,
        )
        # Backend side.
        self.backend_requests = Counter(
            "tsproxy_backend_requests_total",
            "Backend requests by operation and outcome (ok or an error code).",
            ["operation", "outcome"],
            registry=r,
        )
        self.backend_retries = Counter(
            "tsproxy_backend_retries_total",
            "Backend requests retried, by operation.",
            ["operation"],
            registry=r,
        )
        self.backend_seconds = Histogram(
            "tsproxy_backend_request_duration_seconds",
            "Backend request latency.",
            ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.backend_bytes_in = Counter(
            "tsproxy_backend_received_bytes_total", "Stored bytes read from the backend.", registry=r
        )
        self.backend_bytes_out = Counter(
            "tsproxy_backend_sent_bytes_total", "Stored bytes written to the backend.", registry=r
        )
        self.backend_up = Gauge(
            "tsproxy_backend_up",
            "1 while the object store serves tsproxy, 0 while it does not: unreachable, refusing "
            "tsproxy's credentials, or answering server errors (5xx) (set by the probes and by request "
            "outcomes).",
            registry=r,
        )
        self.backend_up.set(1)
        # Transform.
        self.transform_original_bytes = Counter(
            "tsproxy_transform_original_bytes_total", "Original bytes of chunks stored.", registry=r
        )
        self.transform_stored_bytes = Counter(
            "tsproxy_transform_stored_bytes_total",
            "Stored bytes of chunks after compression and encryption.",
            registry=r,
        )
        self.transform_cpu_seconds = Counter(
            "tsproxy_transform_cpu_seconds_total",
            "Thread CPU seconds spent transforming, by direction.",
            ["direction"],
            registry=r,
        )
        self.integrity_errors = Counter(
            "tsproxy_integrity_errors_total",
            "Stored data that failed authentication or a checksum.",
            registry=r,
        )
        # Cache.
        self.cache_requests = Counter(
            "tsproxy_cache_requests_total",
            "Chunk cache lookups by result (hit or miss).",
            ["result"],
            registry=r,
        )
        self.cache_bytes = Counter(
            "tsproxy_cache_bytes_total",
            "Chunk bytes served from cache (hit) or fetched (miss).",
            ["result"],
            registry=r,
        )
        self.cache_size = Gauge(
            "tsproxy_cache_size_bytes", "Bytes held by the chunk cache on disk.", registry=r
        )
        self.cache_limit = Gauge("tsproxy_cache_limit_bytes", "Configured chunk cache size.", registry=r)
        self.cache_evictions = Counter(
            "tsproxy_cache_evictions_total",
            "Chunks evicted from the cache to stay within its size.",
            registry=r,
        )
        self.cache_skipped = Counter(
            "tsproxy_cache_skipped_total",
            "Chunks read but not cached because the cache's writes were behind (a slow disk).",
            registry=r,
        )
        self.cache_corrupt = Counter(
            "tsproxy_cache_corrupt_total",
            "Cache entries that failed their checksum and were refetched.",
            registry=r,
        )
        self.cache_resets = Counter(
            "tsproxy_cache_resets_total",
            "Times the chunk cache was found damaged at startup, moved aside and started empty.",
            ["reason"],
            registry=r,
        )
        self.memory_releases = Counter(
            "tsproxy_memory_releases_total",
            "Times the heaps' free memory was offered back to the system after a quiet spell, by result: "
            "released (some went back) or none.",
            ["result"],
            registry=r,
        )
        for result in ("released", "none"):
            self.memory_releases.labels(result)  # present at 0 from the first scrape
        self.singleflight_joins = Counter(
            "tsproxy_singleflight_joins_total",
            "Chunk reads that joined a download already under way.",
            registry=r,
        )
        self.prefetch_chunks = Counter(
            "tsproxy_prefetch_chunks_total",
            "Prefetched chunks by fate: issued, used, wasted (evicted unread).",
            ["state"],
            registry=r,
        )
        self.manifest_cache = Counter(
            "tsproxy_manifest_cache_requests_total",
            "Manifest cache lookups by result.",
            ["result"],
            registry=r,
        )
        self.manifest_stale_served = Counter(
            "tsproxy_manifest_stale_served_total",
            "Objects resolved from a manifest past metadata_ttl because the store was unavailable.",
            registry=r,
        )
        self.manifest_stale_seconds = Histogram(
            "tsproxy_manifest_stale_seconds",
            "How far past metadata_ttl a manifest served during a store outage was.",
            buckets=(1, 10, 60, 300, 900, 3600, 14400, 86400),
            registry=r,
        )
        self.catalog_lookups = Counter(
            "tsproxy_catalog_lookups_total",
            "Listed objects answered from the size catalog (hit) or by a HEAD (miss).",
            ["result"],
            registry=r,
        )
        self.catalog_events = Counter(
            "tsproxy_catalog_events_total",
            "Size catalog activity by event (flush, flush_error, compaction, damaged).",
            ["event"],
            registry=r,
        )
        self.key_ring_reloads = Counter(
            "tsproxy_key_ring_reloads_total",
            "Key ring reloads after the file changed or on SIGHUP, by outcome (ok, error).",
            ["outcome"],
            registry=r,
        )
        self.key_ring_keys = Gauge(
            "tsproxy_key_ring_keys", "Key-encryption keys on the loaded key ring.", registry=r
        )
        self.key_ring_active = Gauge(
            "tsproxy_key_ring_active_info",
            "The active key-encryption key of the loaded ring (1 for its id, no other series).",
            ["kek_id"],
            registry=r,
        )
        self.janitor_removed = Counter(
            "tsproxy_janitor_removed_total",
            "Leftovers the janitor removed, by kind (backend_upload: backend multipart uploads aborted; "
            "upload_state: objects of abandoned client uploads and expired completion records; "
            "temporary: probe objects).",
            ["kind"],
            registry=r,
        )
        self.janitor_runs = Counter(
            "tsproxy_janitor_runs_total",
            "Janitor runs by outcome (ok; error: some leftover could not be listed or removed).",
            ["outcome"],
            registry=r,
        )
        self.build_info = Gauge(
            "tsproxy_build_info",
            "Always 1; the labels say which tsproxy build is running.",
            ["version", "python"],
            registry=r,
        )
        self.build_info.labels(__version__, platform.python_version()).set(1)
        self.prime()

    def backend_request(
        self, op: str, outcome: str, seconds: float, retries: int, bytes_in: int, bytes_out: int
    ) -> None:
        """One backend operation, after its retries (a `store.observe.ReportRequest`)."""
        # A missing key is an answer, not a failure: clients look up objects that may not exist.
        if outcome in NOT_FOUND:
            outcome = "not_found"
        self.backend_requests.labels(op, outcome).inc()
        self.backend_seconds.labels(op).observe(seconds)
        if retries:
            self.backend_retries.labels(op).inc(retries)
        self.backend_bytes_in.inc(bytes_in)
        self.backend_bytes_out.inc(bytes_out)

    def backend_is_up(self, up: bool) -> None:
        """The store's up/down state changed or was confirmed (a `store.health.BackendHealth` hook)."""
        self.backend_up.set(1 if up else 0)

    def catalog_event(self, event: str) -> None:
        """Something the size catalog did (a `service.catalog.SizeCatalog` hook)."""
        self.catalog_events.labels(event).inc()

    def key_ring_loaded(self, key_ids: list[str], active: str) -> None:
        """Describe the key ring in use (at start and after every reload)."""
        self.key_ring_keys.set(len(key_ids))
        self.key_ring_active.clear()
        self.key_ring_active.labels(active).set(1)

    def prime(self) -> None:
        """Create the labelled series operators graph and alert on, so they exist at zero."""
        for op in OPERATIONS:
            self.request_seconds.labels(op)
            for status in ("200", "206", "204", "304", "400", "403", "404", "412", "416", "500", "503"):
                self.requests.labels(op, status)
        for op in BACKEND_OPERATIONS:
            self.backend_seconds.labels(op)
            self.backend_retries.labels(op)
            # "error" stands for the error codes to come, so failure panels have a zero line from the start.
            for outcome in ("ok", "not_found", "error"):
                self.backend_requests.labels(op, outcome)
        for direction in ("store", "read"):
            self.transform_cpu_seconds.labels(direction)
        for result in ("hit", "miss"):
            self.cache_requests.labels(result)
            self.cache_bytes.labels(result)
            self.manifest_cache.labels(result)
            self.catalog_lookups.labels(result)
        for event in ("flush", "flush_error", "compaction", "damaged"):
            self.catalog_events.labels(event)
        for state in ("issued", "used", "wasted"):
            self.prefetch_chunks.labels(state)
        for outcome in ("ok", "error"):
            self.key_ring_reloads.labels(outcome)
            self.janitor_runs.labels(outcome)
        for kind in JANITOR_KINDS:
            self.janitor_removed.labels(kind)
        for kind in ("header", "body"):
            self.client_timeouts.labels(kind)
