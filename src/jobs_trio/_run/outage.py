# What a worker knows of its database being unreachable, and what follows from it: after an
# outage it writes its own finished work before it claims, and takes no lapsed job for a lease.
# Apart because the claim loop, the settler and the renewals all report to it and read it.
from __future__ import annotations

import logging
import math

import trio

from .._core.logs import log_event


class Outage:
    """Told by every driver call of the worker whether the database answered (``reached``) or
    could not be reached (``unreachable``: a ``DriverError``); a call the database answered
    with a refusal is an answer.

    An outage lapses leases across the fleet, and a worker's peers hold what it cannot write:
    the results of bodies that returned during it, the hand-backs of bodies its own lease
    watchdog stopped. Claimed the moment the database is back, those jobs ran again (issue 32:
    36 of 3,000 finished bodies run twice after PostgreSQL stopped for 20 s, every lapsed one
    charged an attempt). So for ``grace`` seconds from the end of an outage this worker SAW, it
    rescues no lapsed job (``rescue_at()``, read by the claim loop): their runners, alive and
    back too, write first.

    Only an outage of at least ``long`` seconds counts: a shorter one lapses no lease (the
    renewals around it reach the database), and a connection killed now and then (a failover,
    ``pg_terminate_backend``) must not keep a fleet from rescuing a dead worker's jobs."""

    def __init__(self, grace: float, long: float) -> None:
        self.grace = grace
        self.long = long
        self._failing = False
        self._failing_since = 0.0
        self._back_at = -math.inf

    def unreachable(self) -> None:
        if not self._failing:
            self._failing = True
            self._failing_since = trio.current_time()

    def reached(self, sent_at: float | None = None) -> None:
        """The database answered a call sent at ``sent_at`` (Trio clock): one held up that long
        (a locked SQLite file, a locked table) was an outage for this worker too."""
        if not self._failing and sent_at is not None:
            self._failing_since = sent_at
            self._failing = True
        if self._failing:
            self._failing = False
            now = trio.current_time()
            if now - self._failing_since < self.long:
                return
            self._back_at = now
            log_event(
                "jobs.worker.database-back",
                logging.WARNING,
                unreachable_for=round(now - self._failing_since, 1),
                rescue_after=round(self.grace, 1),
                why="jobs whose leases lapsed in the outage are left to their own workers"
                " (their results and hand-backs) for one lease before this worker takes them",
            )

    def rescue_at(self) -> float:
        """From when a claim may take lapsed jobs (Trio clock; infinite while unreachable)."""
        return math.inf if self._failing else self._back_at + self.grace
