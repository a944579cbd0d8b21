# A Hypothesis state machine over every ordering of enqueue, start, run, clock, manual stop,
# shutdown signals, restart, shielded bodies returning, sync bodies finishing and claims coming
# back mid-drain, checking DESIGN's invariants 1 and 4-8 after every step.
from __future__ import annotations

import math
import threading
import time
from typing import Any

import attrs
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import jobs_trio._run.worker as worker_module
from jobs_trio import Registry
from jobs_trio._core.backoff import Backoff
from jobs_trio._core.errors import ValueRefused
from jobs_trio._core.records import Complete, JobState, Retry
from jobs_trio._run.attempt import Outcome
from jobs_trio._run.budget import ALONE_RESERVE, WRITE_FLOOR
from jobs_trio._run.lifecycle import Lifecycle
from jobs_trio._run.run_scope import CancelReason, RunScope
from jobs_trio.drivers.memory import MemoryDriver
from tests.helpers.guest_trio import GuestTrio
from tests.helpers.worker_helpers import fresh_metrics

KINDS = ("quick", "long", "raises", "deaf_thread", "shielded", "thread")
TIMEOUT = 50.0
LEASE = 30.0


class Bodies:
    """What the bodies tell the machine: the gates rules open, which bodies are running now,
    and which claims' bodies returned — written from the Trio thread and from body threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.release = threading.Event()  # deaf threads: only at the end of the example
        self.threads_finish = threading.Event()  # "thread" bodies: when a rule says
        self.shield_opens = trio.Event()  # "shielded" bodies: when a rule says
        self.running: dict[str, int] = {}  # job id -> bodies of it running now
        self.running_claims: dict[str, tuple[str, int]] = {}  # token -> (job id, bodies running)
        # By claim token, not (job, attempt): a lapsed job is orphaned with its attempt given
        # back, so its next claim runs the same attempt number again, and the verdict of that
        # run was checked against the return of the one before it (a false failure).
        self.returned: set[str] = set()
        self.live_threads = 0  # "thread" bodies not yet ended
        self.live_deaf = 0  # "deaf_thread" bodies not yet ended

    def started(self, ctx: Any) -> None:
        with self.lock:
            self.running[ctx.job_id] = self.running.get(ctx.job_id, 0) + 1
            _, n = self.running_claims.get(ctx._claim.token, (ctx.job_id, 0))
            self.running_claims[ctx._claim.token] = (ctx.job_id, n + 1)

    def ended(self, ctx: Any, returned: bool) -> None:
        with self.lock:
            self.running[ctx.job_id] -= 1
            job_id, n = self.running_claims[ctx._claim.token]
            self.running_claims[ctx._claim.token] = (job_id, n - 1)
            if returned:
                self.returned.add(ctx._claim.token)


def declare_jobs(registry: Registry, bodies: Bodies) -> None:
    release = bodies.release

    @registry.job("quick", timeout=TIMEOUT)
    async def quick(ctx: object, payload: int) -> int:
        await trio.sleep(1)
        return payload

    @registry.job("long", timeout=TIMEOUT)
    async def long(ctx: object, payload: int) -> None:
        try:
            await trio.sleep(1000)
        finally:
            # Unwinding takes a while: a drain can land after the timeout fired.
            with trio.CancelScope(shield=True):
                await trio.sleep(5)

    @registry.job("raises", timeout=TIMEOUT, attempts=2, backoff=Backoff(base=1, jitter=0))
    async def raises(ctx: object, payload: int) -> None:
        await trio.sleep(0.5)
        raise ValueError("boom")

    @registry.job("deaf_thread", timeout=TIMEOUT)
    def deaf_thread(ctx: object, payload: int) -> None:
        with bodies.lock:
            bodies.live_deaf += 1
        try:
            release.wait(120)  # never polls its cancel; abandoned at its timeout or the budget
        finally:
            with bodies.lock:
                bodies.live_deaf -= 1

    @registry.job("shielded", timeout=TIMEOUT)
    async def shielded(ctx: Any, payload: int) -> int:
        bodies.started(ctx)
        returned = False
        try:
            # Its last step runs in a shield: it returns whatever was asked of its scope.
            with trio.CancelScope(shield=True), trio.move_on_after(20):
                await bodies.shield_opens.wait()
            returned = True
            return payload
        finally:
            bodies.ended(ctx, returned)

    @registry.job("thread", timeout=None)
    def thread(ctx: Any, payload: int) -> int:
        bodies.started(ctx)
        with bodies.lock:
            bodies.live_threads += 1
        try:
            bodies.threads_finish.wait(120)  # never polls its cancel
        finally:
            with bodies.lock:
                bodies.live_threads -= 1
            bodies.ended(ctx, not bodies.release.is_set())
        return payload


class CheckingDriver(MemoryDriver):
    """Remembers each claim's attempt count before it, and compares it with the count after an
    interrupted settlement of that claim applied."""

    def __init__(self) -> None:
        super().__init__(clock=trio.current_time)
        self.before_claim: dict[str, int] = {}  # token -> attempts before the claim
        self.handed_back: list[tuple[str, int, int]] = []  # (job, before claim, after settle)
        # Claims in flight: while `stall` is set, a claim that commits waits for `gate` before
        # it comes back to the worker (a slow network): the window a drain can land in.
        self.stall = False
        self.gate = trio.Event()
        self.returned_while_drained: list[str] = []  # tokens that came back after the drain
        self.drained: Any = lambda: False
        # The settle path's faults: results the database refuses, and a database that stalls
        # (its settles wait for `settles_open`).
        self.refuse_results = False
        self.settles_open = trio.Event()
        self.settles_open.set()
        self.written: set[str] = set()  # tokens whose settlement (or its replacement) applied
        self.lease_until: dict[str, float] = {}  # token -> its lease's end, as last granted

    async def claim(
        self, queues: Any, limit: int, *, lease: float, worker_id: str, **ahead: Any
    ) -> Any:
        claims = await super().claim(queues, limit, lease=lease, worker_id=worker_id, **ahead)
        for c in claims:
            self.before_claim[c.token] = c.attempt - 1
            self.lease_until[c.token] = self._jobs[c.job_id].lease_until or 0.0
        if claims and self.stall:
            await self.gate.wait()
            if self.drained():
                self.returned_while_drained.extend(c.token for c in claims)
        return claims

    async def renew(self, leases: Any, *, lease: float, started: Any = ()) -> Any:
        result = await super().renew(leases, lease=lease, started=started)
        for held in leases:
            if held.token in result.held:
                self.lease_until[held.token] = self._jobs[held.job_id].lease_until or 0.0
        return result

    async def settle(self, settlements: Any) -> Any:
        await self.settles_open.wait()
        if self.refuse_results and any(isinstance(s, Complete) for s in settlements):
            raise ValueRefused("the machine's database refuses results now", fix="none")
        applied = await super().settle(settlements)
        self.written.update(s.lease.token for s in settlements if s.lease.job_id in applied)
        for s in settlements:
            if isinstance(s, Retry) and s.hands_back and s.lease.job_id in applied:
                after = self._jobs[s.lease.job_id].attempts
                self.handed_back.append((s.lease.job_id, self.before_claim[s.lease.token], after))
        return applied


class ApartDriver(CheckingDriver):
    """CheckingDriver without settle_and_claim: the worker settles and claims apart, as it does
    on a driver that lacks it. (CheckingDriver has the memory driver's: its settlements ride on
    its claims, and a stalled or refusing settle holds or fails the claim with it.)"""

    capabilities = attrs.evolve(CheckingDriver.capabilities, settles_with_claims=False)


class ShutdownMachine(RuleBasedStateMachine):
    driver_class: type[CheckingDriver] = CheckingDriver

    def __init__(self) -> None:
        super().__init__()
        self.bodies = Bodies()
        self.trio = GuestTrio()
        self.driver = self.driver_class()
        registry = Registry()
        declare_jobs(registry, self.bodies)
        self.worker = worker_module.Worker(
            self.driver,
            registry,
            concurrency=4,
            lease=LEASE,
            poll_interval=1.0,
            metrics=fresh_metrics(),
            stats_interval=None,
        )
        self.enqueued: list[str] = []
        self.lifecycle = Lifecycle(grace=25)
        self.signalled = False
        self.abandoned: list[str] = []
        self.generation = 0  # one per worker.run
        self.binds: list[float] = []  # deadlines bound in this generation
        # The writes of endings already decided (a claim in flight, a hand-back) get at least
        # WRITE_FLOOR from each bind: the latest the teardown may then end.
        self.write_binds: list[float] = []
        self.drained_at: float | None = None  # first drain signal in this generation
        self.drained_at_of: dict[int, float] = {}  # the same, for every generation
        self.verdicts: list[tuple[Outcome, RunScope, int, float | None, float]] = []
        self.returned_verdicts: list[tuple[Outcome, RunScope]] = []  # bodies that returned
        self.driver.drained = lambda: self.worker._drain.cause is not None
        self.failures: list[str] = []
        self.reported: set[str] = set()  # job ids a teardown named as abandoned
        self._real_run_attempt = worker_module.run_attempt
        worker_module.run_attempt = self._recording_run_attempt

    async def _recording_run_attempt(
        self, claim: Any, definition: Any, run: RunScope, **options: Any
    ) -> Outcome:
        generation, started = self.generation, trio.current_time()
        outcome = await self._real_run_attempt(claim, definition, run, **options)
        # The drain of the run's own generation: a run the budget gave up on can end after
        # the worker was started again.
        drained_at = self.drained_at_of.get(generation)
        self.verdicts.append((outcome, run, generation, drained_at, started))
        if claim.token in self.bodies.returned:
            self.returned_verdicts.append((outcome, run))
        return outcome

    def teardown(self) -> None:
        try:
            self.bodies.release.set()
            self.bodies.threads_finish.set()
            self.trio.close()
        finally:
            worker_module.run_attempt = self._real_run_attempt

    # -- rules -----------------------------------------------------------------------------
    # No rule has a precondition on the worker's state: that state can hang on when a body's
    # thread ends (a thread's end reaches Trio when it does), and a precondition that held in
    # one run of an example and not in its replay made Hypothesis raise
    # FlakyStrategyDefinition (once in a 5,000-example soak). A rule out of place does nothing.

    def _worker_in(self, *states: str) -> bool:
        return self.worker.state in states

    @rule(kind=st.sampled_from(KINDS))
    def enqueue(self, kind: str) -> None:
        job = self.worker.registry.require(kind)
        self.enqueued.append(self.trio.call(job.enqueue, self.driver, len(self.enqueued)))

    @rule(grace=st.sampled_from([0.0, 5.0, 25.0, 100.0]))
    def start(self, grace: float) -> None:
        """The first start, and every restart after a stop, under a lifecycle of ``grace``."""
        if not self._worker_in("stopped"):
            return
        self.generation += 1
        self.binds = []
        self.write_binds = []
        self.drained_at = None
        self.lifecycle = Lifecycle(grace=grace, on_abandoned=self.abandoned.extend)
        self.signalled = False
        self.worker._lifecycle = self.lifecycle
        self.trio.call(self.trio.nursery.start, self.worker.run)  # type: ignore[union-attr]

    @rule()
    def let_run(self) -> None:
        self.trio.settle()

    @rule(seconds=st.sampled_from([0.5, 1.0, 5.0, 11.0, 31.0, 60.0]))
    def advance_clock(self, seconds: float) -> None:
        self.trio.advance(seconds)

    @rule()
    def manual_stop(self) -> None:
        if not self._worker_in("idle", "running"):
            return
        self.trio.spawn(self.worker.stop)

    def _bound(self, at: float) -> None:
        """The worker's budget is bound to ``at`` now (its decided writes' floor with it). With
        a suspect held alone, its bodies' wait ends ALONE_RESERVE before its writes' (Budget):
        a job orphaned twice (lapsed past a clock jump) is claimed alone."""
        writes = max(at, self.trio.clock.current_time() + WRITE_FLOOR)
        alone = any(run.claim.alone for run in self.worker._drain.held)
        self.write_binds.append(writes)
        self.binds.append(min(at, min(self.write_binds) - ALONE_RESERVE) if alone else at)

    def _signal(self, lifecycle: Lifecycle, bind_at: float) -> None:
        self._bound(bind_at)
        if self.drained_at is None:
            self.drained_at = self.trio.clock.current_time()
            self.drained_at_of[self.generation] = self.drained_at
        self.trio.spawn(lifecycle.shutdown, "SIGTERM")

    @rule()
    def shutdown_signal(self) -> None:
        if self._worker_in("stopped") or self.signalled:
            return
        self.signalled = True
        self._signal(self.lifecycle, self.trio.clock.current_time() + self.lifecycle.grace)

    @rule()
    def second_signal(self) -> None:
        """Cuts the budget to zero."""
        if self._worker_in("stopped") or not self.signalled:
            return
        self._signal(self.lifecycle, self.trio.clock.current_time())

    @rule(grace=st.sampled_from([0.0, 25.0, 100.0]))
    def another_lifecycle_shuts_down(self, grace: float) -> None:
        """A second lifecycle the worker is registered with (an embedding framework's own)
        shuts down too, with its own grace: earliest wins, whichever bound first."""
        if self._worker_in("stopped"):
            return
        other = Lifecycle(grace=grace, on_abandoned=self.abandoned.extend)
        other.register(self.worker)
        self._signal(other, self.trio.clock.current_time() + grace)

    @rule()
    def shielded_bodies_return(self) -> None:
        """Every shielded body waiting now returns (before or after a drain)."""

        async def open_gate() -> None:
            self.bodies.shield_opens.set()
            self.bodies.shield_opens = trio.Event()

        self.trio.call(open_gate)

    @rule()
    def sync_bodies_finish(self) -> None:
        """Every "thread" body running now returns: before the budget, or after it (then its
        run was abandoned and the result goes nowhere)."""
        self.bodies.threads_finish.set()

        async def until_their_ends_reach_trio() -> None:
            # A thread's end reaches Trio by run_sync_soon, after the body has returned: wait
            # until every such thread has handed its limiter token back (only deaf ones hold
            # one then), so the runs waiting for them are judged before the next step.
            limiter = self.worker._slots.threads.limiter
            deadline = time.monotonic() + 10
            while self.bodies.live_threads or limiter.borrowed_tokens > self.bodies.live_deaf:
                assert time.monotonic() < deadline, "a finished thread never reached Trio"
                await trio.to_thread.run_sync(time.sleep, 0.001)
            self.bodies.threads_finish = threading.Event()

        self.trio.call(until_their_ends_reach_trio)

    async def _held_reasons(self) -> list[tuple[RunScope, str | None]]:
        return [(run, run.reason) for run in self.worker._drain.held]

    def _bodies_running(self) -> set[str]:
        with self.bodies.lock:
            return {job for job, n in self.bodies.running.items() if n > 0}

    def _bodies_holding_their_job(self) -> set[str]:
        """The jobs whose bodies run here and still hold them (no other worker may run them):
        their claim's lease has not lapsed, and their run was not judged lost or abandoned (at
        the teardown's budget). Past either, a body left running (a thread, a shielded body)
        runs on, and the job is anyone's to claim, this process's too (a claim taken ahead or a
        restarted worker), which may hand that claim back ready: at-least-once, as documented
        (docs/shutdown.md)."""
        let_go = {
            run.claim.job_id
            for outcome, run, *_ in self.verdicts
            if outcome.kind in ("lost", "abandoned")
        }
        now = self.trio.clock.current_time()
        with self.bodies.lock:
            running = [(t, job) for t, (job, n) in self.bodies.running_claims.items() if n > 0]
        leased = self.driver.lease_until
        return {job for token, job in running if leased.get(token, math.inf) > now} - let_go

    @rule(refused=st.booleans())
    def results_refused(self, refused: bool) -> None:
        """The database starts (or stops) refusing every result it is asked to store."""
        self.driver.refuse_results = refused

    @rule()
    def database_stalls(self) -> None:
        """Settles stop reaching the database: they wait until it recovers."""
        if self.driver.settles_open.is_set():
            self.driver.settles_open = trio.Event()

    @rule()
    def database_recovers(self) -> None:
        async def open_gate() -> None:
            self.driver.settles_open.set()

        self.trio.call(open_gate)

    @rule()
    def claims_stall(self) -> None:
        """From now on a claim that commits takes a while to come back to the worker."""
        self.driver.stall = True

    @rule()
    def claims_come_back(self) -> None:
        async def open_gate() -> None:
            self.driver.stall = False
            self.driver.gate.set()
            self.driver.gate = trio.Event()

        self.trio.call(open_gate)

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def a_returned_body_is_completed(self) -> None:  # 5
        for outcome, run in self.returned_verdicts:
            # Unless it returned after the budget had given up on it: then nothing is written.
            assert outcome.kind == "completed" or run.abandoned, outcome

    @invariant()
    def no_job_is_ready_while_its_body_runs(self) -> None:  # 5
        for job_id in self._bodies_holding_their_job():
            record = self.driver._jobs[job_id]
            assert record.state is not JobState.READY, (
                f"job {job_id} is ready (claimable by another worker) while its body still "
                f"runs in this process: {record}"
            )

    @invariant()
    def every_claim_committed_after_a_drain_is_interrupted_and_handed_back(self) -> None:
        by_token = {run.claim.token: outcome for outcome, run, *_ in self.verdicts}
        for token in self.driver.returned_while_drained:
            outcome = by_token.get(token)
            assert outcome is not None, f"claim {token} came back after the drain, never ran"
            assert outcome.kind == "interrupted", outcome
            assert outcome.seconds == 0, f"its body ran: {outcome}"

    @invariant()
    def every_finished_body_is_written_or_reported(self) -> None:  # 1
        """Once a teardown is over, every attempt that ended with something to write has it
        written (or its storable replacement, for a refused result), was fenced (its claim no
        longer current), or was named as abandoned."""
        if self.worker.state != "stopped":
            return
        self.reported.update(self.worker.stats().abandoned)
        for outcome, run, *_ in self.verdicts:
            if outcome.settlement is None:
                continue
            token = run.claim.token
            # Fenced: the claim is no longer the job's current one (its lease lapsed and a
            # newer claim took the job, or buried it): the write was refused, as it must be.
            fenced = self.driver._tokens.get(run.job_id) != token
            assert token in self.driver.written or fenced or run.job_id in self.reported, (
                f"{outcome.kind} of {outcome.name} {outcome.job_id} was neither written nor "
                "reported abandoned"
            )

    @invariant()
    def nothing_enqueued_is_lost(self) -> None:  # 1
        for job_id in self.enqueued:
            record = self.driver._jobs.get(job_id)
            assert record is not None, f"job {job_id} vanished"
            if record.state is JobState.RUNNING:
                assert record.lease_until is not None, f"{job_id} running with no lease"
            else:
                assert record.state in (JobState.READY, JobState.COMPLETED, JobState.DEAD), record

    @invariant()
    def the_first_reason_wins(self) -> None:  # 4
        for outcome, run, _, drained_at, _started in self.verdicts:
            deadline = run.cancel_scope.deadline
            if run.reason is CancelReason.DRAINING:
                assert drained_at is not None
                assert deadline > drained_at, (
                    f"{outcome.name} {outcome.job_id}: its deadline {deadline} passed before the "
                    f"drain at {drained_at}, yet it reads as drained"
                )

    @invariant()
    def a_drain_reaches_every_held_run_at_once(self) -> None:  # 5
        if self.drained_at is not None and self.worker.state != "stopped":
            # Read in the guest run: a scope's deadline check needs Trio's clock.
            reasons = self.trio.call(self._held_reasons)
            for run, reason in reasons:
                if run.settling:
                    continue  # its body has ended; only its settlement waits to be written
                assert reason is not None, (
                    f"job {run.job_id} ({run.claim.name}) still runs uncancelled after the "
                    f"shutdown at {self.drained_at}"
                )

    @invariant()
    def interrupted_attempts_are_handed_back(self) -> None:  # 5
        for outcome, run, generation, drained_at, _ in self.verdicts:
            if outcome.kind == "interrupted":
                # Or its claim was answered after its lease ran out (claims stalled 31 s), or
                # its lease ran out before a renewal landed (the database stalled), or it was
                # claimed ahead and no slot freed within its hold (a deaf body kept the slot).
                assert drained_at is not None or run.reason in (
                    CancelReason.CLAIM_LATE,
                    CancelReason.LEASE_EXPIRED,
                    CancelReason.HELD_TOO_LONG,
                ), (
                    f"{outcome.name} {outcome.job_id} was interrupted in generation "
                    f"{generation}, where no shutdown was signalled"
                )
                assert isinstance(outcome.settlement, Retry)
                assert outcome.settlement.hands_back
                assert outcome.settlement.delay == 0
            if run.reason is CancelReason.DRAINING and outcome.kind != "interrupted":
                # Drained, yet not interrupted: it returned, or the budget abandoned it.
                assert outcome.kind in ("completed", "abandoned"), outcome
                assert outcome.kind == "completed" or run.abandoned, outcome

    @invariant()
    def every_interrupted_attempt_left_its_attempt_count_unchanged(self) -> None:
        for job_id, before, after in self.driver.handed_back:
            assert after == before, f"job {job_id}: {before} attempts before, {after} after"

    @invariant()
    def a_shut_down_worker_reaches_stopped_by_its_budget(self) -> None:  # 6
        if self.binds and self.worker.state != "stopped":
            # Past the budget for bodies, and the floor its decided writes keep (Budget).
            assert self.trio.clock.current_time() <= min(self.write_binds), (
                f"worker still {self.worker.state} at {self.trio.clock.current_time()}, "
                f"past its budget {min(self.binds)} and its writes' {min(self.write_binds)}"
            )

    @invariant()
    def the_budget_only_tightens(self) -> None:  # 7
        if self.worker.state == "stopped":
            assert self.worker._budget.deadline == math.inf  # fresh for the next run (8)
            return
        expected = min(self.binds) if self.binds else math.inf
        assert self.worker._budget.deadline == expected, (
            f"budget {self.worker._budget.deadline}, binds {self.binds}"
        )

    @invariant()
    def a_restarted_worker_has_a_fresh_drain(self) -> None:  # 8
        if self.worker.state in ("idle", "running") and self.drained_at is None:
            assert self.worker._drain.reason is None


def machine_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        # 32, not 25: rules out of place are steps that do nothing (no preconditions, above).
        stateful_step_count=32,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


# Settlements carried by claims (CheckingDriver has settle_and_claim): the worker's usual path.
ShutdownMachine.TestCase.settings = machine_settings(300)


# The machine runs Trio itself, in guest mode: a plain (sync) test case.
class TestShutdownMachine(ShutdownMachine.TestCase):  # type: ignore[misc]
    pass


class ApartMachine(ShutdownMachine):
    driver_class = ApartDriver


ApartMachine.TestCase.settings = machine_settings(150)


class TestShutdownMachineSettlingApart(ApartMachine.TestCase):  # type: ignore[misc]
    pass
