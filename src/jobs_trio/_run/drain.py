# The drain: the run scopes a worker holds, and the one cancel that reaches all of them at once.
# Apart because SIGTERM reaches every running job through here, synchronously, before any wait.
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import trio

from .._core.errors import JobDrained
from .._core.records import ClaimToken
from .run_scope import CancelReason, RunScope


class Drain:
    """A fresh one per worker run: once signalled it stays signalled, so a restarted worker
    must never reuse it (every job it claimed would start cancelled)."""

    def __init__(self) -> None:
        # Keyed by claim token, not job id: a worker can hold two runs of one job (its own
        # lapsed lease re-claimed), and the older one must still be renewed (to learn it is
        # lost) and still be reached by a drain.
        self._held: dict[ClaimToken, RunScope] = {}
        self.cause: JobDrained | None = None  # why it was signalled: worker and signal
        self._first_held = trio.lowlevel.ParkingLot()
        # The lease watchdog's wait (lease_renewal.renew_leases), and how long before its
        # lease deadline a run held meanwhile needs it (its cutoff, or its first renewal):
        # one held with an earlier such time moves the wait's end.
        self._watch: trio.CancelScope | None = None
        self._watch_margin = 0.0

    @property
    def reason(self) -> CancelReason | None:
        return None if self.cause is None else CancelReason.DRAINING

    def hold(self, runs: list[RunScope], lease_deadline: float, *, watched: bool) -> None:
        """Hold ``runs``, one claim's answer: their leases run out at ``lease_deadline`` (one
        for all, counted from when the claim was sent), which the lease watchdog's wait must
        not pass when one of them is ``watched`` (not cancelled already). Per answer, not per
        run: a look at the watchdog's deadline for each was a share of a no-op job (issue 44)."""
        if not runs:
            return
        held = self._held
        if not held:
            self._first_held.unpark_all()  # only the first run wakes the idle renewal loop
        for run in runs:
            held[run.claim.token] = run
        watch = self._watch
        if watch is not None and watched:
            # A claim answered late (a stalled database): its lease, counted from when the
            # claim was sent, may run out before the watchdog would next look.
            cutoff = lease_deadline - self._watch_margin
            if cutoff < watch.deadline:
                watch.deadline = cutoff
        if self.cause is not None:
            # A claim that committed after the drain was signalled (it was in flight): it must
            # not run on, and it is handed back at once.
            for run in runs:
                run.cancel(CancelReason.DRAINING, self.cause)

    async def until_a_run_is_held(self) -> None:
        """Return once a run is held (at once if one is): an idle worker's renewal loop waits
        here instead of waking every interval to renew nothing."""
        while not self._held:
            await self._first_held.park()

    @contextlib.contextmanager
    def watching(self, until: float, *, margin: float) -> Iterator[None]:
        """The lease watchdog's wait: ends at ``until``, or at the cutoff (lease deadline less
        ``margin``) of a run held meanwhile, if that comes sooner."""
        with trio.CancelScope(deadline=until) as scope:
            self._watch, self._watch_margin = scope, margin
            try:
                yield
            finally:
                self._watch = None

    @property
    def watch_ends(self) -> float:
        """When the lease watchdog's wait ends (no later than the first held run's cutoff):
        infinity while it is not waiting."""
        watch = self._watch
        return math.inf if watch is None else watch.deadline

    def release(self, run: RunScope) -> None:
        self._held.pop(run.claim.token, None)

    def release_token(self, token: ClaimToken) -> None:
        """``release`` of the run that holds ``token`` (a written settlement's lease)."""
        self._held.pop(token, None)

    def signal(self, cause: JobDrained) -> int:
        """Cancel every held run, the first ``cause`` kept; answer how many were told."""
        if self.cause is None:
            self.cause = cause
        # A run whose body has ended is held only until its settlement is written: there is
        # nothing left of it to stop, and its verdict is already given.
        running = [run for run in self._held.values() if not run.settling]
        for run in running:
            run.cancel(CancelReason.DRAINING, self.cause)
        return len(running)

    @property
    def held(self) -> list[RunScope]:
        return list(self._held.values())

    def __len__(self) -> int:
        return len(self._held)
