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

    A throttled attempt (SlowDown and its kin) is the store asking for fewer requests: its pause grows
    from `throttle_factor` times the base, and the draw keeps at least half of the ceiling ("equal
    jitter"), so a retry never comes straight back at a store that asked it to slow down.
    """

    max_attempts: int = 5  # total attempts, the first included
    base: float = 0.1  # seconds
    cap: float = 5.0  # seconds
    throttle_factor: float = 5.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base < 0 or self.cap < 0 or self.throttle_factor < 1:
            raise ValueError("backoff times cannot be negative, nor throttle_factor below 1")

    def delay(self, failed_attempt: int, *, throttled: bool = False) -> float:
        """Seconds to wait after attempt `failed_attempt` (1-based) failed (`throttled`: it was told to
        slow down)."""
        base = self.base * self.throttle_factor if throttled else self.base
        ceiling = min(self.cap, base * 2 ** min(failed_attempt - 1, 32))
        return self.rng.uniform(ceiling / 2 if throttled else 0.0, ceiling)

    def allows_another(self, failed_attempt: int) -> bool:
        return failed_attempt < self.max_attempts
