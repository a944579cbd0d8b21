# A driver clock that moves only when a test moves it, for tests that call a driver directly.
# Apart from rounds.py: a worker test wants Trio's (mock) clock instead, never this one.
from __future__ import annotations


class ManualClock:
    """A driver's ``clock=``: seconds that stand still until ``advance``. A driver test on it
    reaches a lease's end, a delay or a backoff in one call, with no Trio clock involved."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
