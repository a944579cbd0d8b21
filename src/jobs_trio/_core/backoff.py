# How long a failed attempt waits before the next: exponential, capped, with jitter.
# Apart because it is a policy a job declares, and the only place retry delays are computed.
from __future__ import annotations

import math
import random
from collections.abc import Callable

import attrs

from .boundary import check_seconds, shown
from .errors import InvalidArgument


@attrs.frozen
class Backoff:
    """``base * factor ** (attempt - 1)``, capped at ``cap``, then spread by ±``jitter`` (a
    fraction) so a burst of failures does not come back as a burst of retries."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.2

    def __attrs_post_init__(self) -> None:
        # Every delay is at most ``cap``, so a cap a driver can store (a run-at within
        # MAX_SECONDS) makes every retry's run-at storable, whatever the attempt number.
        check_seconds(self.base, argument="Backoff base")
        check_seconds(self.cap, argument="Backoff cap")
        for name, value, low, high in (
            ("factor", self.factor, 1.0, math.inf),
            ("jitter", self.jitter, 0.0, 1.0),
        ):
            number = (
                value if isinstance(value, float | int) and not isinstance(value, bool) else None
            )
            if number is None or not math.isfinite(number) or not low <= number <= high:
                raise InvalidArgument(
                    f"Backoff {name}",
                    f"{shown(value)} is not a finite number from {low:g} to {high:g}",
                    fix="use base >= 0, factor >= 1, cap >= 0 and 0 <= jitter <= 1",
                )

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        # Clamped: an attempt count is an int4 in storage, and a float cannot hold a larger n.
        raw = self._raw(min(max(attempt - 1, 0), 2**53))
        spread = raw * self.jitter * (2 * rand() - 1)
        return max(0.0, min(self.cap, raw + spread))

    def _raw(self, n: int) -> float:
        if self.base == 0 or self.cap == 0 or self.factor == 1:
            return min(self.cap, self.base)
        # Compare exponents, not powers: factor ** n overflows a float (OverflowError) from
        # attempt 1025 at factor 2, and a retry-forever job gets there.
        if n * math.log(self.factor) >= math.log(self.cap / self.base):
            return float(self.cap)
        return min(self.cap, self.base * self.factor**n)
