# The run scope of one claimed job: the cancel scope its body runs under, and the first reason
# it was cancelled for. Apart because the outcome of an attempt is decided HERE, from the scope.
from __future__ import annotations

import contextlib
import enum
import math
import time
from collections.abc import Callable, Iterator

import trio

from .._core.errors import Aborted, HandedBack, JobsError, JobTimeout, SlotLost
from .._core.forked_child import own_pid
from .._core.records import Claim
from .._core.shared_keys import share_keys

# The longest timeout whose deadline, less the timeout, still gives the time it was set at to
# well under a microsecond (a deadline below ~2**21 s has a float step under a nanosecond).
_EXACT_TIMEOUT = 1e6


class CancelReason(enum.StrEnum):
    """Why a run was cancelled: the first reason given wins. The values are Trio's cancel
    reasons and the words of the log lines, as they were when these were bare strings."""

    TIMEOUT = "timeout"  # the run's own deadline
    LEASE_LOST = "lease-lost"  # a renewal found the lease gone: another worker may hold the job
    # No renewal reached the database before the lease ran out (it was unreachable, or the
    # renewal hung): the job is most likely still this worker's, handed back uncounted.
    LEASE_EXPIRED = "lease-expired"
    DRAINING = "draining"  # the process is going away
    OPERATOR = "cancelled"  # an operator cancelled the job
    SLOT_LOST = "slot-lost"  # the run's fleet slot lapsed and another run took it
    HELD_TOO_LONG = "held-too-long"  # claimed ahead, no slot freed within the hold limit
    CLAIM_LATE = "claim-late"  # the claim was answered after its lease ran out
    QUEUE_PAUSED = "queue-paused"  # held for a slot (or just claimed) when its queue was paused


class RunScope:
    """One attempt's cancel scope. Every cancel goes through ``cancel`` so the first reason is
    kept; a deadline that fired first reads as ``timeout`` whatever came after it."""

    # What a run starts with, on the class: set on the instance only when it changes (a run is
    # made per claimed job, and ten assignments were a tenth of a no-op job's bookkeeping).
    _reason: CancelReason | None = None
    # Whether its scope has a deadline (the body's clock started): until it does, every
    # cancel is ``cancel``'s, with its reason, and ``reason`` needs no look at Trio's clock.
    _timed = False
    _cause: JobsError | None = None
    # A sync body's thread, or a sync step's, is waited for under a scope of its own
    # (``thread_scope``); several at once when a body runs sync steps side by side. Empty
    # until the first (a set of its own then).
    _thread_scopes: set[trio.CancelScope] | frozenset[trio.CancelScope] = frozenset()
    # A claim taken ahead hears a cancel through this while it waits for a slot (``on_cancel``).
    _on_cancel: Callable[[], object] | None = None
    # Set at the teardown's budget: nothing of this run is written, its lease lapses.
    abandoned = False
    # The worker's own view of the lease, on the Trio clock: renewals move it; when it
    # passes with the database unreachable, the run is cancelled as lost rather than
    # racing the worker that may claim it next.
    lease_deadline = math.inf
    # The body has ended and its settlement waits to be written: still renewed (a slow
    # database must not turn a finished job into a lapsed one), no longer stopped.
    settling = False
    # A claim taken ahead whose body has started, the start not yet recorded by a renewal:
    # until it is, a crash of this worker gives the attempt back (Claim.ahead).
    start_unrecorded = False
    # When it took a slot of a queue whose claims ahead its pace sizes (Trio clock; None for
    # the others): the slot's time, read when it frees.
    slot_taken_at: float | None = None
    # When its body ended (Trio clock), set by the attempt as it measures the body's time: the
    # slot's release in the same scheduling step reads it rather than the clock (issue 44).
    ended_at: float | None = None
    # Until when (time.monotonic) the lease lifeline's last renewal holds the lease: set
    # from its thread while a body blocks the loop, where the Trio clock cannot be read.
    beside_until = -math.inf
    # A sync body that returned in its thread: its result and its seconds, set from that
    # thread before the Trio loop hears of it (the lease lifeline writes it if the loop stays
    # blocked).
    returned_in_thread: tuple[object, float] | None = None

    def __init__(self, claim: Claim, timeout: float | None, owner: int | None = None) -> None:
        self.claim = claim
        self.timeout = timeout
        # The worker's process: a child a body forks is not it, and ends (forked_child.py).
        self.owner = own_pid() if owner is None else owner
        # No deadline until the body starts (``start_clock``): a job's timeout is its body's
        # time, not the time it spent waiting for a thread.
        self.cancel_scope = trio.CancelScope()

    @property
    def job_id(self) -> str:
        return self.claim.job_id

    def start_clock(self) -> None:
        """The body starts now: its timeout counts from here."""
        if self.timeout is None:
            return
        self._timed = True
        deadline = trio.current_time() + self.timeout
        self.cancel_scope.deadline = deadline
        if self._reason is not CancelReason.DRAINING:
            for thread in self._thread_scopes:
                thread.deadline = min(thread.deadline, deadline)

    def start_clock_at_entry(self) -> None:
        """The body starts as the run scope is entered: its timeout counts from then. Set as
        Trio's relative deadline, which the entry makes absolute: one registration of the
        deadline with Trio's run loop where ``start_clock`` inside the scope costs two (issue
        35). Only before the scope is entered, and only for an async body (a sync body's clock
        starts when its thread does, see ThreadSlots)."""
        if self.timeout is not None:
            self._timed = True
            self.cancel_scope.relative_deadline = self.timeout

    def clock_started_at(self) -> float:
        """When the body's clock started, read just inside the scope ``start_clock_at_entry``
        set: the entry read Trio's clock to make the deadline, and a read of its own was one of
        five a job made (issue 44). A timeout past ``_EXACT_TIMEOUT`` leaves the deadline's
        float too coarse to give the start back (1e300 s: none of it): the clock is read."""
        timeout = self.timeout
        if timeout is None or timeout > _EXACT_TIMEOUT:
            return trio.current_time()
        return self.cancel_scope.deadline - timeout

    def renewed_beside(self, now: float) -> None:
        """Move ``lease_deadline`` (Trio clock, ``now``) to where the lease lifeline's renewal
        put the lease, if that is later: renewed while the loop was blocked, the run must not
        be stopped as lapsed the moment the loop runs again."""
        beside = now + (self.beside_until - time.monotonic())
        if beside > self.lease_deadline:
            self.lease_deadline = beside

    def cancel(self, reason: CancelReason, cause: JobsError | None = None) -> None:
        # Reading cancel_called first lets a deadline that has already passed register as
        # the first reason (Trio checks the deadline there), so a late drain cannot mask it.
        if self.cancel_scope.cancel_called:
            return
        self._reason = reason
        self._cause = cause or self._cause_of(reason)
        self.cancel_scope.cancel(reason=reason.value)
        if self._on_cancel is not None:
            self._on_cancel()
        for thread in self._thread_scopes:
            if reason is CancelReason.DRAINING:
                # A drain WAITS for a thread (Trio cannot stop one, and handing the job back
                # while it runs is two runs at once): from here the budget bounds it, not its
                # timeout (nor a step's).
                thread.deadline = math.inf
            else:
                thread.cancel()  # abandoned: the thread runs on, its result goes nowhere

    def abandon(self) -> None:
        """The teardown's budget is spent: stop waiting for this run (a thread is left to end on
        its own), and write nothing for it."""
        self.abandoned = True
        for thread in self._thread_scopes:
            thread.cancel()

    @property
    def held_for_slot(self) -> bool:
        """Claimed ahead and waiting for a slot: no task yet, a cancel heard through
        ``on_cancel``."""
        return self._on_cancel is not None

    def on_cancel(self, callback: Callable[[], object] | None) -> None:
        """Call ``callback`` when the run is cancelled (at once if it already is); None stops
        that. How a claim taken ahead, which has no task until its slot frees, hears a drain,
        a lost lease, an operator's cancel or its hold limit: a task per held claim, waiting on
        an event, was ~8% of the worker's CPU at concurrency 10 (issue 16); a cancel scope per
        held claim, 7% before that."""
        self._on_cancel = callback
        if callback is not None and self._reason is not None:
            callback()

    @contextlib.contextmanager
    def thread_scope(self, deadline: float = math.inf) -> Iterator[trio.CancelScope]:
        """The scope a sync body's or sync step's thread is waited for under: shielded from
        the run scope, so a drain does not abandon the thread; cancelled — the thread
        abandoned — by the run's own deadline, ``deadline`` (a step's timeout), a lost lease,
        an operator's cancel, or ``abandon``. It swallows its own cancel: a caller tells a
        thread that returned by what it set inside."""
        deadline = min(deadline, self.cancel_scope.deadline)
        with trio.CancelScope(shield=True, deadline=deadline) as scope:
            if not self._thread_scopes:
                self._thread_scopes = set()
            assert isinstance(self._thread_scopes, set)
            self._thread_scopes.add(scope)
            if self.abandoned or self._reason not in (None, CancelReason.DRAINING):
                scope.cancel()
            try:
                yield scope
            finally:
                assert isinstance(self._thread_scopes, set)
                self._thread_scopes.discard(scope)

    @property
    def reason(self) -> CancelReason | None:
        """The first reason this run was cancelled for, or None while it was not."""
        # Read three times a run: a look at the scope reads Trio's clock, and only a deadline
        # can cancel it without a reason recorded here.
        if self._reason is not None or not self._timed:
            return self._reason
        if not self.cancel_scope.cancel_called:
            return None
        return CancelReason.TIMEOUT

    @property
    def cause(self) -> JobsError | None:
        """The typed error that says why the run was cancelled (``X_DRAINING``, ``JOB_TIMEOUT``,
        ``X_ABORTED``), or None while it was not. Trio thread only."""
        reason = self.reason
        return None if reason is None else (self._cause or self._cause_of(reason))

    def cause_in_thread(self, thread_abandoned: bool) -> JobsError | None:
        """``cause``, read from a sync body's thread, where Trio's clock cannot be read: a
        thread abandoned with no reason recorded was abandoned at its deadline."""
        if self._cause is not None:
            return self._cause
        return self._cause_of(CancelReason.TIMEOUT) if thread_abandoned else None

    def _cause_of(self, reason: CancelReason) -> JobsError:
        job = f"job {self.claim.name!r} ({self.claim.job_id})"
        if reason is CancelReason.TIMEOUT:
            return JobTimeout(
                f"{job} ran past its timeout of {self.timeout}s",
                fix="raise the job's timeout=, or make the body finish sooner",
            )
        if reason is CancelReason.LEASE_LOST:
            return Aborted(
                f"{job} lost its lease: another worker may hold it now",
                fix="nothing: the worker that holds the job runs it",
            )
        if reason is CancelReason.LEASE_EXPIRED:
            return HandedBack(
                f"interrupted: {job} was stopped when its lease ran out before a renewal reached"
                " the database (unreachable, or a renewal that hung); handed back to the queue,"
                " its attempt uncounted (unless another worker claimed it meanwhile: then that"
                " worker runs it)",
                fix="nothing for this job: an outage is not its fault. If it recurs, look at the"
                " database's availability and the worker's latency to it, or raise the lease",
            )
        if reason is CancelReason.OPERATOR:
            return Aborted(f"{job} was cancelled by an operator", fix="nothing: it will not run")
        if reason is CancelReason.SLOT_LOST:
            return SlotLost(
                f"interrupted: {job} lost its fleet slot (its lease lapsed and another run took"
                " it); the job was handed back to the queue with its attempt uncounted",
                fix="nothing for this job: it runs again when a slot frees. If it recurs, the"
                " worker's renewals are late: look at its database latency and lease",
            )
        if reason is CancelReason.HELD_TOO_LONG:
            return HandedBack(
                f"interrupted: {job} was claimed ahead and no slot of its worker freed in time;"
                " handed back to the queue unstarted, its attempt uncounted",
                fix="nothing for this job: the next free worker runs it. If it recurs, lower"
                " the worker's claim_ahead for queues whose jobs run long",
            )
        if reason is CancelReason.CLAIM_LATE:
            return HandedBack(
                f"interrupted: {job} was claimed, but the claim was answered after its lease"
                " ran out; handed back to the queue unstarted, its attempt uncounted (unless"
                " another worker claimed it meanwhile: then that worker runs it)",
                fix="nothing for this job. If it recurs, the database answers claims slower"
                " than the lease: look at its latency and load, or raise the worker's lease",
            )
        if reason is CancelReason.QUEUE_PAUSED:
            return HandedBack(
                f"interrupted: {job} was claimed but not started when an operator paused its"
                f" queue {self.claim.queue!r}; handed back to the queue unstarted, its attempt"
                " uncounted",
                fix="nothing for this job: it runs once the queue is resumed"
                " (`jobs-trio resume QUEUE`)",
            )
        return Aborted(f"{job} was told to stop ({reason})", fix="let it propagate")


share_keys(RunScope, "claim", "timeout", "owner", "cancel_scope")
