"""Retry timing of an exchange source: Presto's ``RetryState`` without a clock of its own.

The first retry after a success goes out at once; then the delay doubles from ``min_delay`` up to
``max_delay``, each delay scaled by a factor drawn uniformly from ``[1 - jitter, 1 + jitter]``. The
source gives up once ``max_error_duration`` has passed since the first failure with no success in
between. Randomness comes from the ``random.Random`` passed in, so a seeded run repeats exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class BackoffPolicy:
    """Retry settings (Prestissimo's defaults).

    Attributes:
        min_delay: first non-zero delay, seconds (100 ms).
        max_delay: largest delay before jitter, seconds (10 s).
        jitter: relative spread of each delay (0.1 is +-10 %).
        max_error_duration: give up after failing this long, seconds (``exchange.max-error-duration``, 3 min).
    """

    min_delay: float = 0.1
    max_delay: float = 10.0
    jitter: float = 0.1
    max_error_duration: float = 180.0

    def __post_init__(self) -> None:
        if not 0 < self.min_delay <= self.max_delay:
            raise ValueError(f"need 0 < min_delay <= max_delay, got {self.min_delay}, {self.max_delay}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")
        if self.max_error_duration <= 0:
            raise ValueError(f"max_error_duration must be positive, got {self.max_error_duration}")


class RetryState:
    """Failures since the last success of one source.

    Args:
        policy: the retry settings.
        rng: the source of jitter (seeded by the caller).
    """

    def __init__(self, policy: BackoffPolicy, rng: random.Random) -> None:
        self.policy = policy
        self.rng = rng
        self.failures = 0
        self.first_failure_at: float | None = None

    def succeeded(self) -> None:
        """A reply arrived: the next failure starts a new error period."""
        self.failures = 0
        self.first_failure_at = None

    def failed(self, now: float) -> float:
        """Record a failure at ``now``; returns the delay before the next attempt, in seconds."""
        if self.first_failure_at is None:
            self.first_failure_at = now
        self.failures += 1
        if self.failures == 1:
            return 0.0
        # The exponent is capped: 2.0 ** 1024 overflows, which a long max_error_duration reaches.
        base: float = min(self.policy.max_delay, self.policy.min_delay * 2.0 ** min(self.failures - 2, 64))
        return base * (1 + self.policy.jitter * self.rng.uniform(-1.0, 1.0))

    def retry_at(self, now: float) -> float | None:
        """Record a failure at ``now``; returns when to try again, or None to give up.

        The source gives up only once ``max_error_duration`` has passed since the first failure (``now``
        at or past ``give_up_at``); the last delay is cut short to end at that deadline, so the last attempt
        goes out then, and a failure of it gives up.
        """
        delay = self.failed(now)
        give_up_at = self.give_up_at()
        if give_up_at is None or now >= give_up_at:
            return None
        return min(now + delay, give_up_at)

    def start_error_period(self, now: float) -> None:
        """Start the error clock without counting a failure (waiting for a peer that is not up yet)."""
        if self.first_failure_at is None:
            self.first_failure_at = now

    def give_up_at(self) -> float | None:
        """When this error period runs out of time, or None outside an error period."""
        if self.first_failure_at is None:
            return None
        return self.first_failure_at + self.policy.max_error_duration
