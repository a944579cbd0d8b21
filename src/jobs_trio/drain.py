# The drain: the run scopes a worker holds, and the one cancel that reaches all of them at once.
# Apart because SIGTERM reaches every running job through here, synchronously, before any wait.
from __future__ import annotations

from .records import ClaimToken
from .run_scope import DRAINING, RunScope


class Drain:
    """A fresh one per worker run: once signalled it stays signalled, so a restarted worker
    must never reuse it (every job it claimed would start cancelled)."""

    def __init__(self) -> None:
        # Keyed by claim token, not job id: a worker can hold two runs of one job (its own
        # lapsed lease re-claimed), and the older one must still be renewed (to learn it is
        # lost) and still be reached by a drain.
        self._held: dict[ClaimToken, RunScope] = {}
        self.reason: str | None = None

    def hold(self, run: RunScope) -> None:
        self._held[run.claim.token] = run
        if self.reason is not None:
            # A claim that was in flight when the drain was signalled: it must not run on.
            run.cancel(self.reason)

    def release(self, run: RunScope) -> None:
        self._held.pop(run.claim.token, None)

    def signal(self, reason: str = DRAINING) -> int:
        """Cancel every held run with ``reason``; answer how many were told."""
        if self.reason is None:
            self.reason = reason
        held = list(self._held.values())
        for run in held:
            run.cancel(reason)
        return len(held)

    @property
    def held(self) -> list[RunScope]:
        return list(self._held.values())

    def __len__(self) -> int:
        return len(self._held)
