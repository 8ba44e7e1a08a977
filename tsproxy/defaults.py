"""The one home of every default value: the settings object (config.py), the objects derived from it
(TransformSettings, ChunkReader, the backend) and the jobs and the Spark source all refer to these.

Plain values, no imports of tsproxy, so that every layer (format included) can refer to them. docs/CONFIG.md
lists them; tests/config checks that it does.
"""

from __future__ import annotations

from typing import Final, Literal

# Where tsproxy listens.
LISTEN = ("127.0.0.1", 9000)
METRICS_LISTEN = ("127.0.0.1", 9102)
REGION = "us-east-1"  # the region tsproxy reports and the Spark source signs for

# The object store behind it.
BACKEND = "file://./tsproxy-data"
BACKEND_PATH_STYLE = True
BACKEND_PART_SIZE = 25 << 20
BACKEND_CHECK = 10.0  # seconds between backend probes; 0: only the one at start
BACKEND_MAX_ATTEMPTS = 5
# seconds a backend request may wait for a connection, and for the next bytes of an answer, per attempt
BACKEND_CONNECT_TIMEOUT = 10.0
BACKEND_READ_TIMEOUT = 60.0

# How new objects are stored.
CHUNK_SIZE = 4 << 20
COMPRESSION: Final = "auto"
# 1 keeps the broker's CPU for the broker; on Kafka-like batches it compresses 1.3-1.5x faster than 3
# with stored sizes within a few percent.
COMPRESSION_LEVEL = 1
ENCRYPTION = True
# The stored format version new objects are written in; 1 until every reader reads 2 (docs/OPERATIONS.md).
FORMAT_VERSION = 2
KEY_RING_CHECK = 30.0  # seconds
ALLOW_INSECURE_KEY_RING = False  # refuse a key ring file that group or others may access

# Reading and caching.
CACHE_DIR = "./tsproxy-cache"
CACHE_SIZE = 1 << 30
# Cache entry files written with O_DIRECT where the file system allows it: "auto", a forward reader's only.
CACHE_DIRECT_IO: bool | Literal["auto"] = "auto"
CACHE_ENCRYPT = True  # no effect (kept for old configs): cached chunks are stored bytes, sealed as stored
MEMORY_CACHE_SIZE = 32 << 20
MALLOC_MMAP_THRESHOLD = 8 << 20  # see tsproxy/memory.py; 0: glibc's own (moving) threshold
MALLOC_TRIM_THRESHOLD = 64 << 20  # see tsproxy/memory.py; 0: glibc's own (128 KiB once fixed)
MALLOC_ARENAS = 2  # see tsproxy/memory.py; 0: glibc's own (eight a core)
MALLOC_IDLE_RELEASE = 10.0  # seconds without a request before the heaps' free memory goes back; 0: never
PREFETCH = 16 << 20
METADATA_TTL = 5.0  # seconds
METADATA_STALE_IF_ERROR = 3600.0  # seconds past METADATA_TTL a manifest is served while the store is down

# The process.
ANONYMOUS = False
LOG_LEVEL = "info"
ACCESS_LOG = True  # one JSON line per client request (logger tsproxy.access)
SHUTDOWN_GRACE = 30.0  # seconds
TRANSFORM_THREADS = 0  # 0: one per core, at least 2
MAX_CLOCK_SKEW = 900.0  # seconds
HEADER_TIMEOUT = 10.0  # seconds a client has to send a request's headers, from its first byte
BODY_IDLE_TIMEOUT = 20.0  # seconds a request body may stall before 400 RequestTimeout (as S3 does)
MAX_CONNECTIONS = 1024  # open client connections; more are closed as they are accepted
LEFTOVER_AGE = 24 * 3600.0  # seconds untouched before the janitor removes an upload's leftovers
JANITOR_INTERVAL = 3600.0  # seconds between janitor runs (one runs at start); 0: no janitor
# Multipart part records: "deferred" writes them once an upload is quiet for UPLOAD_RECORD_DELAY seconds
# (or at a graceful stop); "eager" writes each before its part is answered.
UPLOAD_RECORDS: Final = "deferred"
UPLOAD_RECORD_DELAY = 2.0  # seconds

# Maintenance jobs (`tsproxy jobs`).
JOB_CONCURRENCY = 8  # objects in flight per task
JOB_THREADS = 2  # CPU threads per task
JOB_STALE_AFTER = 24 * 3600.0  # seconds a multipart upload may sit idle before it counts as stale
