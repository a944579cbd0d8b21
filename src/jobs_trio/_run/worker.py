# The worker: a claimed job's run in its nursery (``_run_claim``), the services beside it, and
# its teardown. Apart from where a job is claimed (claim_loop.py), where it waits for a slot
# (slots.py), where it is judged (attempt.py), where it is settled (settler.py) and where a
# drain reaches it (drain.py): this module only joins them.
from __future__ import annotations

import contextlib
import enum
import functools
import logging
import math
import os
import socket
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs
import trio

from .._core.errors import ConfigError, DriverError, JobDrained
from .._core.forked_child import guard_forks, own_pid
from .._core.instance_id import instance_id
from .._core.logs import (
    AttemptLine,
    lines_by_pass,
    log_event,
    log_exception,
)
from .._core.metrics import Metrics, Tally, default_metrics
from .._core.records import Claim, OutcomeKind, QueueStats, Settlement, WorkerPresence
from .._core.single_error import unwrap_single_error
from .._core.version import VERSION as __version__
from .._cron.scheduler import TaskScheduler
from .._jobs.registry import JobDefinition, Registry
from .._retention.pruner import DEFAULT_RETENTION, Pruner, Retention
from ..drivers.contract import Driver
from .abandonment import (
    abandon_at_failure,
    abandon_bodies,
    alone_left_marked,
    bodies_running,
    cut_without_drain,
    report_unwritten,
    unmark_abandoned_alone,
)
from .attempt import Outcome, run_attempt
from .budget import ALONE_RESERVE, Budget
from .claim_loop import ClaimLoop
from .drain import Drain
from .lease_lifeline import LeaseLifeline
from .lease_renewal import lease_margin, renew_leases
from .lifecycle import open_own_lifecycle
from .outage import Outage
from .presence import announce_presence
from .queue_pauses import watch_pauses
from .run_scope import CancelReason, RunScope
from .settler import Settler
from .slots import Slots
from .worker_options import (
    AUTO,
    DEFAULT_HOLD_LIMIT,
    DEFAULT_LEASE,
    MIN_LEASE,
    ClaimAhead,
    worker_options,
)

if TYPE_CHECKING:
    from .lifecycle import Lifecycle

__all__ = [
    "DEFAULT_HOLD_LIMIT",
    "DEFAULT_LEASE",
    "MIN_LEASE",
    "Worker",
    "WorkerState",
    "WorkerStats",
    "open_worker",
]

# The shortest wait after an outage before this worker rescues lapsed jobs (see Outage).
MIN_RESCUE_GRACE = 5.0

# The level of an attempt's line, by its ending: INFO unless it needs a look.
_LEVELS = {OutcomeKind.DEAD_LETTERED: logging.ERROR, OutcomeKind.PARKED: logging.WARNING}

# A run's task's name (Trio's task tree, a debugger), given: left to Trio, it is made from the
# function's module and qualified name at every spawn, a run per claimed job (issue 44).
_RUN_TASK_NAME = "jobs_trio._run.worker.Worker._run_claim"  # the name Trio made

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
    # Its queues an operator paused, as its watch last heard (Driver.queue_pauses): it starts
    # nothing of them until they are resumed.
    paused: tuple[str, ...] = ()

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

    ``claim_ahead`` lets each claim take jobs beyond the free slots, held for the next slot of
    their queue: renewed and drained like running jobs, handed back uncounted when not started
    within ``hold_limit`` seconds. ``"auto"`` (the default) sizes it per queue from the pace of
    its runs: what its slots start in about 20 ms (at most 512), nothing for long jobs or
    before the first run ends, never for a queue with fleet limits; an int (for all queues, or
    per queue) fixes it, 0 turns it off. A worker that dies costs the jobs it held no attempt
    (Claim.ahead; docs/model.md, "Claiming ahead")."""

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
        claim_ahead: ClaimAhead | Mapping[str, ClaimAhead] | None = AUTO,
        hold_limit: float = DEFAULT_HOLD_LIMIT,
    ) -> None:
        self.driver = driver
        self.registry = registry
        self.options = worker_options(
            driver,
            registry,
            queues=queues,
            concurrency=concurrency,
            claim_ahead=claim_ahead,
            hold_limit=hold_limit,
            lease=lease,
            renew_interval=renew_interval,
            poll_interval=poll_interval,
            safety_poll=safety_poll,
        )
        self.queues = self.options.queues
        self.lease = self.options.lease
        # How long before its lease runs out a run that could not renew is stopped; a claim
        # answered past it is handed back unstarted (_hold).
        self._lease_margin = lease_margin(self.lease)
        self.renew_interval = self.options.renew_interval
        self.worker_id = worker_id or instance_id()
        self.exit_grace = exit_grace
        self._lifecycle = lifecycle
        self._metrics = metrics or default_metrics()
        # This worker's attempt counts, for a run (or a tick): counted without a lock, read by
        # the metrics at each scrape, retired into their totals when the run ends.
        self._tally: Tally | None = None
        # Each kind of ending's line for each job it ran, its fixed fields rendered once.
        self._lines: dict[tuple[OutcomeKind, str, str], AttemptLine] = {}
        # The function that releases written runs, for the lifecycle and drain it was made for.
        self._on_written: tuple[Lifecycle | None, Drain, Callable[[Settlement], None]] | None = None
        self._stats_interval = stats_interval
        self._state = WorkerState.STOPPED
        self._outcomes: Counter[OutcomeKind] = Counter()
        self._slots = Slots(
            self.options.limits,
            self.options.ahead,
            self.options.hold_limit,
            start_run=self._start_run,
            on_idle=self._note_idle,
            auto_ahead=self.options.auto_ahead,
        )
        self._drain = Drain()
        self._budget = Budget()
        # For a lease after an outage this worker saw (5 s at least: a runner back from it
        # reconnects and writes within its settler's next retry, a second, on a loaded machine
        # in a few), it rescues no lapsed job: their runners write their results and
        # hand-backs first. Only an outage as long as a renewal interval lapses any lease.
        self._outage = Outage(grace=max(self.lease, MIN_RESCUE_GRACE), long=self.renew_interval)
        self._claims = self._claim_loop()
        self._teardown_done = trio.Event()
        self._ended_by = math.inf  # the last teardown's writes deadline (_goodbye_by)
        self._settler: Settler | None = None
        # The nursery runs start in, and whom their outcomes are reported to (tick()).
        self._runs: trio.Nursery | None = None
        self._report: Callable[[Outcome], object] | None = None
        self._abandoned: tuple[str, ...] = ()
        self._settle_peak = 0  # the most settlements that waited at once in the last run
        self._queue_depth: tuple[QueueStats, ...] = ()
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
        # What this worker's registry declares, as its announcement carries it (presence.py):
        # `jobs-trio enqueue` checks a job's name against the fleet's.
        self._declared = tuple(sorted((d.name, d.queue, d.attempts) for d in registry))

    def _claim_loop(self) -> ClaimLoop:
        return ClaimLoop(
            self.driver,
            self.options,
            self._slots,
            self._outage,
            self.worker_id,
            self._place,
            held=lambda: [run.claim.token for run in self._drain.held],
        )

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
        # A suspect held alone (nothing else runs here): its body's wait ends a little before
        # the writes', so that its abandonment, if it comes to that, can still be written.
        alone = any(run.claim.alone for run in self._drain.held)
        self._budget.bind(deadline, reserve=ALONE_RESERVE if alone else 0.0)

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
            in_flight=sum(self._slots.in_flight.values()),
            outcomes=outcomes,
            abandoned=self._abandoned,
            queue_depth=self._queue_depth,
            claimed_ahead=sum(self._slots.unstarted.values()),
            paused=tuple(sorted(self._slots.paused)),
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
            concurrency=sum(self.options.limits.values()),
            running=sum(self._slots.in_flight.values()),
            state=self._state.value,
            version=__version__,
            started_at=started_at,
            seen_at=now,
            every=self._stats_interval or 0.0,
            jobs=self._declared,
        )

    def slot_use(self) -> dict[str, tuple[int, int]]:
        """Each queue's running jobs and slots (its concurrency), for the slot gauges."""
        return self._slots.use()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Claim and run jobs until stopped; then tear down (see ``_teardown``)."""
        if self._state is not WorkerState.STOPPED:
            raise ConfigError(
                f"worker {self.worker_id} is already {self._state}",
                fix="start a worker once; stop() it before starting it again",
            )
        self._state = WorkerState.IDLE
        self._abandoned = ()
        self._ended_by = math.inf
        guard_forks()
        capabilities = self.driver.capabilities
        # Bounded by the jobs a worker holds: at most two settlements per slot and per claim
        # ahead wait for the database before the claiming stops (see claim_loop.py). Two, not
        # one: with one, each claim waited for the previous batch's settle to commit, so the
        # two round trips ran one after the other; with two the next claim overlaps the settle
        # (bench/run.py throughput: c=1 +40%, c=10 +15%, issue 16). Per claim ahead too: a
        # settle batch grows with the rate times its round trip, and bounded by the slots
        # alone (20 at c=10) it held the claiming back until the held claims had all run, so
        # every claim's round trip was a stall (bench/worker_cpu.py, c=10 with claim_ahead=32:
        # 1.6 s of a 5.6 s run waiting for settler room, the claim sent with 0 held).
        # Claims ahead as sized now: an auto-sized queue's grow and shrink with its pace.
        limits, ahead_of = self.options.limits, self._slots.ahead_of
        settler = Settler(
            self.driver,
            capacity=lambda: 2 * sum(n + ahead_of(q) for q, n in limits.items()),
            carried_by_claims=capabilities.settles_with_claims,
            retry_cap=self.options.poll_interval,
            outage=self._outage,
            worker_id=self.worker_id,
        )
        if self._lifecycle is not None:
            self._lifecycle.register(self)
        self._tally = self._metrics.tally()
        self._metrics.watch_slots(self.worker_id, self.slot_use)
        self._metrics.jobs_declared(
            (d.queue, d.name) for d in self.registry if d.queue in self.options.limits
        )
        torn_down = False
        # A handler that holds attempt lines back (the CLI's) writes them each time this run's
        # loop waits for I/O: a pass at most, a drain included (logs.FlushHeldLines); and where
        # a line goes is looked at once a pass (logs.lines_by_pass).
        try:
            with lines_by_pass():
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
                    # The queues an operator paused: their jobs are not started here (the database
                    # gives no claim any, and the jobs of one held here go back as it is heard).
                    # The watch starts from none paused: what a last run heard may be stale.
                    self._slots.pause(frozenset())
                    await service.start(
                        functools.partial(
                            watch_pauses,
                            self.driver,
                            self.worker_id,
                            self.queues,
                            self._pauses_heard,
                            every=self.options.safety_poll,
                            retry_after=self.options.poll_interval,
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
                            end_by=self._lifecycle.end_by if self._lifecycle else _never,
                        ).run
                    )
                    if self._stats_interval:
                        service.start_soon(self._observe_queues, self._stats_interval)
                        service.start_soon(
                            announce_presence,
                            self.driver,
                            self._presence,
                            self._stats_interval,
                            self._goodbye_by,
                        )
                    if self._slots.claims_ahead():
                        service.start_soon(self._slots.hand_back_overdue)
                    async with trio.open_nursery() as runs:
                        self._runs = runs
                        log_event("jobs.worker.started", worker=self.worker_id, queues=self.queues)
                        self._warn_of_undeclared_queues()
                        task_status.started()
                        # The budget covers the claim loop too: the claim it has in flight when
                        # claiming stops is waited for under it, like every other wait of the
                        # teardown (a slow database must not hold a drain past its grace). Under
                        # its WRITES deadline: a claim that committed is an ending decided (its
                        # runs are handed back), which a second signal must not cut to nothing.
                        try:
                            with self._budget.writes:
                                async with trio.open_nursery() as claimers:
                                    for started in self._services:
                                        await claimers.start(self._claims.until_stopped, started)
                                    claimers.start_soon(self._claims.run, settler)
                                await self._teardown(settler)
                        except BaseException as exc:
                            # Cancelled from outside, or failed: a sync body's thread is shielded
                            # from its run scope, so stop waiting for it here, or this nursery
                            # would wait for it forever.
                            self._slots.drop_held(self._drain)
                            # The settlements not written yet are named by the settler as it
                            # ends (Settler.run), not here: it writes on while the bodies
                            # unwind, and one named here was then written (reported lost, and
                            # a job an operator would run twice). The bodies cut are named here.
                            self._abandoned += abandon_at_failure(self._drain, self.worker_id, exc)
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

    def _goodbye_by(self) -> float:
        """When the presence goodbye must be over: the end of the teardown's budget for writes,
        the one being spent (a teardown cut from outside) or the one just finished."""
        return min(self._budget.writes_deadline, self._ended_by)

    def _pauses_heard(self, paused: frozenset[str]) -> None:
        """The watch heard which of this worker's queues are paused (at start, then at every
        change): the jobs of a newly paused queue held unstarted go back at once, uncounted,
        and no claim asks for it until it is resumed."""
        before = self._slots.paused
        handed_back = self._slots.pause(paused)
        for queue in sorted(handed_back):
            log_event(
                "jobs.worker.queue-paused",
                worker=self.worker_id,
                queue=queue,
                handed_back=handed_back[queue],
                why="an operator paused it: nothing of it starts here until it is resumed;"
                " its running jobs finish",
            )
        for queue in sorted(before - paused):
            log_event("jobs.worker.queue-resumed", worker=self.worker_id, queue=queue)

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

    # -- the teardown ------------------------------------------------------------------------

    async def _teardown(self, settler: Settler) -> None:
        """The teardown's waits, under the budget's writes deadline, once the claim loop has
        ended: first for the bodies (under the budget proper, which a second signal ends at
        once), then for the settlements they handed in (which it does not: see Budget)."""
        self._state = WorkerState.DRAINING
        with self._budget.scope:
            await self._slots.all_ended()
        if self._budget.scope.cancelled_caught:
            # A body told to stop a moment ago is most likely unwinding already: a few passes
            # let it hand its ending in (an interrupted attempt, written under the floor),
            # rather than abandon a job that stopped as asked one pass too late.
            for _ in range(_UNWIND_PASSES):
                if not bodies_running(self._drain):
                    break
                await trio.lowlevel.cancel_shielded_checkpoint()
            self._abandoned += abandon_bodies(self._drain, self._budget, self.worker_id)
        settler.stop_intake()
        # Beside the settler's own writes (its task), under the same writes deadline.
        await unmark_abandoned_alone(self._drain, self.driver, self.worker_id)
        await settler.finished.wait()

    def _end_teardown(self, settler: Settler) -> None:
        if self._budget.writes.cancelled_caught:
            # Both deadlines passed at once: the outer scope caught it, and the bodies still
            # running were not named yet.
            cut = abandon_bodies(self._drain, self._budget, self.worker_id)
            self._abandoned += cut
            alone_left_marked(self._drain, cut, self.worker_id)
            self._abandoned += report_unwritten(self._drain, settler, self.worker_id)
            settler.stop_intake()
        # A manual stop cut by its budget (no drain) can leave claims held for a slot that a
        # thread abandoned at the budget still takes: they have no task to end with the runs
        # nursery, and must not start in it (nor in the next run) when that thread ends.
        self._slots.drop_held(self._drain)
        self._finish_teardown()

    def _finish_teardown(self) -> None:
        # Fresh drain, budget and claim loop: a signalled drain stays signalled, a spent budget
        # stays spent and a stopped loop stays stopped, so a restarted worker would hand every
        # job a scope born cancelled.
        self._drain = Drain()
        self._ended_by = self._budget.writes_deadline
        self._budget = Budget()
        self._claims = self._claim_loop()
        if self._settler is not None:
            self._settle_peak = self._settler.peak
            self._abandoned += self._settler.dropped  # named as it ended (a failed worker)
        self._settler = None
        # Handed back at stop, so start -> stop -> start holds one registration. A shutdown
        # that began this teardown still asks aclose() what was abandoned: the lifecycle closes
        # the hooks it told, not the ones registered now.
        if self._lifecycle is not None:
            self._lifecycle.unregister(self)
        self._metrics.unwatch_slots(self.worker_id)
        self._retire_tally()
        self._state = WorkerState.STOPPED
        log_event(
            "jobs.worker.stopped",
            worker=self.worker_id,
            abandoned=len(self._abandoned),
            settle_peak=self._settle_peak,
        )
        done, self._teardown_done = self._teardown_done, trio.Event()
        done.set()

    def _stop_claiming(self, reason: str) -> None:
        if not self._claims.stopped:
            # The teardown begins here, whatever began it: one line each time.
            log_event(
                "jobs.worker.draining",
                worker=self.worker_id,
                reason=reason,
                in_flight=sum(self._slots.in_flight.values()),
            )
        self._claims.stop()
        if self._settler is not None:
            # No claim will carry what waits to be written now: the settler writes it alone.
            self._settler.claims_stopped()

    async def tick(self) -> list[Outcome]:
        """One claim-and-run round without the claim loop: claim up to each queue's limit, run
        those to their outcomes, settle them, answer the outcomes. For deterministic tests."""
        if self._state is not WorkerState.STOPPED:
            raise ConfigError(
                "tick() runs a round on a worker that is not started",
                fix="use tick() or run(), not both at once",
            )
        outcomes: list[Outcome] = []
        self._tally = self._metrics.tally()
        try:
            await self._tick(outcomes)
        finally:
            self._retire_tally()
        return outcomes

    async def _tick(self, outcomes: list[Outcome]) -> None:
        async with trio.open_nursery() as nursery:
            free = self._slots.free()
            if free:
                sent_at = trio.current_time()
                claims = await self.driver.claim(
                    list(free), free, lease=self.lease, worker_id=self.worker_id
                )
                self._runs, self._report = nursery, outcomes.append
                try:
                    runs, definitions = self._hold(claims, sent_at, trio.current_time())
                    for run, definition in zip(runs, definitions, strict=True):
                        self._slots.begin_now(run, definition)
                finally:
                    self._runs, self._report = None, None

    def _retire_tally(self) -> None:
        if self._tally is not None:
            self._metrics.retire(self._tally)
            self._tally = None

    # -- a claim, from its answer to its settlement handed in ------------------------------

    def _place(self, claims: Sequence[Claim], sent_at: float) -> None:
        """The claims an answer brought: each held at once, then run in a slot or held for one.
        Per answer, not per job: one look at the clock, one lease deadline (issue 44)."""
        now = trio.current_time()
        place = self._slots.place
        runs, definitions = self._hold(claims, sent_at, now)
        for run, definition in zip(runs, definitions, strict=True):
            place(run, definition, now)

    def _hold(
        self, claims: Sequence[Claim], sent_at: float, now: float
    ) -> tuple[list[RunScope], list[JobDefinition | None]]:
        """Hold each claim's run scope in the drain (and its lease in the renewals) at once: a
        drain signalled before the run's task starts must still reach it. Their lease is counted
        from ``sent_at``, when the claim was sent: the database set it at some moment after
        that, so the worker's deadline is never later than the database's. Answers the runs
        and their definitions as two lists: a pair per claim was ~100 objects alive during a
        claim's answer at concurrency 50, when a garbage collection is most likely (issue 44)."""
        lease_deadline = sent_at + self.lease
        # Answered after its lease ran out (a stalled database, a paused process): another
        # worker may hold the jobs already, so their bodies must not start here. Handed back
        # unstarted and uncounted, as a drained claim is: the write is fenced by each claim's
        # token, so a job another worker took meanwhile is left to it.
        late = now >= lease_deadline - self._lease_margin
        if claims and self._state is WorkerState.IDLE:
            self._state = WorkerState.RUNNING
        definition_of, owner = self.registry.get, own_pid()
        paused = self._slots.paused
        definitions = []
        runs = []
        watched = False  # whether a run is held that is not cancelled already
        for claim in claims:
            definition = definition_of(claim.name)
            run = RunScope(claim, definition.timeout if definition else None, owner)
            run.lease_deadline = lease_deadline
            if paused and claim.queue in paused:
                # Claimed a moment before its queue was paused, answered after this worker heard
                # of it: not started, as a held job of it is not (the pause's row of docs/model.md).
                run.cancel(CancelReason.QUEUE_PAUSED)
            elif late:
                log_event(
                    "jobs.claim.late",
                    logging.WARNING,
                    job_id=claim.job_id,
                    job=claim.name,
                    waited=round(now - sent_at, 3),
                    why="the claim was answered after its lease ran out; handed back unstarted",
                )
                run.cancel(CancelReason.CLAIM_LATE)
            else:
                watched = True
            runs.append(run)
            definitions.append(definition)
        self._drain.hold(runs, lease_deadline, watched=watched)
        return runs, definitions

    def _start_run(
        self, run: RunScope, definition: JobDefinition | None, done: Callable[[RunScope], None]
    ) -> None:
        """Start ``run``'s task in the runs nursery (Slots calls this: a slot for it, or its
        hand-back unstarted)."""
        assert self._runs is not None  # runs start only while the runs nursery is open
        if run.claim.due_at is not None and not run.reason:
            waited = self.driver.now() - run.claim.due_at
            if self._tally is not None:
                self._tally.run_started(run.claim.queue, waited)
        self._runs.start_soon(
            self._run_claim, run, definition, self._report, done, name=_RUN_TASK_NAME
        )

    async def _run_claim(
        self,
        run: RunScope,
        definition: JobDefinition | None,
        report: Callable[[Outcome], object] | None,
        done: Callable[[RunScope], None],
    ) -> None:
        # Held (renewed, reached by a drain) and counted as the lifecycle's in-flight work, so
        # a shutdown's wait covers it, until its settlement is written: a slow database must
        # not turn a finished job into a lapsed one. Released by the settler when that write
        # is confirmed (_written), not by this task waiting for it: the task ends once it has
        # handed the settlement in (a second wake per job, for nothing but that release, was
        # ~5% of the worker's CPU at concurrency 10, issue 16).
        claim = run.claim
        lifecycle = self._lifecycle
        if lifecycle is not None:
            lifecycle.work_began()
        handed_in = False
        try:
            try:
                outcome = await run_attempt(
                    claim,
                    definition,
                    run,
                    registry=self.registry,
                    driver=self.driver,
                    worker_id=self.worker_id,
                    threads=self._slots.threads,
                )
            except trio.Cancelled:
                # Not its run scope's (that one run_attempt judges): the worker is going away
                # without a drain. Named here, unless the teardown named it first.
                if not run.abandoned:
                    cut_without_drain(run, self.worker_id)
                    self._abandoned += (run.job_id,)
                raise
            settler = self._settler
            if outcome.settlement is not None and settler is not None:
                # Handed in synchronously, so the settler writes it before it finishes (the
                # teardown waits for that); the slot is free for the next claim meanwhile, and
                # claims overlap the settles instead of waiting for each batch to commit (the
                # settler's capacity bounds that).
                run.settling = True
                handed_in = (
                    settler.hand_in(outcome.settlement, self._written(lifecycle)) is not None
                )
                self._record(claim, outcome, report)
                return
            if outcome.settlement is not None:
                await self.driver.settle([outcome.settlement])  # tick(): no settler running
            self._record(claim, outcome, report)
        finally:
            if not handed_in:
                self._drain.release(run)
                if lifecycle is not None:
                    lifecycle.work_ended()
            done(run)

    def _written(self, lifecycle: Lifecycle | None) -> Callable[[Settlement], None]:
        """What ends a run's hold once its settlement is written (or will not be): the drain
        stops renewing it and the lifecycle it was counted by stops counting it. One function
        for every run of a lifecycle (the settler calls it once a settlement), none made per
        run: it finds the run by its settlement's token."""
        drain = self._drain
        made = self._on_written
        if made is not None and made[0] is lifecycle and made[1] is drain:
            return made[2]
        written = _release_when_written(drain, lifecycle)
        self._on_written = (lifecycle, drain, written)
        return written

    def _note_idle(self) -> None:
        """IDLE once the worker holds no job, running or held for a slot."""
        if self._state is WorkerState.RUNNING:
            self._state = WorkerState.IDLE

    def _record(
        self, claim: Claim, outcome: Outcome, report: Callable[[Outcome], object] | None
    ) -> None:
        if report is not None:
            report(outcome)
        kind = outcome.kind
        self._outcomes[kind] += 1
        if self._tally is not None:
            self._tally.attempt_finished(claim.queue, claim.name, kind, outcome.seconds)
        # INFO for every outcome, a completion too: at the CLI's default level a busy worker
        # shows the work it does (docs/logging.md); an error only where there is one. A dead
        # letter at ERROR with its exception (an error tracker's event) and a parked job at
        # WARNING: each needs a look (issue 46).
        if outcome.error is None:
            key = (kind, claim.name, claim.queue)
            line = self._lines.get(key)
            if line is None:
                # Keyed by names a body ran under: bounded by the registry (a name it does not
                # declare is parked, with an error, and takes the line below).
                line = self._lines[key] = AttemptLine(f"jobs.attempt.{kind}", *key[1:])
            line.log(claim.job_id, claim.attempt, outcome.seconds)
            return
        fields = {
            "job_id": claim.job_id,
            "job": claim.name,
            "queue": claim.queue,
            "attempt": claim.attempt,
            "seconds": round(outcome.seconds, 6),
            "error": outcome.error,
        }
        level = _LEVELS.get(kind, logging.INFO)
        if outcome.exc_info is not None:
            log_exception(f"jobs.attempt.{kind}", level, outcome.exc_info, **fields)
        else:
            log_event(f"jobs.attempt.{kind}", level, **fields)

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
    claim_ahead: ClaimAhead | Mapping[str, ClaimAhead] | None = AUTO,
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


def _never() -> float | None:
    """No lifecycle: no signal ends this worker, and no grace runs out."""
    return None


def _release_when_written(
    drain: Drain, lifecycle: Lifecycle | None
) -> Callable[[Settlement], None]:
    """``Worker._written``'s function, made here: made in that method, its two variables were
    cells of every call's frame, two objects a job for the garbage collector (issue 44)."""

    def written(settlement: Settlement) -> None:
        drain.release_token(settlement.lease.token)
        if lifecycle is not None:
            lifecycle.work_ended()

    return written
