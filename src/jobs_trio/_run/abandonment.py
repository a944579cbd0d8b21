# What a teardown gives up on at its budget, named and counted: the bodies still running when
# the wait for them was cut, the settlements still unwritten when the writes' deadline passed.
# Apart because each is a job that runs again elsewhere, and the process must say so loudly.
from __future__ import annotations

import logging
from typing import cast

import trio

from .._core.logs import log_event
from .._core.records import Lease
from ..drivers.contract import Driver, UnmarksAlone
from .attempt import describe
from .budget import WRITE_FLOOR, Budget
from .drain import Drain
from .run_scope import RunScope
from .settler import Settler, lost_settlement


def bodies_running(drain: Drain) -> bool:
    """Whether a run whose body has not ended is still held (or a claim held for a slot whose
    hand-back has not been handed in)."""
    return any(not run.settling for run in drain.held)


def abandon_bodies(drain: Drain, budget: Budget, worker_id: str) -> tuple[str, ...]:
    """The budget ran out on bodies still running: each is named (the process exits non-zero),
    and nothing of it is written: its lease lapses and it runs again elsewhere. The settlements
    already handed in are still written, under the floor. Answers their job ids."""
    running = [run for run in drain.held if not (run.settling or run.abandoned)]
    if running:
        log_event(
            "jobs.worker.wait-cut",
            logging.WARNING,
            worker=worker_id,
            running=len(running),
            settling=len(drain) - len(running),
            writes_within=round(max(budget.writes_deadline - trio.current_time(), 0), 3),
            why="the teardown's budget for bodies ran out (the grace period, or a second"
            " signal); the endings already decided are still written",
        )
    for run in running:
        # A sync body's thread stops being waited for (its slot stays taken until it really
        # ends); nothing of this run is written.
        _abandon(
            run,
            worker_id,
            "jobs.worker.drain-abandoned",
            "the body did not stop within the grace period (an async body that swallows"
            " Cancelled or shields itself, a sync body or sync step that does not call"
            " ctx.check_cancelled(), or a step whose record the database did not take in time);"
            " its lease lapses and it runs again elsewhere. Let it stop, check the database, or"
            " raise grace",
        )
    return tuple(run.job_id for run in running)


def abandon_at_failure(drain: Drain, worker_id: str, error: BaseException) -> tuple[str, ...]:
    """The worker failed (or the task running it was cancelled from outside) with bodies still
    running: each is cut where it stands and named (``cut_without_drain``). A run whose ending
    was handed in already is the settler's to write or name. Answers their job ids."""
    running = [run for run in drain.held if not (run.settling or run.abandoned)]
    for run in drain.held:
        run.abandon()  # a sync body's thread is not waited for: the runs nursery must close
    cause = _cause(error)
    for run in running:
        cut_without_drain(run, worker_id, cause)
    return tuple(run.job_id for run in running)


def cut_without_drain(run: RunScope, worker_id: str, cause: str = "cancelled from outside") -> None:
    """A body cut by the worker's going away without a drain, named as one abandoned at a
    drain's grace is: a job that runs again elsewhere must not pass unsaid (the stopped line
    read abandoned=0)."""
    _abandon(
        run,
        worker_id,
        "jobs.worker.run-abandoned",
        "the worker stopped without a drain while this body ran (the error above, or the task"
        " running the worker was cancelled): nothing of it is written; its lease lapses and it"
        " runs again elsewhere, as after a crash. Fix the error, and stop a worker by its"
        " lifecycle (SIGTERM) or stop() to hand its jobs back",
        error=cause,
    )


def _abandon(run: RunScope, worker_id: str, event: str, fix: str, **fields: str) -> None:
    """Stop waiting for ``run``, write nothing of it, and name it at ERROR."""
    run.abandon()
    log_event(
        event,
        logging.ERROR,
        worker=worker_id,
        job_id=run.job_id,
        job=run.claim.name,
        **fields,
        fix=fix,
    )


def _cause(error: BaseException) -> str:
    """What stopped the worker: its first error out of the nurseries' groups, the cancels of
    the tasks it took down with it left out; as stored error text is (``describe``: cut,
    escaped, and never raising for an error whose own ``__str__`` does)."""
    if isinstance(error, BaseExceptionGroup):
        _, rest = error.split(trio.Cancelled)
        if rest is None:
            return "cancelled from outside"
        while isinstance(rest, BaseExceptionGroup):
            rest = rest.exceptions[0]
        error = rest
    if isinstance(error, trio.Cancelled):
        return "cancelled from outside"
    return describe(error)


async def unmark_abandoned_alone(drain: Drain, driver: Driver, worker_id: str) -> None:
    """The runs claimed alone (suspects) whose bodies were just abandoned are told to the
    driver as no longer alone (``UnmarksAlone``): their lapse then orphans them, where it would
    have dead-lettered them X_KILLED_WORKER for a death that was the drain's doing, not theirs
    (docs/model.md, "A worker's death"). Their leases still lapse as any: their bodies may run
    until the process exits. Called under the teardown's writes deadline; a failure is logged
    and never holds the exit."""
    leases = [run.claim.lease for run in drain.held if run.abandoned and run.claim.alone]
    if not leases or not driver.capabilities.unmarks_alone:
        return
    try:
        await cast(UnmarksAlone, driver).unmark_alone(leases)  # declared by its capabilities
    except trio.Cancelled:
        _unmark_failed(leases, worker_id, "the teardown's deadline for writes passed first")
        raise  # the writes' deadline: the teardown goes on as cut
    except Exception as exc:  # any failure: the exit must not wait on this write, nor fail by it
        _unmark_failed(leases, worker_id, str(exc))


def alone_left_marked(drain: Drain, cut: tuple[str, ...], worker_id: str) -> None:
    """Bodies and writes were cut at the same instant (the budget was bound before this worker
    held its run alone): the runs claimed alone among those just abandoned (``cut``, their job
    ids) could not be unmarked."""
    leases = [run.claim.lease for run in drain.held if run.job_id in cut and run.claim.alone]
    if leases:
        _unmark_failed(leases, worker_id, "no time was left for writes")


def _unmark_failed(leases: list[Lease], worker_id: str, error: str) -> None:
    for lease in leases:
        log_event(
            "jobs.worker.alone-unmark-failed",
            logging.WARNING,
            worker=worker_id,
            job_id=lease.job_id,
            error=error,
            fix="this job ran alone (orphaned twice before) and was abandoned at the drain's"
            " grace: its lease's lapse dead-letters it X_KILLED_WORKER though the drain, not"
            " the job, ended its worker; `jobs-trio retry ID` it once dead, and let its body"
            " stop within the grace (ctx.check_cancelled(), or a longer grace)",
        )


def report_unwritten(drain: Drain, settler: Settler, worker_id: str) -> tuple[str, ...]:
    """The writes' deadline ran out with settlements unwritten: each job is named, so the
    process exits non-zero rather than drop a result silently. Answers their job ids."""
    unwritten = {s.lease.token: s for s in settler.unwritten()}
    settler.reported = True
    abandoned: list[str] = []
    for run in drain.held:
        if not run.settling:
            continue  # a body still running: named with the bodies
        abandoned.append(run.job_id)
        settlement = unwritten.pop(run.claim.token, None)
        log_event(
            "jobs.worker.settle-abandoned",
            logging.ERROR,
            worker=worker_id,
            job_id=run.job_id,
            job=run.claim.name,
            outcome=type(settlement).__name__ if settlement else "unknown",
            fix="the database did not take this attempt's settlement before the teardown's"
            f" deadline (the grace period, or {WRITE_FLOOR:g} s after a second signal); its"
            " lease lapses and it runs again elsewhere (at-least-once). Check the database",
        )
    for settlement in unwritten.values():  # handed in by a run no longer held (tick())
        abandoned.append(settlement.lease.job_id)
        lost_settlement(settlement, worker_id)
    return tuple(abandoned)
