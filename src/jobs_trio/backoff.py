# How long a failed attempt waits before the next: exponential, capped, with jitter.
# Apart because it is a policy a job declares, and the only place retry delays are computed.
from __future__ import annotations

import random
from collections.abc import Callable

import attrs

from .errors import ConfigError


@attrs.frozen
class Backoff:
    """``base * factor ** (attempt - 1)``, capped at ``cap``, then spread by ±``jitter`` (a
    fraction) so a burst of failures does not come back as a burst of retries."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.2

    def __attrs_post_init__(self) -> None:
        if not (self.base >= 0 and self.factor >= 1 and self.cap >= 0 and 0 <= self.jitter <= 1):
            raise ConfigError(
                f"invalid backoff {self!r}",
                fix="use base >= 0, factor >= 1, cap >= 0 and 0 <= jitter <= 1",
            )

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        raw = min(self.cap, self.base * self.factor ** max(attempt - 1, 0))
        spread = raw * self.jitter * (2 * rand() - 1)
        return max(0.0, min(self.cap, raw + spread))
