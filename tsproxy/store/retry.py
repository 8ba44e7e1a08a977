"""Exponential backoff with full jitter, as a pure policy (the caller sleeps)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Backoff:
    """How often and how patiently to retry a failed backend request.

    Attempt n (1-based) that failed is followed by a pause drawn uniformly from
    [0, min(cap, base * 2**(n-1))]: "full jitter", which spreads the retries of many clients hit by
    the same outage instead of having them return in lockstep.
    """

    max_attempts: int = 5  # total attempts, the first included
    base: float = 0.1  # seconds
    cap: float = 5.0  # seconds
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base < 0 or self.cap < 0:
            raise ValueError("backoff times cannot be negative")

    def delay(self, failed_attempt: int) -> float:
        """Seconds to wait after attempt `failed_attempt` (1-based) failed."""
        ceiling = min(self.cap, self.base * 2 ** min(failed_attempt - 1, 32))
        return self.rng.uniform(0.0, ceiling)

    def allows_another(self, failed_attempt: int) -> bool:
        return failed_attempt < self.max_attempts
