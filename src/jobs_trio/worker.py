# The worker: the claim loop for all its queues, the nursery every claimed job runs in, and the
# teardown.
# Apart from attempt.py (one run's verdict) and drain.py (how SIGTERM reaches the runs).
from __future__ import annotations

import contextlib
import enum
import functools
import inspect
import logging
import os
import socket
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import attrs
import trio

from . import __version__
from .attempt import Outcome, OutcomeKind, run_attempt
from .budget import WRITE_FLOOR, Budget
from .drain import Drain
from .driver import Driver, SettlesWithClaims, settles_with_claims
from .errors import ConfigError, DriverError, JobDrained, RowLocked, ValueRefused
from .instance_id import instance_id
from .lease_lifeline import LeaseLifeline
from .lease_renewal import lease_margin, renew_leases
from .lifecycle import open_own_lifecycle
from .logs import log_event
from .metrics import Metrics, default_metrics
from .outage import Outage
from .presence import announce_presence
from .pruner import DEFAULT_RETENTION, Pruner, Retention
from .records import Claim, QueueStats, WorkerPresence
from .registry import JobDefinition, Registry
from .run_scope import CancelReason, RunScope
from .settler import Settler
from .single_error import unwrap_single_error
from .task_scheduler import TaskScheduler
from .thread_slots import ThreadSlots

if TYPE_CHECKING:
    from .lifecycle import Lifecycle

# How long a claim holds a job without renewal: after a worker dies (kill -9, OOM, a lost
# machine) its jobs are claimable again within this long. 8 s keeps that rescue under 10 s
# even when the death comes just after a renewal; renewals every lease / 3 (~2.7 s) leave
# two missed renewals of slack before a live worker loses its jobs.
DEFAULT_LEASE = 8.0
# The shortest lease a worker takes (see Worker: a claim must come back well inside it).
MIN_LEASE = 1.0

# How long a claim taken ahead of a free slot (``claim_ahead``) waits for one before it is handed
# back, unstarted and uncounted: the most a job waits behind a long one on a busy worker while
# another worker could have run it.
DEFAULT_HOLD_LIMIT = 1.0

# Scheduling passes a teardown whose wait for bodies was cut gives the bodies told to stop
# before it abandons them: enough for a body, and a nursery of its own, to unwind.
_UNWIND_PASSES = 3


class WorkerState(enum.StrEnum):
    """Where a worker is in its run, as ``stats()`` and ``state`` report it."""

    IDLE = "idle"  # started, nothing in flight
    RUNNING = "running"  # started, jobs in flight or held for a slot (claim_ahead)
    DRAINING = "draining"  # a teardown is in progress
    STOPPED = "stopped"  # not started, or torn down


@attrs.frozen
class WorkerStats:
    worker_id: str
    queues: tuple[str, ...]
    state: WorkerState
    in_flight: int
    outcomes: Mapping[OutcomeKind, int]  # every outcome, zero included
    abandoned: tuple[str, ...]  # job ids the last teardown gave up waiting for
    # Each queue's depth as the fleet last observed it (every stats_interval, by one worker of
    # the fleet: at most two intervals old; empty until the first).
    queue_depth: tuple[QueueStats, ...] = ()
    # Jobs claimed ahead of a free slot (claim_ahead), held for one: not in ``in_flight``.
    claimed_ahead: int = 0

    @property
    def interrupted(self) -> int:
        return self.outcomes.get(OutcomeKind.INTERRUPTED, 0)


class Worker:
    """Runs the jobs of ``registry`` from ``driver``. Start it with ``nursery.start(worker.run)``
    or ``async with open_worker(...)``; stop it with ``stop()`` (waits, cancels nothing) or let
    a lifecycle's shutdown drain it (interrupts every held run at once).

    One claim loop serves every queue: each round claims for all queues with a free slot,
    each up to ``concurrency`` (an int for all, or per queue). Idle, it waits for its driver's
    wake-up and looks again at least every ``safety_poll`` seconds; ``poll_interval`` is the
    pause after a failed claim. ``stats_interval`` paces the queue gauges (``fleet_stats``).

    ``claim_ahead`` (0 by default; an int for all queues, or per queue) lets each claim take
    that many jobs beyond the free slots, held for the next slot of their queue: renewed and
    drained like running jobs, handed back uncounted when not started within ``hold_limit``
    seconds. Throughput for short jobs at low concurrency; a worker that dies costs the jobs it
    held no attempt (Claim.ahead; docs/model.md, "Claiming ahead")."""

    def __init__(
        self,
        driver: Driver,
        registry: Registry,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int | Mapping[str, int] = 10,
        lease: float = DEFAULT_LEASE,
        renew_interval: float | None = None,
        poll_interval: float = 1.0,
        safety_poll: float = 30.0,
        worker_id: str | None = None,
        lifecycle: Lifecycle | None = None,
        metrics: Metrics | None = None,
        stats_interval: float | None = 15.0,
        exit_grace: float = 10.0,
        schedule_tasks: bool = True,
        retention: Retention | None = DEFAULT_RETENTION,
        claim_ahead: int | Mapping[str, int] | None = None,
        hold_limit: float = DEFAULT_HOLD_LIMIT,
    ) -> None:
        self.driver = driver
        self.registry = registry
        self.queues = tuple(queues) if queues else tuple(registry.queues())
        if not self.queues:
            raise ConfigError(
                "the worker has no queue to claim from: the registry declares no job",
                fix="declare jobs with @registry.job(...) before starting the worker, "
                "or pass queues=",
            )
        self._limits = _limits(concurrency, self.queues)
        self._ahead = _claim_ahead(claim_ahead, self._limits)
        if any(self._ahead.values()):
            _check_claims_ahead(driver)
        if not hold_limit > 0:
            raise ConfigError(f"hold_limit={hold_limit!r}", fix="give hold_limit > 0 seconds")
        self.hold_limit = float(hold_limit)
        for name, value in (
            ("lease", lease),
            ("poll_interval", poll_interval),
            ("safety_poll", safety_poll),
        ):
            if not value > 0:
                raise ConfigError(f"{name}={value!r}", fix=f"give {name} > 0 seconds")
        if lease < MIN_LEASE:
            # Counted from the claim's send, less a stop margin: shorter than a slow claim's
            # round trip, every claim came back late and was handed back unstarted (a worker
            # that logged jobs.claim.late thousands of times a second and ran nothing).
            raise ConfigError(
                f"lease={lease!r} is shorter than {MIN_LEASE:g} s",
                fix=f"give lease >= {MIN_LEASE:g} seconds (the default is {DEFAULT_LEASE:g}): a"
                " claim must come back well inside its lease, and a run is stopped a margin"
                " before it runs out",
            )
        self.lease = float(lease)
        self.renew_interval = renew_interval if renew_interval is not None else self.lease / 3
        if not 0 < self.renew_interval < self.lease:
            raise ConfigError(
                f"renew_interval={self.renew_interval!r} with lease={self.lease!r}",
                fix="renew more often than the lease lasts (the default is lease / 3)",
            )
        # After a failed claim, the next try; while idle, the longest wait without a look
        # (every driver wakes the loop on new work: LISTEN, in-process, SQLite's own poll).
        self.poll_interval = poll_interval
        self.safety_poll = safety_poll
        self.worker_id = worker_id or instance_id()
        self.exit_grace = exit_grace
        self._lifecycle = lifecycle
        self._metrics = metrics or default_metrics()
        self._stats_interval = stats_interval
        self._state = WorkerState.STOPPED
        self._outcomes: Counter[OutcomeKind] = Counter()
        self._in_flight: Counter[str] = Counter()  # runs holding a slot
        self._unstarted: Counter[str] = Counter()  # claims taken ahead, not yet given a slot
        # Claims taken ahead of a free slot, oldest first per queue (claim order is the queue's
        # order), each waiting for a slot of its queue or its hold limit.
        self._waiting: dict[str, deque[_Held]] = {q: deque() for q in self.queues}
        # A queue whose held claim was handed back claims nothing ahead until a slot frees:
        # else a worker stuck behind a long job would claim and hand back the same job forever.
        self._ahead_paused: set[str] = set()
        self._held_one = trio.lowlevel.ParkingLot()
        self._drain = Drain()
        self._budget = Budget()
        # Claiming stops at once on accept/stop: every idle wait of a claim loop is cancelled,
        # but a claim in flight is not (it may have committed): it is waited for, under the
        # budget, and whatever it claimed is reached by the drain.
        self._claiming_stopped = False
        self._idle_waits: set[trio.CancelScope] = set()
        self._teardown_done = trio.Event()
        self._settler: Settler | None = None
        self._runs: trio.Nursery | None = None
        self._slot_freed = trio.lowlevel.ParkingLot()
        self._threads = ThreadSlots(sum(self._limits.values()), self._on_slot_freed)
        self._abandoned: tuple[str, ...] = ()
        self._settle_peak = 0  # the most settlements that waited at once in the last run
        self._queue_depth: tuple[QueueStats, ...] = ()
        # For a lease after an outage this worker saw, it rescues no lapsed job: their runners,
        # back too, write their results and hand-backs first. Only an outage as long as a
        # renewal interval lapses any lease.
        self._outage = Outage(grace=self.lease, long=self.renew_interval)
        # A driver written before claim(rescue=) rescues lapsed jobs at once after an outage.
        self._asks_rescue = _takes(driver, "claim", "rescue") and (
            not settles_with_claims(driver) or _takes(driver, "settle_and_claim", "rescue")
        )
        # Cron tasks fire from every worker that runs them (off: schedule_tasks=False); the
        # driver's compare-and-set makes each scheduled time fire once per fleet.
        tasks = registry.tasks() if schedule_tasks else []
        scheduler = TaskScheduler(driver, tasks, metrics=self._metrics) if tasks else None
        # Finished jobs are deleted after their age (off: retention=None); the driver's turn
        # record makes one worker of the fleet prune at a time.
        pruner = (
            Pruner(driver, retention, self.worker_id, metrics=self._metrics) if retention else None
        )
        self._services = tuple(s.run for s in (scheduler, pruner) if s is not None)

    # -- what a lifecycle calls ------------------------------------------------------------

    def accept(self, reason: str = "shutdown") -> None:
        """Stop claiming and cancel every held run with reason ``draining``, synchronously:
        told any later, a body that reads its cancellation would hear it only after the
        teardown had spent its whole budget waiting on it."""
        if self._state is WorkerState.STOPPED:
            return
        self._state = WorkerState.DRAINING
        self._stop_claiming(reason)
        if self._drain.cause is not None:
            return  # one drain, told once: a second lifecycle's accept changes nothing
        told = self._drain.signal(JobDrained(worker=self.worker_id, signal=reason))
        log_event("jobs.worker.drain-signalled", worker=self.worker_id, runs=told, reason=reason)

    def bind(self, deadline: float) -> None:
        """Bound the teardown's waits by ``deadline`` (Trio clock); only ever tightens."""
        if self._state is WorkerState.STOPPED:
            # A stopped worker's budget is the NEXT run's: a bind meant for a shutdown that
            # already ended must not pre-spend it.
            return
        self._budget.bind(deadline)

    async def aclose(self) -> Sequence[str]:
        await self.stop()
        return self._abandoned

    # -- public ----------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop claiming and wait for the jobs in flight to finish and be settled. Cancels
        nothing and binds nothing; idempotent, and joins a teardown already in progress."""
        if self._state is WorkerState.STOPPED:
            return
        self._state = WorkerState.DRAINING
        self._stop_claiming("stop")
        await self._teardown_done.wait()

    def stats(self) -> WorkerStats:
        outcomes = {kind: self._outcomes.get(kind, 0) for kind in OutcomeKind}
        return WorkerStats(
            worker_id=self.worker_id,
            queues=self.queues,
            state=self._state,
            in_flight=sum(self._in_flight.values()),
            outcomes=outcomes,
            abandoned=self._abandoned,
            queue_depth=self._queue_depth,
            claimed_ahead=sum(self._unstarted.values()),
        )

    @property
    def state(self) -> WorkerState:
        return self._state

    def _presence(self, started_at: float, now: float) -> WorkerPresence:
        """This worker as it announces itself to the fleet (presence.py)."""
        return WorkerPresence(
            worker_id=self.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=self.queues,
            concurrency=sum(self._limits.values()),
            running=sum(self._in_flight.values()),
            state=self._state.value,
            version=__version__,
            started_at=started_at,
            seen_at=now,
            every=self._stats_interval or 0.0,
        )

    def slot_use(self) -> dict[str, tuple[int, int]]:
        """Each queue's running jobs and slots (its concurrency), for the slot gauges."""
        return {q: (self._in_flight[q], self._limits[q]) for q in self.queues}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Claim and run jobs until stopped; then tear down (see ``_teardown``)."""
        if self._state is not WorkerState.STOPPED:
            raise ConfigError(
                f"worker {self.worker_id} is already {self._state}",
                fix="start a worker once; stop() it before starting it again",
            )
        self._state = WorkerState.IDLE
        self._abandoned = ()
        # Bounded by the jobs a worker holds: at most two settlements per slot and per claim
        # ahead wait for the database before the claiming stops (see _claim_loop). Two, not
        # one: with one, each claim waited for the previous batch's settle to commit, so the
        # two round trips ran one after the other; with two the next claim overlaps the settle
        # (bench/run.py throughput: c=1 +40%, c=10 +15%, issue 16). Per claim ahead too: a
        # settle batch grows with the rate times its round trip, and bounded by the slots
        # alone (20 at c=10) it held the claiming back until the held claims had all run, so
        # every claim's round trip was a stall (bench/worker_cpu.py, c=10 with claim_ahead=32:
        # 1.6 s of a 5.6 s run waiting for settler room, the claim sent with 0 held).
        settler = Settler(
            self.driver,
            capacity=2 * (sum(self._limits.values()) + sum(self._ahead.values())),
            carried_by_claims=settles_with_claims(self.driver),
            retry_cap=self.poll_interval,
            outage=self._outage,
        )
        if self._lifecycle is not None:
            self._lifecycle.register(self)
        self._metrics.watch_slots(self.worker_id, self.slot_use)
        self._metrics.jobs_declared(
            (d.queue, d.name) for d in self.registry if d.queue in self._limits
        )
        torn_down = False
        try:
            async with trio.open_nursery() as service:
                await service.start(settler.run)
                self._settler = settler
                await service.start(
                    functools.partial(
                        renew_leases,
                        self.driver,
                        self._drain,
                        lease=self.lease,
                        interval=self.renew_interval,
                        outage=self._outage,
                    )
                )
                # Keeps the leases when a body blocks the loop, from a thread of its own.
                await service.start(
                    LeaseLifeline(
                        self.driver,
                        self.registry,
                        self.worker_id,
                        lease=self.lease,
                        renew_interval=self.renew_interval,
                        held=lambda: self._drain.held,
                        unwritten=settler.unwritten,
                    ).run
                )
                if self._stats_interval:
                    service.start_soon(self._observe_queues, self._stats_interval)
                    service.start_soon(
                        announce_presence, self.driver, self._presence, self._stats_interval
                    )
                if any(self._ahead.values()):
                    service.start_soon(self._hand_back_overdue)
                async with trio.open_nursery() as runs:
                    self._runs = runs
                    log_event("jobs.worker.started", worker=self.worker_id, queues=self.queues)
                    self._warn_of_undeclared_queues()
                    task_status.started()
                    # The budget covers the claim loops too: the claim each has in flight when
                    # claiming stops is waited for under it, like every other wait of the
                    # teardown (a slow database must not hold a drain past its grace). Under
                    # its WRITES deadline: a claim that committed is an ending decided (its
                    # runs are handed back), which a second signal must not cut to nothing.
                    try:
                        with self._budget.writes:
                            async with trio.open_nursery() as claimers:
                                for started in self._services:
                                    await claimers.start(self._until_claiming_stops, started)
                                claimers.start_soon(self._claim_loop)
                            await self._teardown(settler)
                    except BaseException:
                        # Cancelled from outside, or failed: a sync body's thread is shielded
                        # from its run scope, so stop waiting for it here, or this nursery
                        # would wait for it forever.
                        self._drop_held()
                        for run in self._drain.held:
                            run.abandon()
                        raise
                    self._end_teardown(settler)
                    torn_down = True
                    # Past here only when every run has ended; a run that ignores its
                    # cancellation keeps this nursery open (the lifecycle ends the process).
                    service.cancel_scope.cancel()
        finally:
            # Only a run that failed before its teardown finishes it here: once torn down,
            # the worker may already have been started again, and that run's state is not
            # this one's to reset.
            if not torn_down:
                self._finish_teardown()

    def _warn_of_undeclared_queues(self) -> None:
        """A queue given that no declared job uses (a typo: --queue emials) runs nothing: every
        job claimed from it is of a name this registry does not declare, and is parked."""
        declared = set(self.registry.queues())
        for queue in self.queues:
            if queue not in declared:
                log_event(
                    "jobs.worker.queue-undeclared",
                    logging.WARNING,
                    worker=self.worker_id,
                    queue=queue,
                    declared=sorted(declared),
                    fix="no job of this registry is declared on this queue: check the name, or"
                    " declare the jobs (@registry.job(..., queue=...)) that are enqueued there",
                )

    async def _teardown(self, settler: Settler) -> None:
        """The teardown's waits, under the budget's writes deadline, once the claim loops have
        ended: first for the bodies (under the budget proper, which a second signal ends at
        once), then for the settlements they handed in (which it does not: see Budget)."""
        self._state = WorkerState.DRAINING
        with self._budget.scope:
            await self._all_runs_ended()
        if self._budget.scope.cancelled_caught:
            # A body told to stop a moment ago is most likely unwinding already: a few passes
            # let it hand its ending in (an interrupted attempt, written under the floor),
            # rather than abandon a job that stopped as asked one pass too late.
            for _ in range(_UNWIND_PASSES):
                if not self._bodies_running():
                    break
                await trio.lowlevel.cancel_shielded_checkpoint()
            self._abandon_bodies()
        settler.stop_intake()
        await settler.finished.wait()

    def _end_teardown(self, settler: Settler) -> None:
        if self._budget.writes.cancelled_caught:
            # Both deadlines passed at once: the outer scope caught it, and the bodies still
            # running were not named yet.
            self._abandon_bodies()
            self._abandoned += self._report_unwritten(settler)
            settler.stop_intake()
        # A manual stop cut by its budget (no drain) can leave claims held for a slot that a
        # thread abandoned at the budget still takes: they have no task to end with the runs
        # nursery, and must not start in it (nor in the next run) when that thread ends.
        self._drop_held()
        self._finish_teardown()

    def _bodies_running(self) -> bool:
        """Whether a run whose body has not ended is still held (or a claim held for a slot
        whose hand-back has not been handed in)."""
        return any(not run.settling for run in self._drain.held)

    def _abandon_bodies(self) -> None:
        """The budget ran out on bodies still running: each is named and counted (the process
        exits non-zero), and nothing of it is written: its lease lapses and it runs again
        elsewhere. The settlements already handed in are still written, under the floor."""
        running = [run for run in self._drain.held if not (run.settling or run.abandoned)]
        if running:
            log_event(
                "jobs.worker.wait-cut",
                logging.WARNING,
                worker=self.worker_id,
                running=len(running),
                settling=len(self._drain) - len(running),
                writes_within=round(max(self._budget.writes_deadline - trio.current_time(), 0), 3),
                why="the teardown's budget for bodies ran out (the grace period, or a second"
                " signal); the endings already decided are still written",
            )
        abandoned: list[str] = []
        for run in running:
            abandoned.append(run.job_id)
            # A sync body's thread stops being waited for (its slot stays taken until it
            # really ends); nothing of this run is written.
            run.abandon()
            log_event(
                "jobs.worker.drain-abandoned",
                logging.ERROR,
                worker=self.worker_id,
                job_id=run.job_id,
                job=run.claim.name,
                fix="the body did not stop within the grace period (an async body that "
                "swallows Cancelled or shields itself, a sync body or sync step that does not "
                "call ctx.check_cancelled(), or a step whose record the database did not take "
                "in time); its lease lapses and it runs again elsewhere. Let it stop, check "
                "the database, or raise grace",
            )
        self._abandoned += tuple(abandoned)

    def _report_unwritten(self, settler: Settler) -> tuple[str, ...]:
        """The writes deadline ran out with settlements unwritten: each job is named and
        counted, so the process exits non-zero rather than drop a result silently."""
        unwritten = {s.lease.token: s for s in settler.unwritten()}
        abandoned: list[str] = []
        for run in self._drain.held:
            if not run.settling:
                continue  # a body still running: named with the bodies
            abandoned.append(run.job_id)
            settlement = unwritten.pop(run.claim.token, None)
            log_event(
                "jobs.worker.settle-abandoned",
                logging.ERROR,
                worker=self.worker_id,
                job_id=run.job_id,
                job=run.claim.name,
                outcome=type(settlement).__name__ if settlement else "unknown",
                fix="the database did not take this attempt's settlement before the teardown's"
                f" deadline (the grace period, or {WRITE_FLOOR:g} s after a second signal); its"
                " lease lapses and it runs again elsewhere (at-least-once). Check the database",
            )
        for settlement in unwritten.values():  # handed in by a run no longer held (tick())
            abandoned.append(settlement.lease.job_id)
            log_event(
                "jobs.worker.settle-abandoned",
                logging.ERROR,
                worker=self.worker_id,
                job_id=settlement.lease.job_id,
                outcome=type(settlement).__name__,
            )
        return tuple(abandoned)

    def _finish_teardown(self) -> None:
        # Fresh drain and budget: a signalled drain stays signalled and a spent budget stays
        # spent, so a restarted worker would hand every job a scope born cancelled.
        self._drain = Drain()
        self._budget = Budget()
        self._claiming_stopped = False
        if self._settler is not None:
            self._settle_peak = self._settler.peak
        self._settler = None
        # Handed back at stop, so start -> stop -> start holds one registration. A shutdown
        # that began this teardown still asks aclose() what was abandoned: the lifecycle closes
        # the hooks it told, not the ones registered now.
        if self._lifecycle is not None:
            self._lifecycle.unregister(self)
        self._metrics.unwatch_slots(self.worker_id)
        self._state = WorkerState.STOPPED
        log_event(
            "jobs.worker.stopped",
            worker=self.worker_id,
            abandoned=len(self._abandoned),
            settle_peak=self._settle_peak,
        )
        done, self._teardown_done = self._teardown_done, trio.Event()
        done.set()

    def _holds_jobs(self) -> bool:
        """Whether any job is running or held for a slot (held like a running one: renewed,
        reached by a drain, waited for by stop())."""
        return sum(self._in_flight.values()) + sum(self._unstarted.values()) > 0

    async def _all_runs_ended(self) -> None:
        while self._holds_jobs():
            await self._slot_freed.park()

    async def tick(self) -> list[Outcome]:
        """One claim-and-run round without the claim loop: claim up to each queue's limit, run
        those to their outcomes, settle them, answer the outcomes. For deterministic tests."""
        if self._state is not WorkerState.STOPPED:
            raise ConfigError(
                "tick() runs a round on a worker that is not started",
                fix="use tick() or run(), not both at once",
            )
        outcomes: list[Outcome] = []
        async with trio.open_nursery() as nursery:
            free = self._free_slots()
            if free:
                sent_at = trio.current_time()
                claims = await self.driver.claim(
                    list(free), free, lease=self.lease, worker_id=self.worker_id
                )
                for claim in claims:
                    run, definition = self._hold(claim, sent_at)
                    self._in_flight[claim.queue] += 1
                    nursery.start_soon(self._run_claim, claim, run, definition, outcomes.append)
        return outcomes

    # -- claiming and running --------------------------------------------------------------

    def _open_slots(self, queue: str) -> int:
        """``queue``'s free slots. A thread abandoned at its cancel still runs: it keeps its
        slot until it ends."""
        return self._limits[queue] - self._in_flight[queue] - self._threads.lingering(queue)

    def _free_slots(self) -> dict[str, int]:
        """Each queue with a free slot, and how many."""
        free = {q: self._open_slots(q) for q in self.queues}
        return {q: n for q, n in free.items() if n > 0}

    def _claimable(self) -> dict[str, int]:
        """What the next claim asks of each queue: its free slots, plus its room ahead
        (``claim_ahead`` less the claims already waiting). The room is claimed once half of it
        is free, not job by job: a claim ahead exists to save round trips."""
        want: dict[str, int] = {}
        for q in self.queues:
            free = max(self._open_slots(q), 0)
            ahead = self._ahead[q]
            room = 0 if q in self._ahead_paused else ahead - len(self._waiting[q])
            if not free and room < (ahead + 1) // 2:
                room = 0
            if free + room > 0:
                want[q] = free + room
        return want

    async def _claim_loop(self) -> None:
        """One loop for all the worker's queues: each round is ONE claim for every queue with a
        free slot, each capped at its own (a deep queue never takes another's slots), so an
        idle worker costs the database the same with 1 queue or 50 (issue 20)."""
        while not self._claiming_stopped:
            free = self._claimable()
            if not free:
                with self._idle_wait():
                    await self._slot_freed.park()
                continue
            if self._settler is not None and self._settler.waiting >= self._settler.capacity:
                # Backpressure: the database is not keeping up with the settlements; claiming
                # more would only pile finished work up in memory.
                with self._idle_wait():
                    await self._settler.room()
                continue
            if self._settler is not None and self._settler.stalled:
                # Finished work first: the database could not take the last settlements. Once
                # it can, they are written before this worker claims again (issue 32: a claim
                # that came first took jobs whose results were still waiting here).
                with self._idle_wait():
                    await self._settler.flowing()
                continue
            sent_at = trio.current_time()
            try:
                # Not cancelled when claiming stops: a claim that committed must reach its
                # runs, or its jobs would sit claimed until their leases lapsed and cost them
                # an attempt. The drain still reaches them: hold() cancels them at once. Only
                # the budget (around the claim loop) cuts a claim short.
                claims = await self._claim(free)
            except DriverError as exc:
                self._outage.unreachable()
                log_event(
                    "jobs.worker.claim-failed",
                    logging.WARNING,
                    queues=tuple(free),
                    error=str(exc),
                )
                with self._idle_wait():
                    await trio.sleep(self.poll_interval)
                continue
            self._outage.reached(sent_at)
            assert self._runs is not None
            for claim in claims:
                self._start(self._runs, claim, sent_at)
            got = Counter(claim.queue for claim in claims)
            came_up_short = [q for q, n in free.items() if got[q] < n]
            if came_up_short:
                if claims:
                    # The jobs just claimed start before this task looks for more: the look
                    # (a round trip on some drivers) would otherwise be sent first, and every
                    # job wait for it. Two passes: the first lands in the batch the new tasks
                    # run in, where Trio's order is random; the second is after it.
                    await trio.lowlevel.cancel_shielded_checkpoint()
                    await trio.lowlevel.cancel_shielded_checkpoint()
                with self._idle_wait():
                    await self._wait_for_work_or_slot(came_up_short)
            else:
                # Every queue asked filled all its free slots: more may be waiting.
                await trio.lowlevel.checkpoint()

    async def _claim(self, free: dict[str, int]) -> Sequence[Claim]:
        """One claim for ``free``, carrying the settlements that wait to be written when the
        driver can write both in one round trip (SettlesWithClaims): at concurrency 1 every
        job's settle then rides on the next job's claim."""
        settler = self._settler
        carried = settler.take_for_claim() if settler is not None else []
        options = self._claim_options(free)
        if not carried:
            return await self.driver.claim(
                list(free), free, lease=self.lease, worker_id=self.worker_id, **options
            )
        assert settler is not None
        driver = cast(SettlesWithClaims, self.driver)  # the settler carries only then
        # On any failure nothing of the call was written (one write, or none), and the
        # settler gets the settlements back to write them as it would have.
        try:
            applied, claims = await driver.settle_and_claim(
                [pending.settlement for pending in carried],
                list(free),
                free,
                lease=self.lease,
                worker_id=self.worker_id,
                **options,
            )
        except RowLocked as exc:
            # A row of it locked by another session: a settle alone (no slot to claim for)
            # may have written the rest; the settler keeps what was written and writes the
            # others alone from now on, and this claim goes on without them.
            settler.give_back_locked(carried, exc)
        except ValueRefused:
            settler.give_back(carried, solo=True)
        except DriverError:
            settler.give_back(carried, solo=False)
            raise  # the claim failed: the claim loop's own handling
        except Exception:
            # Not a failure we know (a driver bug, a value it chokes on): as the settler
            # treats one, a refusal of something carried.
            settler.give_back(carried, solo=True)
        except BaseException:
            settler.give_back(carried, solo=False)  # cut by the budget
            raise
        else:
            settler.written(carried, applied)
            return claims
        # Refused: alone from now on, the settler isolates the refused settlement (it never
        # fails a claim again), and this claim goes without them.
        return await self.driver.claim(
            list(free), free, lease=self.lease, worker_id=self.worker_id, **options
        )

    def _claim_options(self, want: Mapping[str, int]) -> dict[str, Any]:
        """What a claim tells its driver beyond the queues and their caps, only when it must:
        a driver is otherwise asked nothing new. A claim asking past a queue's free slots
        tells it those slots (``free=``): the claims past them are marked ahead, and a crash
        here gives their attempts back. Just after an outage, ``rescue=False``: no lapsed job
        (their runners write first, outage.py)."""
        options: dict[str, Any] = {}
        free = {q: max(self._open_slots(q), 0) for q in want}
        if any(n > free[q] for q, n in want.items()):
            options["free"] = free
        if self._asks_rescue and not self._outage.rescue():
            options["rescue"] = False
        return options

    async def _wait_for_work_or_slot(self, came_up_short: Sequence[str]) -> None:
        """Wait until new work may be due in a queue whose claim came up short (the driver's
        wake-up, one look at the next due time for all of them), or a slot frees in a queue
        that may hold more (its claim filled its slots, or it had none free)."""
        may_hold_more = [q for q in self.queues if q not in came_up_short]
        if not may_hold_more:
            # Every queue came up short (an idle worker): only the wake-up can end the wait.
            # Waited for in this task: a nursery's child would take a scheduler pass more to
            # hand the claim loop its wake-up (wake-up to claim sent: 0.17-0.23 ms with one).
            await self._work_may_be_due(came_up_short)
            return
        async with trio.open_nursery() as waits:

            async def work_may_be_due() -> None:
                await self._work_may_be_due(came_up_short)
                waits.cancel_scope.cancel()

            async def slot_freed() -> None:
                while not any(q in self._claimable() for q in may_hold_more):
                    await self._slot_freed.park()
                waits.cancel_scope.cancel()

            waits.start_soon(work_may_be_due)
            if may_hold_more:
                waits.start_soon(slot_freed)

    async def _work_may_be_due(self, queues: Sequence[str]) -> None:
        """The driver's wake-up; but while this worker rescues no lapsed job (after an outage),
        a look every ``poll_interval`` until it does: the wake-up counts a lapsed lease as work
        due now, and would answer at once, every time, to a claim that may not take it."""
        rescue_at = self._outage.rescue_at()
        now = trio.current_time()
        if rescue_at <= now:
            await self.driver.wait_for_work(queues, timeout=self.safety_poll)
        else:
            await trio.sleep(min(self.poll_interval, rescue_at - now))

    async def _until_claiming_stops(
        self,
        service: Callable[..., Awaitable[None]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        # A service (cron fires, retention) stops with the claim loops, as one of their idle
        # waits: accept() and stop() end it before the teardown's wait, so no fire lands and
        # no prune batch runs during a drain.
        with self._idle_wait():
            await service(task_status=task_status)

    @contextlib.contextmanager
    def _idle_wait(self) -> Iterator[None]:
        """A claim loop's wait for work or a slot: cancelled at once when claiming stops."""
        with trio.CancelScope() as scope:
            if self._claiming_stopped:
                scope.cancel()
            self._idle_waits.add(scope)
            try:
                yield
            finally:
                self._idle_waits.discard(scope)

    def _stop_claiming(self, reason: str) -> None:
        if not self._claiming_stopped:
            # The teardown begins here, whatever began it: one line each time.
            log_event(
                "jobs.worker.draining",
                worker=self.worker_id,
                reason=reason,
                in_flight=sum(self._in_flight.values()),
            )
        self._claiming_stopped = True
        for scope in list(self._idle_waits):
            scope.cancel()

    def _hold(self, claim: Claim, sent_at: float) -> tuple[RunScope, JobDefinition | None]:
        """Hold the claim's run scope in the drain (and its lease in the renewals) at once: a
        drain signalled before the run's task starts must still reach it. Its lease is counted
        from ``sent_at``, when the claim was sent: the database set it at some moment after
        that, so the worker's deadline is never later than the database's."""
        definition = self.registry.get(claim.name)
        run = RunScope(claim, definition.timeout if definition else None)
        run.lease_deadline = sent_at + self.lease
        now = trio.current_time()
        if now >= run.lease_deadline - lease_margin(self.lease):
            # Answered after its lease ran out (a stalled database, a paused process): another
            # worker may hold the job already, so its body must not start here. Handed back
            # unstarted and uncounted, as a drained claim is: the write is fenced by this
            # claim's token, so a job another worker took meanwhile is left to it.
            log_event(
                "jobs.claim.late",
                logging.WARNING,
                job_id=claim.job_id,
                job=claim.name,
                waited=round(now - sent_at, 3),
                why="the claim was answered after its lease ran out; handed back unstarted",
            )
            run.cancel(CancelReason.CLAIM_LATE)
        if self._state is WorkerState.IDLE:
            self._state = WorkerState.RUNNING
        self._drain.hold(run)
        return run, definition

    def _start(self, runs: trio.Nursery, claim: Claim, sent_at: float) -> None:
        """Run ``claim`` in a free slot of its queue, or, taken ahead, once one frees."""
        run, definition = self._hold(claim, sent_at)
        queue = claim.queue
        # A slot frees only through _promote, which hands it to the oldest held claim first:
        # an open slot means none is waiting, so a claim never overtakes an older one.
        if self._open_slots(queue) > 0:
            self._begin(runs, run, definition)
            return
        held = _Held(run, definition, trio.current_time() + self.hold_limit)
        self._waiting[queue].append(held)
        self._held_one.unpark_all()  # _hand_back_overdue may be waiting for the first
        self._unstarted[queue] += 1
        # No task until a slot frees (_promote starts one); a cancel while it waits starts one
        # that hands it back.
        run.on_cancel(functools.partial(self._held_cancelled, held))

    def _held_cancelled(self, held: _Held) -> None:
        """A held claim's run was cancelled before a slot was handed to it: by a drain, a lost
        lease or an operator, or at its hold limit by _hand_back_overdue (which took it out of
        _waiting itself). It never starts: a task hands it back, uncounted."""
        held.run.on_cancel(None)
        if not held.overdue:
            self._waiting[held.run.claim.queue].remove(held)
        assert self._runs is not None  # held claims are dropped before the runs nursery ends
        self._runs.start_soon(self._hand_back, held)

    async def _hand_back(self, held: _Held) -> None:
        queue = held.run.claim.queue
        try:
            await self._run_claim(held.run.claim, held.run, held.definition, None, slot_held=False)
        finally:
            # Counted unstarted until its hand-back is handed to the settler: the teardown
            # waits for it like a running job.
            self._unstarted[queue] -= 1
            self._note_idle()
            self._slot_freed.unpark_all()  # the teardown's wait counts these too

    def _drop_held(self) -> None:
        """The worker failed, was cancelled from outside, or its budget ran out with claims
        still held: those are never started nor handed back from here (their leases lapse;
        nothing runs them twice)."""
        for queue, waiting in self._waiting.items():
            for held in waiting:
                held.run.on_cancel(None)
                self._drain.release(held.run)
                self._unstarted[queue] -= 1
            waiting.clear()

    async def _hand_back_overdue(self) -> None:
        """Cancel each held claim whose hold limit has passed (``HELD_TOO_LONG``: its task hands
        it back uncounted), and pause its queue's claiming ahead until one of its jobs ends.
        One task for every held claim: held in claim order with one hold limit, the oldest of
        each queue is always the first due."""
        while True:
            due = [waiting[0].deadline for waiting in self._waiting.values() if waiting]
            if not due:
                await self._held_one.park()
                continue
            await trio.sleep_until(min(due))
            now = trio.current_time()
            for queue, waiting in self._waiting.items():
                while waiting and waiting[0].deadline <= now:
                    held = waiting.popleft()
                    held.overdue = True
                    self._ahead_paused.add(queue)
                    held.run.cancel(CancelReason.HELD_TOO_LONG)

    def _promote(self, queue: str) -> None:
        """Hand the free slots of ``queue`` to its oldest held claims."""
        waiting = self._waiting[queue]
        while waiting and self._open_slots(queue) > 0:
            held = waiting.popleft()
            held.run.on_cancel(None)  # from here a cancel reaches its body, as any run's
            self._unstarted[queue] -= 1
            assert self._runs is not None
            self._begin(self._runs, held.run, held.definition)

    def _begin(self, runs: trio.Nursery, run: RunScope, definition: JobDefinition | None) -> None:
        """Start ``run`` in a slot of its queue. A claim the database marked ahead is recorded
        started by the next renewal; till then a crash here gives its attempt back."""
        self._in_flight[run.claim.queue] += 1
        run.start_unrecorded = run.claim.ahead
        if run.claim.due_at is not None:
            self._metrics.run_started(run.claim.queue, self.driver.now() - run.claim.due_at)
        runs.start_soon(self._run_claim, run.claim, run, definition, None)

    def _on_slot_freed(self) -> None:
        for queue in self.queues:
            self._promote(queue)
        self._slot_freed.unpark_all()

    async def _run_claim(
        self,
        claim: Claim,
        run: RunScope,
        definition: JobDefinition | None,
        report: Any,
        *,
        slot_held: bool = True,
    ) -> None:
        # Held (renewed, reached by a drain) and counted as the lifecycle's in-flight work, so
        # a shutdown's wait covers it, until its settlement is written: a slow database must
        # not turn a finished job into a lapsed one. Released by the settler when that write
        # is confirmed, not by this task waiting for it: the task ends once it has handed the
        # settlement in (a second wake per job, for nothing but that release, was ~5% of the
        # worker's CPU at concurrency 10, issue 16).
        released = _Release(self._drain, run, self._lifecycle)
        handed_in = False
        try:
            outcome = await run_attempt(
                claim,
                definition,
                run,
                registry=self.registry,
                driver=self.driver,
                worker_id=self.worker_id,
                threads=self._threads,
            )
            settler = self._settler
            if outcome.settlement is not None and settler is not None:
                # Handed in synchronously, so the settler writes it before it finishes (the
                # teardown waits for that); the slot is free for the next claim meanwhile, and
                # claims overlap the settles instead of waiting for each batch to commit (the
                # settler's capacity bounds that).
                run.settling = True
                handed_in = settler.hand_in(outcome.settlement, released) is not None
                self._record(claim, outcome, report)
                return
            if outcome.settlement is not None:
                await self.driver.settle([outcome.settlement])  # tick(): no settler running
            self._record(claim, outcome, report)
        finally:
            if not handed_in:
                released()
            if slot_held:
                self._free_slot(claim.queue)

    def _free_slot(self, queue: str) -> bool:
        """Give back a run's slot (answers False: no longer held)."""
        self._in_flight[queue] -= 1
        self._ahead_paused.discard(queue)
        self._promote(queue)
        self._note_idle()
        self._slot_freed.unpark_all()
        return False

    def _note_idle(self) -> None:
        """IDLE once the worker holds no job, running or held for a slot."""
        if self._state is WorkerState.RUNNING and not self._holds_jobs():
            self._state = WorkerState.IDLE

    def _record(self, claim: Claim, outcome: Outcome, report: Any) -> None:
        if report is not None:
            report(outcome)
        self._outcomes[outcome.kind] += 1
        self._metrics.attempt_finished(claim.queue, claim.name, outcome.kind, outcome.seconds)
        # INFO for every outcome, a completion too: at the CLI's default level a busy worker
        # shows the work it does (docs/logging.md); an error only where there is one.
        error = {} if outcome.error is None else {"error": outcome.error}
        log_event(
            f"jobs.attempt.{outcome.kind}",
            logging.INFO,
            job_id=claim.job_id,
            job=claim.name,
            queue=claim.queue,
            attempt=claim.attempt,
            seconds=round(outcome.seconds, 6),
            **error,
        )

    async def _observe_queues(self, interval: float) -> None:
        while True:
            try:
                # The fleet's observation: one worker per interval reads the whole table, the
                # others what it stored (issue 20: a full scan per worker every 15 s was an
                # idle fleet's largest cost). `jobs-trio stats` still reads it exactly.
                observed = tuple(await self.driver.fleet_stats(self.worker_id, interval))
                self._queue_depth = observed
                self._metrics.queues_observed(observed)
            except DriverError as exc:
                log_event("jobs.worker.stats-failed", logging.WARNING, error=str(exc))
            await trio.sleep(interval)


class _Release:
    """What ends a run's hold once its settlement is written (or will not be): the drain stops
    renewing it and the lifecycle stops counting it. Once; a second call does nothing."""

    __slots__ = ("_counted", "_drain", "_run")

    def __init__(self, drain: Drain, run: RunScope, lifecycle: Lifecycle | None) -> None:
        self._drain = drain
        self._run = run
        self._counted = lifecycle.counted() if lifecycle is not None else None

    def __call__(self) -> None:
        self._drain.release(self._run)
        if self._counted is not None:
            self._counted()


@attrs.define
class _Held:
    """A claim taken ahead, waiting for a slot; ``overdue`` once its hold limit (``deadline``)
    has passed without one."""

    run: RunScope  # its claim is run.claim
    definition: JobDefinition | None
    deadline: float
    overdue: bool = False


def _claim_ahead(
    ahead: int | Mapping[str, int] | None, limits: Mapping[str, int]
) -> dict[str, int]:
    if ahead is None:
        return dict.fromkeys(limits, 0)
    if isinstance(ahead, Mapping):
        # A queue this worker does not claim from is a misspelling, not a setting for another
        # worker (this option is new): silently 0, it would turn nothing on.
        unknown = sorted(str(q) for q in ahead if q not in limits)
        if unknown:
            raise ConfigError(
                f"claim_ahead names queues this worker does not claim from: {unknown}",
                fix=f"name only its queues ({', '.join(limits)}), or pass one int for all",
            )
        values = {q: ahead.get(q, 0) for q in limits}
    else:
        values = dict.fromkeys(limits, ahead)
    for queue, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(
                f"claim_ahead {value!r} for queue {queue!r}",
                fix="give each queue 0 (claim only for free slots) or more",
            )
    return values


def _takes(driver: Driver, method: str, keyword: str) -> bool:
    """Whether ``driver.method`` takes ``keyword`` (a keyword the contract added later; a driver
    written before it would fail the call with a TypeError)."""
    try:
        parameters = inspect.signature(getattr(driver, method)).parameters
    except (TypeError, ValueError):  # no signature to read: trust the Protocol
        return True
    return keyword in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def _check_claims_ahead(driver: Driver) -> None:
    """A worker claiming ahead tells its driver each queue's free slots (``claim(free=)``) and
    which held claims have started (``renew(started=)``): a driver written before those
    existed would fail the first claim ahead with a TypeError, so it is refused here."""
    for method, keyword in (("claim", "free"), ("renew", "started")):
        if not _takes(driver, method, keyword):
            raise ConfigError(
                f"claim_ahead needs a driver whose {method}() takes {keyword}=;"
                f" {type(driver).__name__}.{method}() does not",
                fix=f"update the driver to the current contract (docs/drivers.md: {method}), or"
                " leave claim_ahead at 0",
            )


def _limits(concurrency: int | Mapping[str, int], queues: Sequence[str]) -> dict[str, int]:
    if isinstance(concurrency, int):
        limits = dict.fromkeys(queues, concurrency)
    else:
        limits = {q: concurrency.get(q, 10) for q in queues}
    for queue, limit in limits.items():
        if not isinstance(limit, int) or limit < 1:
            raise ConfigError(
                f"concurrency {limit!r} for queue {queue!r}", fix="give each queue >= 1"
            )
    return limits


@contextlib.asynccontextmanager
async def open_worker(
    driver: Driver,
    registry: Registry,
    *,
    lifecycle: Lifecycle | None = None,
    drain_on_shutdown: bool = True,
    grace: float = 25.0,
    # Worker's own options, spelled out (not **options) so that a misspelt one fails the type
    # check; tests/typecheck/test_surface_types.py holds them equal to Worker.__init__'s.
    queues: Sequence[str] | None = None,
    concurrency: int | Mapping[str, int] = 10,
    lease: float = DEFAULT_LEASE,
    renew_interval: float | None = None,
    poll_interval: float = 1.0,
    safety_poll: float = 30.0,
    worker_id: str | None = None,
    metrics: Metrics | None = None,
    stats_interval: float | None = 15.0,
    exit_grace: float = 10.0,
    schedule_tasks: bool = True,
    retention: Retention | None = DEFAULT_RETENTION,
    claim_ahead: int | Mapping[str, int] | None = None,
    hold_limit: float = DEFAULT_HOLD_LIMIT,
) -> AsyncIterator[Worker]:
    """Run a worker for the duration of the block. Leaving normally stops it (waits for the
    jobs in flight); leaving by an exception or a cancel interrupts them (their attempts are
    handed back) and waits at most ``exit_grace`` seconds. The other options are ``Worker``'s.

    Draining is on by default: given no ``lifecycle``, a worker opened in the main thread opens
    one of its own (``grace`` seconds), so SIGTERM and SIGINT drain it and then end the block.
    ``drain_on_shutdown=False`` opts out (the caller drives its own teardown)."""
    worker = Worker(
        driver,
        registry,
        lifecycle=lifecycle,
        queues=queues,
        concurrency=concurrency,
        lease=lease,
        renew_interval=renew_interval,
        poll_interval=poll_interval,
        safety_poll=safety_poll,
        worker_id=worker_id,
        metrics=metrics,
        stats_interval=stats_interval,
        exit_grace=exit_grace,
        schedule_tasks=schedule_tasks,
        retention=retention,
        claim_ahead=claim_ahead,
        hold_limit=hold_limit,
    )
    with unwrap_single_error():
        async with contextlib.AsyncExitStack() as stack:
            if lifecycle is None and drain_on_shutdown:
                worker._lifecycle = await open_own_lifecycle(
                    stack, what="worker", name=worker.worker_id, grace=grace
                )
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                try:
                    yield worker
                except BaseException:
                    worker.accept("exit")
                    worker.bind(trio.current_time() + worker.exit_grace)
                    with trio.CancelScope(shield=True):
                        await worker.stop()
                    raise
                await worker.stop()
