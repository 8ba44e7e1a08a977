"""The aiohttp server: S3 requests in, the object service behind, S3 responses out.

- `app`: a running tsproxy (`Proxy`: config, backend, key ring, cache, object service, metrics) and `run`;
- `connections`: the connection limit and the request-header deadline of the S3 port;
- `dispatch`: the one path every S3 request takes (route, authenticate, handler, error, access log);
- `exchange`: one request on its way through, and what a handler may use;
- handlers by resource: `buckets`, `listing`, `object_handlers`, `multipart`, with `headers` and
  `request_body` (the client's body, checked as S3 checks it);
- `ops`: /metrics, /healthz and /readyz on the operations port;
- `startup`: start-up checks (key ring, cache directory, ports) and `serve --check`;
- `probes`: backend probes, the backend's up/down state, failing fast while it is down.
"""

from __future__ import annotations

from tsproxy.server.app import Proxy, check, create_runner, run
from tsproxy.server.dispatch import create_app
from tsproxy.server.ops import create_metrics_app

__all__ = ["Proxy", "check", "create_app", "create_metrics_app", "create_runner", "run"]
