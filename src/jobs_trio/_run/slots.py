# A worker's slots: each queue's concurrency, the runs holding one, the claims taken ahead of a
# free slot and waiting for one, and who gets a slot that frees (its queue's oldest held claim).
# Apart from the claim loop, which asks here how much to claim, and from the runs, which end here.
from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Collection, Mapping

import attrs
import trio

from .._jobs.registry import JobDefinition
from .drain import Drain
from .run_scope import CancelReason, RunScope
from .thread_slots import ThreadSlots

# How a run starts in the worker's nursery: its scope, its job's definition, and what to call
# with its scope once its task has ended (its slot given back, or its hand-back counted done):
# one bound method for every run, where a partial made per run was a share of a no-op job.
StartRun = Callable[[RunScope, JobDefinition | None, Callable[[RunScope], None]], None]

# claim_ahead="auto": a queue holds what its slots start in about this long at the pace of its
# recent runs. Long enough to cover a claim's round trip a few times over (a claim is sent once
# half of it has started) and to make the claims large (worker_options.AUTO_MAX), short enough
# that a held job's wait, a job enqueued behind the held ones, and what a peer worker could
# have run meanwhile are all a matter of milliseconds.
# Measured under load (bench/run.py load, c=50, fed 80% of what it sustains): with all slots busy
# a job enqueued now waits for about half the hold before the next claim takes it, so the hold
# is latency: probe start->start p50/p99 23.5/131 ms at 50 ms, 13.3/40.6 at 25 ms, 10.3/36.4 at
# 15 ms (PgQueuer 7.6-8.7/43-49); throughput at c=50 ~10% lower at 15 ms than at 50 (c=10 level).
AUTO_HOLD = 0.02
# Behind a backlog (its last claim came back with all it asked for: more is waiting) a queue
# holds long enough to cover the next claim's round trip, ROUND_TRIPS_HELD of them at the pace
# of its recent claims, up to AUTO_DEEP_HOLD: the next claim goes once half the room has
# started, so what is held must outlast one round trip from there. At c=50 a claim of ~100 jobs
# took 10-20 ms to come back, and a 20 ms hold ran dry waiting for it (the worker idle a fifth
# of the time). A held job then waits in the worker instead of in the table, behind the same
# jobs. A claim that comes back short (the queue emptied) holds AUTO_HOLD again: a stream the
# worker keeps up with, whose claims are short, is held 20 ms whatever its round trips take.
AUTO_DEEP_HOLD = 0.08
ROUND_TRIPS_HELD = 3
# How fast the pace follows the runs: each run's time counts this much in the running mean.
_PACE_WEIGHT = 0.1
# And a claim's round trip in theirs: faster, a claim is rarer than a run (a 10,000-job backlog
# at c=50 is ~80 claims).
_ROUND_TRIP_WEIGHT = 0.25


@attrs.define
class _Pace:
    """A queue's mean time from a run's start in a slot to the slot's release, which sizes its
    claims ahead under claim_ahead="auto". None until its first run ended: a worker knows
    nothing of its jobs at start, and a first claim ahead for jobs that turn out to run for
    minutes would hold them for the hold limit."""

    mean: float | None = None
    # Whether its last claim came back full, and that claim's round trip (a running mean).
    deep: bool = False
    round_trip: float = 0.0

    def observe(self, seconds: float) -> None:
        self.mean = (
            seconds if self.mean is None else self.mean + _PACE_WEIGHT * (seconds - self.mean)
        )

    def answered(self, *, full: bool, round_trip: float) -> None:
        self.deep = full
        self.round_trip += _ROUND_TRIP_WEIGHT * (round_trip - self.round_trip)

    def hold(self, hold_limit: float) -> float:
        """AUTO_HOLD, or behind a backlog what covers its claims' round trips, up to
        AUTO_DEEP_HOLD and never past half the hold limit (a lower one set by hand: past it,
        held jobs reached the limit, were handed back to the table, and the next claim came
        back full again)."""
        if not self.deep:
            return AUTO_HOLD
        most = max(AUTO_HOLD, min(AUTO_DEEP_HOLD, hold_limit / 2))
        return min(max(AUTO_HOLD, ROUND_TRIPS_HELD * self.round_trip), most)

    def ahead(self, slots: int, most: int, hold_limit: float) -> int:
        """Claims ahead that ``slots`` busy slots start in about a hold (``hold()``): none when
        they start fewer than one in AUTO_HOLD (long jobs: a held one would wait for a whole
        run, however deep the backlog), at most ``most``."""
        if self.mean is None:
            return 0
        # A run's slot time of 0 (a mock clock, a coarse one): as fast as can be.
        starts = slots / max(self.mean, 1e-6)  # a second
        if starts * AUTO_HOLD < 1:
            return 0
        return min(most, int(starts * self.hold(hold_limit)))


class _Held:
    """A claim taken ahead, waiting for a slot; ``overdue`` once its hold limit (``deadline``)
    has passed without one. Called when its run is cancelled before a slot was handed to it
    (RunScope.on_cancel): itself the callback, where a partial made per held claim was as
    much again (issue 44)."""

    __slots__ = ("_slots", "deadline", "definition", "overdue", "run")

    def __init__(
        self, slots: Slots, run: RunScope, definition: JobDefinition | None, deadline: float
    ) -> None:
        self._slots = slots
        self.run = run  # its claim is run.claim
        self.definition = definition
        self.deadline = deadline
        self.overdue = False

    def __call__(self) -> None:
        self._slots._held_cancelled(self)


class Slots:
    """Counted per queue. A slot frees only through ``_promote``, which hands it to the oldest
    held claim of its queue first: an open slot means none waits, so a claim never overtakes an
    older one. ``freed`` is unparked whenever a slot frees or a held claim is let go."""

    def __init__(
        self,
        limits: Mapping[str, int],
        ahead: Mapping[str, int],
        hold_limit: float,
        *,
        start_run: StartRun,
        on_idle: Callable[[], None],
        auto_ahead: frozenset[str] = frozenset(),
    ) -> None:
        self.limits = dict(limits)
        # The most each queue claims ahead: fixed, or for an ``auto_ahead`` queue its ceiling,
        # below which its pace sizes it (_Pace).
        self.ahead = dict(ahead)
        self._paces = {q: _Pace() for q in auto_ahead}
        self.hold_limit = hold_limit
        self._start_run = start_run
        self._on_idle = on_idle
        # Every queue's count is there from the start, at 0: a Counter's missing key is a call
        # to its __missing__, at every claim placed and every slot freed (issue 44).
        zero = dict.fromkeys(self.limits, 0)
        self.in_flight: Counter[str] = Counter(zero)  # runs holding a slot
        self.unstarted: Counter[str] = Counter(zero)  # claims taken ahead, not yet given a slot
        # Both, over every queue: counted as they change, where summing both Counters at every
        # run's end was a few per cent of a no-op job (issue 44).
        self._jobs = 0
        # Claims taken ahead of a free slot, oldest first per queue (claim order is the queue's
        # order), each waiting for a slot of its queue or its hold limit.
        self._waiting: dict[str, deque[_Held]] = {q: deque() for q in limits}
        # A queue whose held claim was handed back claims nothing ahead until a slot frees:
        # else a worker stuck behind a long job would claim and hand back the same job forever.
        self._ahead_paused: set[str] = set()
        # Queues an operator paused (the worker's watch heard it): no claim asks for them.
        self.paused: frozenset[str] = frozenset()
        self._held_one = trio.lowlevel.ParkingLot()
        # Whether hand_back_overdue waits there for the first held claim: asked at every claim
        # held, where the lot's own __bool__ was a call each.
        self._overdue_waits = False
        self.freed = trio.lowlevel.ParkingLot()
        # What claims in flight asked of each queue, and the free slots they told the
        # driver their jobs would run in (claim_sent()).
        self._asking: Counter[str] = Counter(zero)
        self._promised: Counter[str] = Counter(zero)
        self.threads = ThreadSlots(self.limits, self._thread_ended)
        self._lingering = self.threads.lingering_by_queue

    # -- what the claim loop asks -----------------------------------------------------------

    def open(self, queue: str) -> int:
        """``queue``'s free slots. A thread abandoned at its cancel still runs: it keeps its
        slot until it ends."""
        return self.limits[queue] - self.in_flight[queue] - self._lingering[queue]

    def free(self) -> dict[str, int]:
        """Each queue with a free slot, and how many."""
        free = {q: self.open(q) for q in self.limits}
        return {q: n for q, n in free.items() if n > 0}

    def claimable(self, *, carrying: bool = False) -> dict[str, int]:
        """What the next claim asks of each queue: its free slots, plus its room ahead
        (``claim_ahead`` less the claims already waiting). The room is claimed once half of it
        is free, not job by job: a claim ahead exists to save round trips. ``carrying``: the
        claim would carry settlements, which a round trip writes anyway, so a quarter of the
        room is enough (issue 35: a settle and a claim apart were two round trips where one
        does; any room at all made a claim of every settle, where jobs end one at a time)."""
        want: dict[str, int] = {}
        for q in self.limits:
            if q in self.paused:
                continue
            free = max(self.open(q), 0)
            ahead = self.ahead_of(q)
            room = 0 if q in self._ahead_paused else ahead - len(self._waiting[q])
            # A claim in flight brings up to what it asked: its jobs fill the free slots
            # first, then the room ahead.
            brings = self._asking[q]
            free, room = max(free - brings, 0), room - max(brings - free, 0)
            if not free and room < ((ahead + 3) // 4 if carrying else (ahead + 1) // 2):
                room = 0
            if free + room > 0:
                want[q] = free + room
        return want

    def ahead_of(self, queue: str) -> int:
        """How many ``queue`` claims ahead now: its fixed claim_ahead, or what its pace sizes."""
        pace = self._paces.get(queue)
        if pace is None:
            return self.ahead[queue]
        return pace.ahead(self.limits[queue], self.ahead[queue], self.hold_limit)

    def claims_ahead(self) -> bool:
        """Whether any queue may claim ahead (an auto-sized one may, once its pace is known)."""
        return any(self.ahead.values())

    # -- what the worker asks ---------------------------------------------------------------

    def holds_jobs(self) -> bool:
        """Whether any job is running or held for a slot (held like a running one: renewed,
        reached by a drain, waited for by stop())."""
        return self._jobs > 0

    async def all_ended(self) -> None:
        while self.holds_jobs():
            await self.freed.park()

    def use(self) -> dict[str, tuple[int, int]]:
        """Each queue's running jobs and slots (its concurrency), for the slot gauges."""
        return {q: (self.in_flight[q], self.limits[q]) for q in self.limits}

    # -- placing a claim --------------------------------------------------------------------

    def unasked(self, queue: str) -> int:
        """``queue``'s free slots that no claim in flight will fill."""
        return max(self.open(queue) - self._asking[queue], 0)

    def claim_sent(self, asked: Mapping[str, int], free: Mapping[str, int]) -> None:
        """A claim went out for ``asked``, telling the driver ``free`` of them have a free
        slot: claimable() leaves what it asked to it, and its jobs not marked ahead are run
        in those slots, which no claim answered before it gives to a job taken ahead (a claim
        beside it, answered first, did: a job marked as run at once was held, and a crash
        charged it an attempt it never ran)."""
        self._asking.update(asked)
        self._promised.update(free)

    def claim_answered(self, asked: Mapping[str, int], free: Mapping[str, int]) -> None:
        """The claim ``claim_sent(asked, free)`` told of was answered (its jobs are placed
        next, in the same pass, then ``fill``) or failed."""
        self._asking.subtract(asked)
        self._promised.subtract(free)

    def answer_placed(
        self, asked: Mapping[str, int], got: Mapping[str, int], round_trip: float
    ) -> None:
        """A claim that asked ``asked`` of each queue brought ``got``, ``round_trip`` seconds
        after it was sent: an auto-sized queue it filled holds what covers its round trips
        (_Pace.hold), one that came up short AUTO_HOLD."""
        for q, n in asked.items():
            pace = self._paces.get(q)
            if pace is not None:
                pace.answered(full=got.get(q, 0) >= n, round_trip=round_trip)

    def fill(self, queues: Collection[str]) -> None:
        """Give what is free and promised to no claim to the held claims of ``queues``."""
        for q in queues:
            if self._waiting[q] and self.open(q) - self._promised[q] > 0:
                self._promote(q)

    def place(self, run: RunScope, definition: JobDefinition | None, now: float) -> None:
        """Run ``run`` in a free slot of its queue, or, taken ahead, once one frees (not one
        promised to a claim in flight). ``now``: the Trio clock, read once per answer."""
        claim = run.claim
        queue = claim.queue
        free = self.limits[queue] - self.in_flight[queue] - self._lingering[queue]
        if free - (self._promised[queue] if claim.ahead else 0) > 0:
            self._begin(run, definition, now)
            return
        held = _Held(self, run, definition, now + self.hold_limit)
        self._waiting[queue].append(held)
        if self._overdue_waits:  # hand_back_overdue waits for the first
            self._held_one.unpark_all()
        self.unstarted[queue] += 1
        self._jobs += 1
        # No task until a slot frees (_promote starts one); a cancel while it waits starts one
        # that hands it back.
        run.on_cancel(held)

    def begin_now(self, run: RunScope, definition: JobDefinition | None) -> None:
        """Run ``run`` in a slot of its queue whether or not one is free (``Worker.tick``)."""
        self._begin(run, definition, trio.current_time())

    def _begin(self, run: RunScope, definition: JobDefinition | None, now: float) -> None:
        """Start ``run`` in a slot of its queue. A claim the database marked ahead is recorded
        started by the next renewal; till then a crash here gives its attempt back."""
        claim = run.claim
        queue = claim.queue
        self.in_flight[queue] += 1
        self._jobs += 1
        if claim.ahead:
            run.start_unrecorded = True
        if queue in self._paces:
            run.slot_taken_at = now
        self._start_run(run, definition, self._release)

    def _held_cancelled(self, held: _Held) -> None:
        """A held claim's run was cancelled before a slot was handed to it: by a drain, a lost
        lease or an operator, or at its hold limit by hand_back_overdue (which took it out of
        _waiting itself). It never starts: a task hands it back, uncounted."""
        held.run.on_cancel(None)
        if not held.overdue:
            self._waiting[held.run.claim.queue].remove(held)
        self._start_run(held.run, held.definition, self._handed_back)

    def _handed_back(self, run: RunScope) -> None:
        # Counted unstarted until its hand-back is handed to the settler: the teardown waits for
        # it like a running job.
        self.unstarted[run.claim.queue] -= 1
        self._jobs -= 1
        self._note_idle()
        self.freed.unpark_all()

    def _release(self, run: RunScope) -> None:
        """A run's task has ended: its slot goes to its queue's oldest held claim, if any."""
        queue = run.claim.queue
        self.in_flight[queue] -= 1
        self._jobs -= 1
        began = run.slot_taken_at
        now = None
        if began is not None:
            # Its body's end, as its attempt read it: in this same scheduling step (tick()
            # writes its settlement in between, which its pace leaves out, as run()'s does).
            now = run.ended_at if run.ended_at is not None else trio.current_time()
            self._paces[queue].observe(now - began)
        if self._ahead_paused:
            self._ahead_paused.discard(queue)
        if self._waiting[queue]:
            # The slot's release and the next start, one reading of the clock (issue 44).
            self._promote(queue, now)
        if not self._jobs:
            self._on_idle()
        # Asked first: an unpark_all with no one parked is a few calls, at every run's end.
        if self.freed:
            self.freed.unpark_all()

    def _promote(self, queue: str, now: float | None = None) -> None:
        """Hand the free slots of ``queue`` to its oldest held claims: the clock read once for
        all of them (``now``, when the caller has just read it), where it was read for each."""
        waiting = self._waiting[queue]
        if now is None:
            now = trio.current_time()
        # What frees no slot (a held claim's start takes one) is read once.
        room = self.limits[queue] - self._lingering[queue] - self._promised[queue]
        in_flight = self.in_flight
        while waiting and room - in_flight[queue] > 0:
            held = waiting.popleft()
            held.run.on_cancel(None)  # from here a cancel reaches its body, as any run's
            self.unstarted[queue] -= 1
            self._jobs -= 1
            self._begin(held.run, held.definition, now)

    def _thread_ended(self) -> None:
        """An abandoned thread has really ended: its slot is free again."""
        for queue in self.limits:
            self._promote(queue)
        self.freed.unpark_all()

    def _note_idle(self) -> None:
        if not self.holds_jobs():
            self._on_idle()

    def drop_held(self, drain: Drain) -> None:
        """The worker failed, was cancelled from outside, or its budget ran out with claims
        still held: those are never started nor handed back from here (their leases lapse;
        nothing runs them twice)."""
        for queue, waiting in self._waiting.items():
            for held in waiting:
                held.run.on_cancel(None)
                drain.release(held.run)
                self.unstarted[queue] -= 1
                self._jobs -= 1
            waiting.clear()

    async def hand_back_overdue(self) -> None:
        """Cancel each held claim whose hold limit has passed (``HELD_TOO_LONG``: its task hands
        it back uncounted), and pause its queue's claiming ahead until one of its jobs ends.
        One task for every held claim: held in claim order with one hold limit, the oldest of
        each queue is always the first due."""
        while True:
            due = [waiting[0].deadline for waiting in self._waiting.values() if waiting]
            if not due:
                self._overdue_waits = True
                try:
                    await self._held_one.park()
                finally:
                    self._overdue_waits = False
                continue
            await trio.sleep_until(min(due))
            now = trio.current_time()
            for queue, waiting in self._waiting.items():
                while waiting and waiting[0].deadline <= now:
                    held = waiting.popleft()
                    held.overdue = True
                    self._ahead_paused.add(queue)
                    held.run.cancel(CancelReason.HELD_TOO_LONG)

    def pause(self, paused: frozenset[str]) -> dict[str, int]:
        """``paused`` are the worker's paused queues from now on: no claim asks for them, and
        each held claim of one is cancelled (``QUEUE_PAUSED``: its task hands it back
        unstarted, uncounted). Answers how many were, by newly paused queue. A resumed queue
        is claimed for again."""
        newly = paused - self.paused
        self.paused = paused
        handed_back = {}
        for queue in newly:
            # A copy: each cancel takes its claim out of the deque (_held_cancelled).
            held = list(self._waiting.get(queue, ()))
            for one in held:
                one.run.cancel(CancelReason.QUEUE_PAUSED)
            handed_back[queue] = len(held)
        self.freed.unpark_all()  # a claim loop waiting for a slot may claim again (a resume)
        return handed_back

    def waiting(self) -> bool:
        """Whether any claim taken ahead still waits for a slot."""
        return any(self._waiting.values())
