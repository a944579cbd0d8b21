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

    def bind(self, deadline: float) -> None:
        self.scope.deadline = min(self.scope.deadline, deadline)
        if deadline != math.inf:
            floor = trio.current_time() + WRITE_FLOOR
            self.writes.deadline = min(self.writes.deadline, max(deadline, floor))

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
