# The budget a teardown waits under: cancel scopes whose deadlines are bound late, only tightened.
# Apart because every wait of a shutdown is bounded by it, and earliest-wins must hold for all.
from __future__ import annotations

import math

import trio

# How long the writes of endings already decided (an unwound body's hand-back, a returned
# body's result) still get after a bind that leaves them less: a second SIGTERM 5 ms after the
# first cut the wait to zero while 30 drained bodies' hand-backs (~15 ms of writing) were in
# flight, and every one of those jobs lost an attempt to a signal (issue 32). A hand-back is a
# few milliseconds of database work; a database that cannot take it in 2 s is not there.
WRITE_FLOOR = 2.0
# How long before the writes' deadline the wait for bodies ends on a worker that holds a run
# claimed alone (a suspect): abandoned there, that run is told to its driver as no longer alone
# (abandonment.unmark_abandoned_alone), or its lapse would dead-letter it X_KILLED_WORKER for a
# deploy's drain. Without it a grace of WRITE_FLOOR or more cut bodies and writes at the same
# instant, leaving that write nothing. Only the suspect's own grace pays: nothing runs beside it.
ALONE_RESERVE = 0.5


class Budget:
    """Unbounded until something binds it (a manual stop binds nothing). A bind never extends:
    a second signal's zero wins over the grace period, and a later, looser bind is ignored.

    Two deadlines. ``scope`` bounds the waits for BODIES (and everything else a teardown waits
    for): a second signal ends it at once. ``writes`` bounds the writes of endings already
    decided — a claim already sent, settlements handed in — and is never bound to less than
    ``WRITE_FLOOR`` after the moment of the bind that binds it: cutting the wait for a body that
    ignores its cancellation must not cost the bodies that stopped their hand-backs."""

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.writes = trio.CancelScope()

    def bind(self, deadline: float, *, reserve: float = 0.0) -> None:
        """``reserve``: the bodies' wait ends at least that long before the writes' deadline
        (``ALONE_RESERVE``), for a write the abandonment of a body makes."""
        if deadline != math.inf:
            floor = trio.current_time() + WRITE_FLOOR
            self.writes.deadline = min(self.writes.deadline, max(deadline, floor))
        self.scope.deadline = min(self.scope.deadline, deadline, self.writes.deadline - reserve)

    @property
    def deadline(self) -> float:
        return self.scope.deadline

    @property
    def writes_deadline(self) -> float:
        return self.writes.deadline

    @property
    def bound(self) -> bool:
        return self.scope.deadline != math.inf

    @property
    def spent(self) -> bool:
        return self.scope.cancelled_caught or self.scope.cancel_called
