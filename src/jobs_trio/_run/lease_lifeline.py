# The lease lifeline: a thread of the worker's own that notices when a job body blocks the Trio
# loop, names it, keeps the worker's leases from its own connection while the block lasts, and
# ends a process wedged past the blocker's timeout. Apart because it is the one part of a worker
# that runs off the Trio thread, and must keep working when nothing on that thread can.
from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import cast

import attrs
import trio

from .._core.ending import end_process
from .._core.errors import HandedBack, JobsError, JobTimeout
from .._core.logs import log_event
from .._core.records import AttemptNote, Claim, Complete, DeadLetter, Retry, Settlement
from .._jobs.registry import Registry
from ..drivers.contract import BesideConnection, Driver, RenewsBeside
from .attempt import _result_json, describe, judged_code
from .lifecycle import ABANDONED_EXIT_CODE
from .run_scope import RunScope

# A loop that has not answered for this long is blocked: logged, and from here watched.
BLOCK_WARN = 1.0
# How long a body may block the loop when its job has no timeout of its own: past it the
# process is ended (below). Blocking an event loop for minutes is never the design.
DEFAULT_BLOCK_LIMIT = 300.0


@attrs.define
class _Block:
    """One stretch of the loop not answering."""

    start: float  # time.monotonic() of the ping it did not answer
    claim: Claim | None = None  # the job whose body holds the loop, when one does
    where: str = "unknown"
    limit: float = DEFAULT_BLOCK_LIMIT
    next_warn: float = BLOCK_WARN
    renewed_at: float = -math.inf
    renewals: int = 0


class LeaseLifeline:
    """Runs as a service of the worker (``nursery.start(lifeline.run)``). While the worker holds
    runs, its thread asks the Trio loop for a sign of life every ``tick``. When none comes:

    - at ``BLOCK_WARN`` it logs ``jobs.worker.loop-blocked`` naming the job whose body holds
      the loop (read from the Trio thread's stack) and where, and again at every doubling;
    - from half a renewal interval on, it renews every held run's lease on its OWN connection
      (``RenewsBeside``) once per interval, so the lease does not lapse and another worker does
      not run the same job beside the blocked one (issue 32: a `time.sleep(7)` in an async body
      with a 2 s lease ran on two workers at once);
    - past the blocker's timeout (``DEFAULT_BLOCK_LIMIT`` without one) the process is wedged:
      Trio cannot stop a body that never yields, so it settles what it can from its own
      connection — the blocker timed out (counted, as its timeout would be), every other running
      job handed back uncounted, every finished one's result written — and ends the process
      with exit code 70. The blocker never runs on two workers at once, and no other job pays.
    """

    def __init__(
        self,
        driver: Driver,
        registry: Registry,
        worker_id: str,
        *,
        lease: float,
        renew_interval: float,
        held: Callable[[], Sequence[RunScope]],
        unwritten: Callable[[], Sequence[Settlement]],
        end_by: Callable[[], float | None] = lambda: None,
    ) -> None:
        self._driver = cast(RenewsBeside, driver) if driver.capabilities.renews_beside else None
        self._registry = registry
        self._worker_id = worker_id
        self._lease = lease
        self._renew_interval = renew_interval
        self._held = held
        self._unwritten = unwritten
        # When a signalled process must have ended (time.monotonic; the lifecycle's end_by):
        # a loop still blocked then ends it here, as a wedged one, but as a drain ends a job.
        self._end_by = end_by
        # A ping is answered within a tick on a responsive loop; several per renewal interval,
        # so a block is caught well before a lease could lapse.
        self._tick = min(0.25, renew_interval / 4)
        # A wait of this thread's own that overran by this much: no thread of the process ran
        # (a C call holding the GIL, a stopped process or machine), this one included.
        self._stall_after = max(renew_interval, BLOCK_WARN)
        self._answered = 0  # the last ping the Trio loop answered (written on the Trio thread)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # Looked up, not imported: trio.testing loads pytest's assertion machinery (~90 ms of
        # every worker process's start), and a run whose clock is a MockClock imported it.
        testing = sys.modules.get("trio.testing")
        if testing is not None and isinstance(trio.lowlevel.current_clock(), testing.MockClock):
            # Trio's time is not the wall's here (tests): a ping per tick would keep waking a
            # loop that a test means to be idle, and nothing real can block it for long.
            task_status.started()
            return
        stop = threading.Event()
        token = trio.lowlevel.current_trio_token()
        trio_thread = threading.get_ident()
        task_status.started()
        try:
            await trio.to_thread.run_sync(
                self._watch,
                token,
                trio_thread,
                stop,
                abandon_on_cancel=True,
                limiter=trio.CapacityLimiter(1),
            )
        finally:
            # Abandoned when the worker ends: the thread notices at its next tick (or once a
            # call on its connection, bounded by the driver's timeouts, returns) and closes it.
            stop.set()

    def _beat(self, ping: int) -> None:
        self._answered = ping

    def _watch(
        self, token: trio.lowlevel.TrioToken, trio_thread: int, stop: threading.Event
    ) -> None:
        beside: list[BesideConnection] = []  # opened at its first use
        sent = 0
        sent_at = 0.0
        block: _Block | None = None
        try:
            while True:
                waited_from = time.monotonic()
                if stop.wait(self._tick):
                    return
                now = time.monotonic()
                if now - waited_from >= self._stall_after:
                    self._stalled(now - waited_from)
                if self._answered == sent:
                    if block is not None:
                        self._ended(block, now)
                        block = None
                    if not self._runs():
                        continue  # idle: nothing to keep, and no wake of an idle loop
                    sent += 1
                    sent_at = now
                    try:
                        token.run_sync_soon(self._beat, sent)
                    except trio.RunFinishedError:
                        return
                    continue
                if block is None:
                    block = _Block(start=sent_at)
                    self._identify(block, trio_thread)
                self._blocked(block, now, trio_thread, beside, sent)
        finally:
            for connection in beside:
                connection.close()

    def _runs(self) -> list[RunScope]:
        """The runs the worker holds, read from this thread: the Trio thread changes that set
        only when it runs, which is not while this thread acts on a block."""
        for _ in range(3):
            try:
                return list(self._held())
            except RuntimeError:  # changed while read: the loop has just moved again
                continue
        return []

    def _identify(self, block: _Block, trio_thread: int) -> None:
        claim, where = blocker(trio_thread)
        block.claim, block.where = claim, where
        definition = self._registry.get(claim.name) if claim is not None else None
        if definition is not None and definition.timeout is not None:
            block.limit = definition.timeout

    def _blocked(
        self,
        block: _Block,
        now: float,
        trio_thread: int,
        beside: list[BesideConnection],
        sent: int,
    ) -> None:
        blocked_for = now - block.start
        if blocked_for >= block.next_warn:
            if block.claim is None:
                # Identified at the block's start; a body that entered the loop's hold later
                # (unlikely) is looked for again with each line.
                self._identify(block, trio_thread)
            block.next_warn *= 2
            log_event(
                "jobs.worker.loop-blocked",
                logging.WARNING,
                **self._about(block, blocked_for),
                leases="renewed beside the loop" if self._driver else "not renewed (no driver)",
                fix="an async body must not block the event loop: run blocking calls with"
                " trio.to_thread.run_sync, or declare the job sync (def, not async def) so it"
                " runs in a thread of its own",
            )
        due = min(self._renew_interval / 2, BLOCK_WARN)
        if (
            self._driver is not None
            and blocked_for >= due
            and now - block.renewed_at >= self._renew_interval
        ):
            block.renewed_at = now
            self._renew(block, beside)
        if blocked_for >= block.limit:
            self._end_wedged(block, blocked_for, beside, sent)
        end_by = self._end_by()
        if end_by is not None and now >= end_by:
            # Signalled, and the grace is spent with the loop still blocked: the drain cannot
            # run, and waiting on would hold every other job's lease for a process told to go
            # until something killed it (each job then orphaned).
            self._end_wedged(block, blocked_for, beside, sent, drained=True)

    def _connection(self, beside: list[BesideConnection]) -> BesideConnection:
        assert self._driver is not None
        if not beside:
            beside.append(self._driver.beside())
        return beside[0]

    def _renew(self, block: _Block, beside: list[BesideConnection]) -> None:
        runs = self._runs()
        if not runs:
            return
        sent = time.monotonic()
        try:
            held = self._connection(beside).renew([r.claim.lease for r in runs], lease=self._lease)
        except JobsError as exc:
            log_event("jobs.lease.renew-failed", logging.WARNING, runs=len(runs), error=str(exc))
            return
        for run in runs:
            if run.claim.token in held:
                run.beside_until = sent + self._lease
        if block.renewals == 0:
            log_event(
                "jobs.lease.renewed-beside",
                worker=self._worker_id,
                runs=len(held),
                why="the event loop is blocked; the lifeline's own connection keeps the leases",
            )
        block.renewals += 1

    def _stalled(self, stalled_for: float) -> None:
        """This thread could not run either: nothing renewed the leases meanwhile, beside the
        loop or on it. Said once it runs again, since the lease that lapsed meanwhile is
        reported by the worker that claims the job next, as a crash."""
        runs = self._runs()
        if not runs:
            return
        log_event(
            "jobs.worker.process-stalled",
            logging.WARNING,
            worker=self._worker_id,
            stalled_for=round(stalled_for, 1),
            jobs=[run.job_id for run in runs],
            why="no thread of this process ran for that long (a C call holding the GIL, a"
            " stopped process or machine), so nothing renewed its leases: a job whose lease"
            " ran out meanwhile may have been claimed and run by another worker",
            fix="run GIL-holding work (a large json.loads, a regex, C code) in a subprocess,"
            " or raise the lease above the longest such call",
        )

    def _ended(self, block: _Block, now: float) -> None:
        if now - block.start >= BLOCK_WARN:
            log_event(
                "jobs.worker.loop-unblocked",
                logging.WARNING,
                **self._about(block, now - block.start),
            )

    def _about(self, block: _Block, blocked_for: float) -> dict[str, object]:
        """The fields every line about a block carries."""
        claim = block.claim
        return {
            "worker": self._worker_id,
            "job_id": claim.job_id if claim else None,
            "job": claim.name if claim else None,
            "blocked_for": round(blocked_for, 1),
            "where": block.where,
        }

    def _end_wedged(
        self,
        block: _Block,
        blocked_for: float,
        beside: list[BesideConnection],
        sent: int,
        *,
        drained: bool = False,
    ) -> None:
        """Settle what the worker holds from this thread's connection and end the process
        (exit 70). ``drained``: the drain's grace ran out with the loop blocked, and the
        blocker is abandoned as a drain abandons a body (nothing written; its lease lapses)
        where past its timeout it is timed out."""
        if self._answered == sent:
            return  # the loop answered the ping just now: it runs again (see below)
        claim = block.claim
        runs = self._runs()
        endings: list[Settlement] = []
        if claim is not None:
            # Identified: the blocker's attempt ends timed out and every other body that was
            # running is handed back. Not identified, nothing running is settled (the blocker
            # might be any of them, and handed back uncounted it would wedge the next worker
            # for ever): their leases lapse and the orphan rule takes them (orphaned, not
            # counted; the blocker, orphaned twice, runs alone and dies X_KILLED_WORKER).
            for run in runs:
                if run.settling:
                    continue  # its ending waits in the settler, below
                finished = self._finished_in_thread(run)
                if finished is not None:
                    endings.append(finished)
                elif run.claim.token != claim.token:
                    endings.append(self._handed_back(run.claim, claim, blocked_for, drained))
                elif drained:
                    log_event(
                        "jobs.worker.drain-abandoned",
                        logging.ERROR,
                        worker=self._worker_id,
                        job_id=claim.job_id,
                        job=claim.name,
                        fix="the body blocked the event loop through the drain's grace period"
                        " (a blocking call in an async body): its lease lapses and it runs"
                        " again elsewhere. Run blocking calls with trio.to_thread.run_sync, or"
                        " declare the job sync",
                    )
                else:
                    endings.append(self._timed_out(claim, blocked_for, block))
        else:
            # Each one named all the same: its lease lapses and it runs again elsewhere, and a
            # job that does must not pass unsaid (the line below named none of them).
            for run in runs:
                finished = None if run.settling else self._finished_in_thread(run)
                if finished is not None:
                    endings.append(finished)  # a thread's body: not what blocks the loop
                elif run.held_for_slot:
                    # Claimed ahead, never started: not the blocker either, handed back.
                    endings.append(self._handed_back(run.claim, None, blocked_for, drained))
                elif not run.settling:
                    log_event(
                        "jobs.worker.drain-abandoned" if drained else "jobs.worker.run-abandoned",
                        logging.ERROR,
                        worker=self._worker_id,
                        job_id=run.job_id,
                        job=run.claim.name,
                        error="the event loop was blocked by a body that could not be told apart"
                        " from the others, so none is settled from here",
                        fix="its lease lapses and it runs again elsewhere; find the blocking"
                        " call (jobs.worker.loop-blocked's where=) and run it in a thread",
                    )
        if self._answered == sent:
            # The loop answered while this was decided: it runs again, and its own teardown
            # (or the body's timeout) settles these; written from here too, two writers would
            # race for each job's row (its token fences all but one). Past this point the
            # process ends whatever the loop does.
            return
        endings.extend(self._unwritten())
        log_event(
            "jobs.worker.loop-wedged",
            logging.ERROR,
            **self._about(block, blocked_for),
            limit=block.limit,
            settling=len(endings),
            why=(
                "the drain's grace period ran out while a job body blocked the event loop: the"
                " drain cannot run, so this process ends (exit 70) after settling what it holds"
                if drained
                else "a job body blocked the event loop past its timeout; Trio cannot stop a"
                " body that never yields, so this process ends (exit 70) after settling what"
                " it holds"
            ),
        )
        if endings and self._driver is not None:
            try:
                self._connection(beside).settle(endings)
            except JobsError as exc:
                log_event(
                    "jobs.worker.settle-abandoned",
                    logging.ERROR,
                    worker=self._worker_id,
                    jobs=[s.lease.job_id for s in endings],
                    error=str(exc),
                    fix="their leases lapse and they run again elsewhere (at-least-once)",
                )
        end_process(ABANDONED_EXIT_CODE)

    def _finished_in_thread(self, run: RunScope) -> Settlement | None:
        """The completion of a sync body that returned in its thread while the loop was
        blocked (its task never heard of it), or None."""
        finished = run.returned_in_thread
        definition = self._registry.get(run.claim.name)
        if finished is None or definition is None:
            return None
        result, seconds = finished
        try:
            text = "null" if result is None else _result_json(result, definition)
        except JobsError:
            return None  # not storable: left to the others' way (handed back, its lease)
        claim = run.claim
        return Complete(claim.lease, text, AttemptNote(claim.attempt, self._worker_id, seconds))

    def _timed_out(self, claim: Claim, blocked_for: float, block: _Block) -> Settlement:
        error = describe(
            JobTimeout(
                f"job {claim.name!r} ({claim.job_id}) blocked its worker's event loop for"
                f" {blocked_for:.0f} s, past its limit of {block.limit:g} s, at {block.where};"
                " Trio cannot cancel a body that never yields, so the worker process was ended",
                fix="make the body yield: run blocking calls with trio.to_thread.run_sync, or"
                " declare the job sync (def, not async def)",
            )
        )
        definition = self._registry.get(claim.name)
        if definition is None or claim.attempt >= claim.max_attempts:
            return DeadLetter(claim.lease, error)
        return Retry(claim.lease, definition.backoff.delay(claim.attempt), error)

    def _handed_back(
        self, claim: Claim, blocker: Claim | None, blocked_for: float, drained: bool
    ) -> Settlement:
        during = " through its drain's grace period" if drained else ""
        who = f"job {blocker.name!r} ({blocker.job_id})" if blocker else "a job body"
        error = describe(
            HandedBack(
                f"interrupted: worker {self._worker_id!r} ended because {who} blocked its"
                f" event loop for {blocked_for:.0f} s{during}; this job was handed back to the"
                " queue, its attempt uncounted",
                fix="nothing for this job: another worker runs it",
            )
        )
        return Retry(claim.lease, 0.0, error, hands_back=True)


def blocker(trio_thread: int) -> tuple[Claim | None, str]:
    """The claim whose body the Trio thread is inside, and where that thread is (the innermost
    Python frame). A running coroutine's frame links back through the awaits that reached it,
    so the body's chain passes through the attempt's own frame, which holds its claim."""
    frame: FrameType | None = sys._current_frames().get(trio_thread)
    if frame is None:
        return None, "unknown"
    where = _place(frame)
    while frame is not None:
        if frame.f_code is judged_code():
            try:
                found = frame.f_locals.get("claim")
            except Exception:  # a frame that cannot be read from here: named by place only
                return None, where
            return (found if isinstance(found, Claim) else None), where
        frame = frame.f_back
    return None, where


def _place(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
