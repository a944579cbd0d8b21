# Lease renewal and its watchdog: every held run's lease extended in ONE driver call per interval,
# and each run cancelled `lease-lost` once its lease runs out on the worker's own clock without a
# renewal. Apart because it is the only path a lost lease takes.
from __future__ import annotations

import contextlib
import logging
import math
from collections import Counter
from collections.abc import Sequence

import trio

from .._core.errors import JobsError
from .._core.logs import log_event
from .._core.records import ClaimToken
from ..drivers.contract import Driver
from .drain import Drain
from .outage import Outage
from .run_scope import CancelReason, RunScope


def lease_margin(lease: float) -> float:
    """How long before its lease runs out a run that could not renew is stopped: its body
    needs a moment to unwind, and the next worker may claim the job the instant the lease
    lapses. A quarter of the lease, at most 2 s (8 s leases: stopped 6 s after the last
    renewal was sent)."""
    return min(lease / 4, 2.0)


def expire_lapsed(
    runs: Sequence[RunScope], now: float, margin: float, expired: Counter[str] | None = None
) -> None:
    """Cancel every run whose lease, as this worker last saw it renewed, is about to run out:
    whether the renewals failed or hang, another worker may claim the job at the lapse, and
    two copies of one job must never run at once.

    The job is most likely still this worker's (the database was out of reach, issue 32): its
    run is stopped as ``lease-expired`` and handed back uncounted, fenced by its token. At
    most ``max_attempts`` times per job in this worker's run (``expired`` counts them): a body
    that itself stalls its worker's renewals must still run out of attempts, and is then
    stopped as ``lease-lost`` (its lease lapses, and the next claim counts)."""
    for run in runs:
        if now >= run.lease_deadline - margin and run.reason is None and not run.settling:
            run.renewed_beside(now)  # the lease lifeline's renewal, made while the loop blocked
            if now < run.lease_deadline - margin:
                continue
            log_event(
                "jobs.lease.expired",
                logging.WARNING,
                job_id=run.job_id,
                job=run.claim.name,
                why="no renewal reached the database before the lease ran out; the body is"
                " stopped now, before another worker may claim the job, and handed back",
            )
            reason = CancelReason.LEASE_EXPIRED
            if expired is not None:
                expired[run.job_id] += 1
                if expired[run.job_id] > run.claim.max_attempts:
                    reason = CancelReason.LEASE_LOST
            run.cancel(reason)


async def renew_held(
    driver: Driver, runs: list[RunScope], lease: float, outage: Outage | None = None
) -> None:
    """One renewal round for ``runs``: extend, or cancel the ones lost or operator-cancelled.
    Answers are keyed by claim token: a worker can hold an older run of a job beside a newer
    one (its own lapsed lease re-claimed), and only the newer one's lease is still held."""
    if not runs:
        return
    sent_at = trio.current_time()
    # Claims taken ahead whose bodies started since the last round: recorded with the renewal
    # they ride on (no write of their own), so from here a crash costs them the attempt. Only
    # asked of a driver when there are some: a worker that never claims ahead asks nothing new.
    started = [r.claim.token for r in runs if r.start_unrecorded]
    recorded = frozenset(started)
    try:
        leases = [r.claim.lease for r in runs]
        if started:
            result = await driver.renew(leases, lease=lease, started=started)
        else:
            result = await driver.renew(leases, lease=lease)
    except JobsError as exc:
        # The watchdog stops each run at its own deadline; nothing more to do here than say so.
        if outage is not None:
            outage.unreachable()
        log_event("jobs.lease.renew-failed", logging.WARNING, runs=len(runs), error=str(exc))
        return
    if outage is not None:
        outage.reached(sent_at)
    for run in runs:
        if run.claim.token in result.busy:
            # Another session holds its row locked: still this run's, but not extended. Its
            # own deadline stands (the watchdog stops it there if the lock outlasts it); every
            # other run's renewal went on without waiting for that lock. A settling run's row
            # is most likely held by this worker's own settle: no news, not logged.
            if run.settling:
                continue
            log_event(
                "jobs.lease.row-locked",
                logging.WARNING,
                job_id=run.job_id,
                job=run.claim.name,
                fix="another session holds this job's row locked (pg_locks, pg_stat_activity):"
                " end it, or the run is stopped when its lease runs out",
            )
            continue
        if run.claim.token not in result.held and run.settling:
            # Its settlement may have committed while this renewal was in flight: the job is
            # no longer running because it is done. Whether the write landed or was fenced,
            # the settler says (a real loss is reported there); the body has ended anyway.
            continue
        if run.claim.token not in result.held:
            if run.reason is None:
                log_event("jobs.lease.lost", logging.WARNING, job_id=run.job_id, job=run.claim.name)
            run.cancel(CancelReason.LEASE_LOST)
        else:
            # From when the renewal was SENT: the database set its lease at some moment after
            # that, so this deadline is never later than the database's.
            run.lease_deadline = sent_at + lease
            if run.start_unrecorded and run.claim.token in recorded:
                run.start_unrecorded = False
            if run.claim.token in result.slot_lost:
                if run.reason is None:
                    log_event(
                        "jobs.slot.lost", logging.WARNING, job_id=run.job_id, job=run.claim.name
                    )
                run.cancel(CancelReason.SLOT_LOST)
            if run.claim.token in result.cancel_requested:
                run.cancel(CancelReason.OPERATOR)


async def renew_leases(
    driver: Driver,
    drain: Drain,
    *,
    lease: float,
    interval: float,
    outage: Outage | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Renew every ``interval``; between renewals, wake at the earliest lease cutoff of a held
    run. A renewal that hangs (a row lock, a stalled server) is abandoned at that cutoff, so a
    hung database can delay the watchdog by nothing."""
    margin = lease_margin(lease)
    # Each job's runs this worker stopped at their lease (expire_lapsed's bound).
    expired: Counter[str] = Counter()
    task_status.started()
    next_round = trio.current_time() + interval
    # The runs the last round was sent for. A run held since has its lease counted from when
    # its claim was SENT: its first renewal is due an interval after that, which for a claim
    # answered slowly can be before the next round, even past its cutoff (stopped as lost,
    # though a renewal would have extended it). Runs of the last round are not pulled
    # forward: one whose renewal failed would be renewed again at every wake.
    renewed: set[ClaimToken] = set()
    # How long before its lease deadline a run held meanwhile wakes the watchdog: for its
    # first renewal, or its cutoff, whichever comes first.
    look_ahead = max(margin, lease - interval)
    # After a pause (SIGSTOP, a VM stalled, a body that blocked the loop), the watchdog's wake
    # and the bodies' own timers come due in one pass, in an order Trio randomises: a body
    # that ran first acted on a job whose lease had lapsed, beside the worker that took it.
    first = _LapsedFirst(drain, margin, expired)
    trio.lowlevel.add_instrument(first)
    try:
        while True:
            if not drain.held:
                await drain.until_a_run_is_held()
                next_round = trio.current_time() + interval
            first_renewals = [
                r.lease_deadline - lease + interval
                for r in drain.held
                if r.claim.token not in renewed
            ]
            next_round = min([next_round, *first_renewals])
            now = trio.current_time()
            # A run held after this point whose claim was sent after it has a cutoff no sooner
            # than now + lease - margin: waking by then catches it (an older claim's, watching).
            wake = min([next_round, now + lease - margin, *_cutoffs(drain.held, margin)])
            # Ended sooner by a run held with an earlier cutoff: a claim's lease is counted from
            # when the claim was SENT, so one answered late may run out before this wake.
            with drain.watching(wake, margin=look_ahead):
                await trio.sleep_forever()
            expire_lapsed(drain.held, trio.current_time(), margin, expired)
            if trio.current_time() >= next_round:
                next_round = trio.current_time() + interval
                # Every held run, cancelled ones too: a body still unwinding, or a settlement not
                # yet written, keeps its lease until it is done, or another worker takes the job.
                # Cut at the cutoffs of the runs it renews, not of one held meanwhile (a claim
                # answered late): that run is not in this round, and abandoning the round for it
                # would drop the answer that extends the others, stopping them as lost at their
                # own cutoffs though the database renewed them. It is stopped beside the round.
                runs = drain.held
                renewed = {r.claim.token for r in runs}
                with trio.move_on_at(min([next_round, *_cutoffs(runs, margin)])):
                    async with trio.open_nursery() as beside:
                        beside.start_soon(_expire_held_meanwhile, drain, margin, expired)
                        await renew_held(driver, runs, lease, outage)
                        beside.cancel_scope.cancel()
                expire_lapsed(drain.held, trio.current_time(), margin, expired)
    finally:
        with contextlib.suppress(KeyError):  # Trio drops an instrument whose hook raised
            trio.lowlevel.remove_instrument(first)


class _LapsedFirst(trio.abc.Instrument):
    """Stops each lapsed run as the loop wakes from its wait for I/O, before any task of that
    pass runs and before Trio's own deadlines fire: a body woken in the same pass as the
    watchdog cannot take a step past its lease. A float compare a pass until the watchdog's
    wake is due."""

    def __init__(self, drain: Drain, margin: float, expired: Counter[str]) -> None:
        self._drain = drain
        self._margin = margin
        self._expired = expired

    def after_io_wait(self, timeout: float) -> None:
        now = trio.current_time()
        if now >= self._drain.watch_ends:
            # Runs with a task only: a claim held for a slot takes no step, and its cancel
            # starts the task that hands it back, which is the watchdog's to start (a task
            # started here, outside any task, would not inherit the worker's context).
            running = [run for run in self._drain.held if not run.held_for_slot]
            expire_lapsed(running, now, self._margin, self._expired)


async def _expire_held_meanwhile(drain: Drain, margin: float, expired: Counter[str]) -> None:
    """Stop each run whose cutoff passes while a renewal round is in flight: a run held
    during the round (its claim answered late) may run out before the round's answer."""
    while True:
        with drain.watching(min([math.inf, *_cutoffs(drain.held, margin)]), margin=margin):
            await trio.sleep_forever()
        expire_lapsed(drain.held, trio.current_time(), margin, expired)


def _cutoffs(runs: Sequence[RunScope], margin: float) -> list[float]:
    return [r.lease_deadline - margin for r in runs if r.reason is None and not r.settling]
