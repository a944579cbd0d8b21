# The budget a teardown waits under: a cancel scope whose deadline is bound late, only tightened.
# Apart because every wait of a shutdown is bounded by it, and earliest-wins must hold for all.
# Internal: not part of the public API (docs/reference.md lists the public modules).
from __future__ import annotations

import math

import trio


class Budget:
    """Unbounded until something binds it (a manual stop binds nothing). A bind never extends:
    a second signal's zero wins over the grace period, and a later, looser bind is ignored."""

    def __init__(self) -> None:
        self.scope = trio.CancelScope()

    def bind(self, deadline: float) -> None:
        self.scope.deadline = min(self.scope.deadline, deadline)

    @property
    def deadline(self) -> float:
        return self.scope.deadline

    @property
    def bound(self) -> bool:
        return self.scope.deadline != math.inf

    @property
    def spent(self) -> bool:
        return self.scope.cancelled_caught or self.scope.cancel_called
