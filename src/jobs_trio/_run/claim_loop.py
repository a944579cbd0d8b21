# The claim loop: one claim per round for every queue of the worker with room, the wait for work
# or a slot between rounds, and claiming's stop. Apart because here is where a job is claimed;
# where it runs is the worker's nursery (worker.py), and where it is settled, settler.py.
from __future__ import annotations

import contextlib
import logging
import math
import operator
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import trio

from .._core.errors import DriverError
from .._core.logs import log_event
from .._core.records import Claim, ClaimToken
from ..drivers.contract import Driver, HandsBackUnheld
from .outage import Outage
from .settler import Settler
from .slots import Slots
from .worker_options import WorkerOptions

# Claims in flight at once, where the driver serves them side by side.
_MOST_IN_FLIGHT = 2

# A worker's claims rescue lapsed jobs (hand them back at their place in line, the orphan rule's
# count) once in this many seconds at most a queue; the others claim with rescue=False. A lapse
# is found a lease after its worker died, and this adds at most a second to that; a claim that
# rescues is the larger statement on PostgreSQL, ~0.2 ms more of the server's time on every
# claim, most of it on an idle worker's wake-up (issue 44, the probe under load). Kept per
# queue: a rescue walks only the queues its claim names, and one clock for all of them let a
# queue whose slots free rarely (never named by the one claim a second that rescued) starve a
# lapsed job of it for as long as its backlog lasted.
RESCUE_EVERY = 1.0
# A rescue hands back at most what its claim asks (Driver.claim): a queue whose rescuing claim
# came back full may have more lapsed jobs, and is rescued again this soon (a dead worker's ten
# jobs came back to a worker of one slot one a second). Not at its next claim: under a steady
# load most claims come back full, and each would be the larger statement again.
RESCUE_AGAIN = 0.1

# A claim answer's per-claim reads, made in C (map): a generator expression stepped once a
# claim was as much again, at answers of a hundred claims or more (issue 44).
_ALONE = operator.attrgetter("alone")
_QUEUE = operator.attrgetter("queue")

# Places the claims one answer brought: each held in the drain at once, then run in a slot or
# held for one. ``sent_at`` is when the claim was sent (their leases count from there).
Place = Callable[[Sequence[Claim], float], None]


class ClaimLoop:
    """One loop for all the worker's queues: each round is ONE claim for every queue with a
    free slot, each capped at its own (a deep queue never takes another's slots), so an idle
    worker costs the database the same with 1 queue or 50 (issue 20). Idle, it waits for its
    driver's wake-up and looks again at least every ``safety_poll`` seconds; ``poll_interval``
    is the pause after a failed claim."""

    def __init__(
        self,
        driver: Driver,
        options: WorkerOptions,
        slots: Slots,
        outage: Outage,
        worker_id: str,
        place: Place,
        held: Callable[[], Sequence[ClaimToken]] = tuple,
    ) -> None:
        self._driver = driver
        self._options = options
        self._slots = slots
        self._outage = outage
        self._worker_id = worker_id
        self._place = place
        self._held = held
        # A claim failed with no answer (the connection dropped while it was in flight): it
        # may have committed, and its jobs, which no run here holds, are given back before the
        # next claim (_hand_back_unheld).
        self._answer_lost = False
        # Claiming stops at once on stop(): every idle wait is cancelled, but a claim in flight
        # is not (it may have committed): it is waited for, under the budget, and whatever it
        # claimed is reached by the drain.
        self.stopped = False
        self._idle_waits: set[trio.CancelScope] = set()
        # Claims in flight (what they asked: Slots.claim_sent).
        self._in_flight = 0
        # The last answer's queues that came up short (emptied once waited on), whether it
        # claimed anything, and whether it filled every queue it asked (more is waiting).
        self._came_up_short: list[str] = []
        self._had_claims = False
        self._deep = False
        # The orphan rule (docs/model.md, "A worker's death"): a claim sent alone (this worker
        # runs nothing else) may bring a suspect, and the tokens of those it brought. While one
        # is in flight nothing is claimed beside it, and while a suspect runs nothing at all:
        # if this process dies then, the suspect killed it, and nobody else is charged.
        self._alone_in_flight = False
        self._alone: set[ClaimToken] = set()
        # From when a claim naming each queue may rescue its lapsed jobs again (Trio clock;
        # RESCUE_EVERY, RESCUE_AGAIN); a queue not in it may now.
        self._rescue_due: dict[str, float] = {}

    async def run(self, settler: Settler) -> None:
        async with trio.open_nursery() as claims:
            while not self.stopped:
                if self._alone and self._holds_alone(settler):
                    with self.idle_wait():
                        await self._until_alone_ends(settler)
                    continue
                if self._in_flight and not self._may_claim_beside(settler):
                    with self.idle_wait():
                        await self._slots.freed.park()  # also unparked at each answer
                    continue
                # A lost answer's jobs are handed back first (below), not after a wait for work.
                if not self._in_flight and self._came_up_short and not self._answer_lost:
                    short, had_claims = self._came_up_short, self._had_claims
                    self._came_up_short = []
                    if had_claims:
                        # The jobs just claimed start before this task looks for more: the
                        # look (a round trip on some drivers) would otherwise be sent first,
                        # and every job wait for it. Two passes: the first lands in the batch
                        # the new tasks run in, where Trio's order is random; the second is
                        # after it.
                        await trio.lowlevel.cancel_shielded_checkpoint()
                        await trio.lowlevel.cancel_shielded_checkpoint()
                    with self.idle_wait():
                        await self._wait_for_work_or_slot(short)
                    continue
                # A claim that carries settlements goes at a quarter of the room, where the
                # driver serves claims side by side. One that answers a call at a time (the
                # SQLite door: each call a thread's turns at the GIL, _gil_handoff.py) claims
                # at half: fewer, larger calls ran c=10 at 19.0-19.9k jobs/s against 17.6-18.1k
                # (issue 44).
                free = self._slots.claimable(
                    carrying=settler.carriable and self._driver.capabilities.claims_side_by_side
                )
                if not free:
                    with self.idle_wait():
                        await self._slots.freed.park()
                    continue
                if settler.waiting >= settler.capacity:
                    # Backpressure: the database is not keeping up with the settlements;
                    # claiming more would only pile finished work up in memory.
                    with self.idle_wait():
                        await settler.room()
                    continue
                if settler.stalled:
                    # Finished work first: the database could not take the last settlements.
                    # Once it can, they are written before this worker claims again (issue
                    # 32: a claim that came first took jobs whose results were still waiting).
                    with self.idle_wait():
                        await settler.flowing()
                    continue
                if self._answer_lost and not await self._hand_back_unheld():
                    continue
                options = self._claim_options(free)
                if self._runs_nothing():
                    options["alone"] = self._alone_in_flight = True
                self._in_flight += 1
                promised = options.get("free", free)
                self._slots.claim_sent(free, promised)
                # What it carries is taken now, in the pass the settler leaves them to a
                # claim, not in the claim task's first one.
                options["carried"] = settler.take_for_claim()
                claims.start_soon(self._claim, settler, free, promised, options)
                # The claim is sent before this task looks again (a claim beside it asks
                # for what this one does not bring).
                await trio.lowlevel.checkpoint()

    def _may_claim_beside(self, settler: Settler) -> bool:
        """Whether a claim may go while another is in flight: where the driver serves claims
        side by side, the last answer filled every queue it asked (work is waiting), and
        nothing went wrong. The database then works on the next jobs while this worker runs
        the last ones (issue 35: one claim at a time, the worker waited for each answer with
        nothing to run, and the server for each claim with nothing to do)."""
        return (
            self._in_flight < _MOST_IN_FLIGHT
            and self._driver.capabilities.claims_side_by_side
            and self._deep
            and not self._answer_lost
            and not settler.stalled
            and not self._alone_in_flight
        )

    def _runs_nothing(self) -> bool:
        """Whether a claim now would be alone (``Driver.claim(alone=True)``): no body runs or
        waits for a slot here, no claim is in flight, and no thread abandoned at its cancel
        still runs. Only then may it take a suspect: whatever kills this process while the
        suspect runs can only be the suspect."""
        return (
            self._driver.capabilities.claims_alone
            and not self._in_flight
            and not self._slots.holds_jobs()
            and not any(self._slots.threads.lingering_by_queue.values())
        )

    def _holds_alone(self, settler: Settler) -> bool:
        """Whether a suspect claimed alone still runs here, or has ended with its settlement
        unwritten and not carried by the next claim: a claim beside it then, and a death, would
        dead-letter it (the row still says alone) for what a neighbour did. A settlement the
        next claim carries commits with that claim, so the claim may go."""
        self._alone.intersection_update(self._held())
        if not self._alone:
            return False
        return self._slots.holds_jobs() or not settler.carriable

    async def _until_alone_ends(self, settler: Settler) -> None:
        if self._slots.holds_jobs():
            await self._slots.freed.park()  # its body ends: its slot frees
        else:
            await settler.next_write()  # its settlement written: its run released

    async def _claim(
        self,
        settler: Settler,
        free: dict[str, int],
        promised: dict[str, int],
        options: dict[str, Any],
    ) -> None:
        """One claim: its jobs placed, in the free slots promised to it (``promised``: no
        claim beside it, answered first, takes them), or its failure handled (the loop waits
        for it)."""
        sent_at = trio.current_time()
        try:
            # Not cancelled when claiming stops: a claim that committed must reach its
            # runs, or its jobs would sit claimed until their leases lapsed and cost them
            # an attempt. The drain still reaches them: place() cancels them at once. Only
            # the budget (around the claim loop) cuts a claim short.
            claims = await settler.claim(
                self._driver,
                list(free),
                free,
                lease=self._options.lease,
                worker_id=self._worker_id,
                **options,
            )
        except DriverError as exc:
            self._answer_lost = True
            self._deep = False  # no answer says work is waiting
            if options.get("rescue", True):
                # Its rescue may not have happened: the next claim the outage allows rescues.
                for queue in free:
                    self._rescue_due.pop(queue, None)
            self._slots.claim_answered(free, promised)
            self._slots.fill(free)
            try:
                await self._claim_failed(exc, free)
            finally:
                self._answered()
            return
        except BaseException:
            self._slots.claim_answered(free, promised)
            self._answered()
            raise
        self._outage.reached(sent_at)
        rescued = options.get("rescue", True) and self._driver.capabilities.rescue_on_request
        if any(map(_ALONE, claims)):  # per item in C: a generator's step a claim was not
            self._alone.update(claim.token for claim in claims if claim.alone)
        # In one pass: the claim's share ends and its jobs take the slots it kept for them.
        self._slots.claim_answered(free, promised)
        self._place(claims, sent_at)
        self._slots.fill(free)
        got = Counter(map(_QUEUE, claims))
        self._slots.answer_placed(free, got, trio.current_time() - sent_at)
        self._came_up_short = [q for q, n in free.items() if got[q] < n]
        if rescued:
            due, again = self._rescue_due, sent_at + RESCUE_AGAIN
            for queue, n in free.items():
                if got[queue] >= n and due.get(queue, -math.inf) > again:
                    due[queue] = again
        self._deep = not self._came_up_short
        self._had_claims = bool(claims)
        self._answered()

    def _answered(self) -> None:
        self._in_flight -= 1
        self._alone_in_flight = False
        self._slots.freed.unpark_all()

    async def _claim_failed(self, exc: DriverError, queues: Mapping[str, int]) -> None:
        self._outage.unreachable()
        log_event("jobs.worker.claim-failed", logging.WARNING, queues=tuple(queues), error=str(exc))
        with self.idle_wait():
            # Tried again before the gap would count as an outage (Outage.long, the renewal
            # interval): with a lease of 3 s or less, one dropped connection and a pause of a
            # whole poll interval held this worker's rescues back for the outage's grace.
            await trio.sleep(min(self._options.poll_interval, self._outage.long / 2))

    async def _hand_back_unheld(self) -> bool:
        """After a claim that failed with no answer: the jobs it may have taken, running under
        this worker with tokens no run here holds, are given their attempts back (issue 32: else
        each lapsed a lease later and was charged an attempt for an outage). Only this worker,
        alive, does it for its own claims: a job that kills its worker is never handed back so.
        False when the database still does not answer (the claim loop waits and tries again)."""
        if not self._driver.capabilities.hands_back_unheld:
            self._answer_lost = False
            await trio.lowlevel.checkpoint()
            return True
        driver = cast(HandsBackUnheld, self._driver)  # declared by its capabilities
        try:
            given = await driver.hand_back_unheld(
                self._worker_id, self._options.queues, list(self._held())
            )
        except DriverError as exc:
            await self._claim_failed(exc, self._options.limits)
            return False
        self._answer_lost = False
        if given:
            log_event(
                "jobs.worker.claim-answer-lost",
                logging.WARNING,
                worker=self._worker_id,
                jobs=len(given),
                why="a claim committed but its answer never arrived (the connection dropped);"
                " its jobs are claimable again at once, their attempts given back",
            )
        return True

    def _claim_options(self, want: Mapping[str, int]) -> dict[str, Any]:
        """What a claim tells its driver beyond the queues and their caps, only when it must:
        a driver is otherwise asked nothing new. A claim asking past a queue's free slots tells
        it those slots (``free=``): the claims past them are marked ahead, and a crash here
        gives their attempts back. ``rescue=False`` just after an outage (their runners write
        first, outage.py) and between rescues (RESCUE_EVERY): no lapsed job."""
        options: dict[str, Any] = {}
        # Free slots a claim in flight will fill are not this claim's.
        free = {q: self._slots.unasked(q) for q in want}
        if any(n > free[q] for q, n in want.items()):
            options["free"] = free
        if self._driver.capabilities.rescue_on_request:
            now = trio.current_time()
            if now < self._rescue_at(want):
                options["rescue"] = False
            else:
                # Its walk covers the queues it names: their clocks start again, the others'
                # stay due for the first claim that names them.
                due = self._rescue_due
                for queue in want:
                    due[queue] = now + RESCUE_EVERY
        return options

    def _rescue_at(self, queues: Iterable[str]) -> float:
        """From when a claim naming ``queues`` may rescue lapsed jobs (Trio clock): after an
        outage, its grace (outage.py); else when the first of them is due again."""
        due = self._rescue_due
        soonest = min([due.get(queue, -math.inf) for queue in queues], default=-math.inf)
        return max(self._outage.rescue_at(), soonest)

    async def _wait_for_work_or_slot(self, came_up_short: Sequence[str]) -> None:
        """Wait until new work may be due in a queue whose claim came up short (the driver's
        wake-up, one look at the next due time for all of them), or a slot frees in a queue
        that may hold more (its claim filled its slots, or it had none free)."""
        may_hold_more = [q for q in self._options.queues if q not in came_up_short]
        # A worker that runs something waits for work it may take: a suspect (the orphan rule)
        # is none. Once it runs nothing it looks again, alone: a suspect then is its work, and
        # the wait it began busy would not end for one (a fleet that runs dry runs them).
        may_idle = self._driver.capabilities.claims_alone and not self._runs_nothing()
        if not may_hold_more and not may_idle:
            # Every queue came up short (an idle worker): only the wake-up can end the wait.
            # Waited for in this task: a nursery's child would take a scheduler pass more to
            # hand the claim loop its wake-up (wake-up to claim sent: 0.17-0.23 ms with one).
            await self._work_may_be_due(came_up_short)
            return
        async with trio.open_nursery() as waits:

            async def work_may_be_due() -> None:
                await self._work_may_be_due(came_up_short)
                waits.cancel_scope.cancel()

            async def idle_then_alone() -> None:
                while not self._runs_nothing():
                    await self._slots.freed.park()
                await self._work_may_be_due(came_up_short)
                waits.cancel_scope.cancel()

            async def slot_freed() -> None:
                while not any(q in self._slots.claimable() for q in may_hold_more):
                    await self._slots.freed.park()
                waits.cancel_scope.cancel()

            waits.start_soon(work_may_be_due)
            if may_hold_more:
                waits.start_soon(slot_freed)
            if may_idle:
                waits.start_soon(idle_then_alone)

    async def _work_may_be_due(self, queues: Sequence[str]) -> None:
        """The driver's wake-up. While this worker rescues no lapsed job (after an outage), a
        lapsed lease is no work for it until it does (``rescue_from``): else the wake-up would
        answer at once, every time, to a claim that may not take it."""
        rescue_at = self._rescue_at(queues)
        now = trio.current_time()
        timeout = self._options.safety_poll
        # A suspect is work only for a worker that runs nothing (the orphan rule): else a busy
        # one would wake for a job it may not take.
        alone: dict[str, Any] = {"alone": True} if self._runs_nothing() else {}
        if rescue_at <= now or not self._driver.capabilities.rescue_on_request:
            await self._driver.wait_for_work(queues, timeout=timeout, **alone)
        else:
            # On the driver's clock, the same distance ahead (never, while still unreachable).
            rescue_from = self._driver.now() + (rescue_at - now)
            await self._driver.wait_for_work(
                queues, timeout=timeout, rescue_from=rescue_from, **alone
            )

    async def until_stopped(
        self,
        service: Callable[..., Awaitable[None]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run a service (cron fires, retention) until claiming stops, as one of its idle
        waits: stop() ends it before the teardown's wait, so no fire lands and no prune batch
        runs during a drain."""
        with self.idle_wait():
            await service(task_status=task_status)

    @contextlib.contextmanager
    def idle_wait(self) -> Iterator[None]:
        """A wait for work or a slot: cancelled at once when claiming stops."""
        with trio.CancelScope() as scope:
            if self.stopped:
                scope.cancel()
            self._idle_waits.add(scope)
            try:
                yield
            finally:
                self._idle_waits.discard(scope)

    def stop(self) -> None:
        """Claim no more: every idle wait ends now; a claim in flight runs to its answer."""
        self.stopped = True
        for scope in list(self._idle_waits):
            scope.cancel()
