# SIGTERM and SIGINT held from a long-running command's first moments until its lifecycle listens.
# Apart (and importing nothing heavy) because it must run before the imports that take a second.
from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from types import FrameType


class EarlySignals:
    """Records SIGTERM and SIGINT instead of dying of them: a worker signalled while it still
    imports its application and opens its database (~1 s) exited -15 with an empty log (issue
    32). The lifecycle takes over the signals when it listens, and acts on the ones recorded
    here as if they had just arrived."""

    def __init__(self) -> None:
        self.received: list[str] = []
        # When each arrived (time.monotonic): the grace counts from there (Lifecycle.end_by).
        self.arrived: list[float] = []

    @classmethod
    def install(cls, signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)) -> EarlySignals:
        early = cls()
        for number in signals:
            signal.signal(number, early._record)
        return early

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.arrived.append(time.monotonic())
        self.received.append(signal.Signals(signum).name)


def stopped_at_start(early: EarlySignals | None, what: str) -> bool:
    """Whether a signal came while the command started (before its database was opened):
    then nothing was taken, there is nothing to drain, and it ends at once, saying so."""
    if early is None or not early.received:
        return False
    # Imported here, not at the top: this module is what the console script loads before
    # anything heavy, and the log line's formatting is not light.
    from .._core.logs import log_event

    log_event(f"jobs.{what}.stopped-at-start", signals=tuple(early.received))
    return True
