"""Request rate limiting for jobs: a pure token bucket, and the backend request observer that waits on it.

A job's executors share one backend, so every task holds itself to its share of the executor's rate
(see `JobOptions.task_rate`): the executor as a whole never exceeds the rate the operator set.
"""

from __future__ import annotations

import asyncio

from tsproxy.store.observe import ReportRequest


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up. Pure: the caller passes the time.

    `reserve` never refuses: it takes the tokens at once (the balance may go negative, so callers queue
    in arrival order) and says how long to wait before acting. Over any interval that starts with a
    full bucket, the actions allowed to happen by time t are at most burst + rate * t.
    """

    def __init__(self, rate: float, burst: float | None = None, now: float = 0.0) -> None:
        if not rate > 0:
            raise ValueError("rate must be positive")
        self.rate = float(rate)
        self.burst = float(burst) if burst is not None else max(1.0, self.rate)
        if self.burst < 1:
            raise ValueError("burst must be at least 1")
        self._tokens = self.burst
        self._stamp = now

    def reserve(self, now: float, cost: float = 1.0) -> float:
        """Take `cost` tokens; return the seconds to wait from `now` before acting (0.0 when none)."""
        if now > self._stamp:
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
        self._tokens -= cost
        # A hair below zero is float rounding of a refill that was exactly enough, not a reason to wait.
        return 0.0 if self._tokens >= -1e-9 else -self._tokens / self.rate


class RateLimiter:
    """An asyncio front to a TokenBucket; a limiter with rate 0 (or None) never waits."""

    def __init__(self, rate: float | None, burst: float | None = None) -> None:
        self._bucket = TokenBucket(rate, burst, now=asyncio.get_running_loop().time()) if rate else None
        self.waited = 0.0  # seconds spent waiting, for the job's statistics

    async def acquire(self, cost: float = 1.0) -> None:
        """Return when the caller may make `cost` requests."""
        if self._bucket is None:
            return
        delay = self._bucket.reserve(asyncio.get_running_loop().time(), cost)
        if delay > 0:
            self.waited += delay
            await asyncio.sleep(delay)


class RateLimitedRequests:
    """The backend's `on_request` observer for a job: every request waits for the limiter before it
    leaves (retries, resumed GETs and a backend's own HEADs included), and every operation's report
    goes on to `report` (the task's statistics)."""

    def __init__(self, limiter: RateLimiter, report: ReportRequest | None = None) -> None:
        self.limiter = limiter
        self.report = report

    async def before(self, operation: str) -> None:
        await self.limiter.acquire()

    def after(
        self, operation: str, outcome: str, seconds: float, retries: int, bytes_in: int, bytes_out: int
    ) -> None:
        if self.report is not None:
            self.report(operation, outcome, seconds, retries, bytes_in, bytes_out)
