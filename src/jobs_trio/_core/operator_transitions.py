# An operator's transitions (retry, cancel, delete, run now): which states allow them, the errors
# when they do not, and each as a bulk action (the CLI's and the dashboard's). Apart so every
# driver refuses the same things in the same words, and both front ends act alike.
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import attrs

from .errors import InvalidTransition, JobNotFound
from .records import CancelJob, JobId, JobRecord, JobState, Park, Retry, Settlement, Suspend

if TYPE_CHECKING:
    from ..drivers.contract import Driver

T = TypeVar("T")

RETRYABLE_STATES = frozenset({JobState.DEAD, JobState.CANCELLED, JobState.PARKED})
# Cancelled at once; a running job is only flagged (its worker stops it at the next renewal).
CANCELLABLE_STATES = frozenset({JobState.READY, JobState.SUSPENDED, JobState.PARKED})
OPERATOR_CANCEL_ERROR = "cancelled by an operator"
# Every state but running: a running job's body is somewhere in the fleet, and deleting its row
# under it would leave a run whose every write is refused and whose end nobody records.
DELETABLE_STATES = frozenset(JobState) - {JobState.RUNNING}


def found(record: T | None, job_id: JobId) -> T:
    """``record`` (a job, or a driver's row of one), or ``JobNotFound``."""
    if record is None:
        raise JobNotFound(f"no job with id {job_id!r}", fix="check the id with `jobs-trio list`")
    return record


def check_retry(record: JobRecord) -> None:
    if record.state not in RETRYABLE_STATES:
        raise InvalidTransition(
            f"job {record.id} is {record.state.value}; "
            "only dead, cancelled or parked jobs can be retried",
            fix="wait for it to finish, or cancel it first",
        )


def key_held(job_id: JobId, key: str | None) -> InvalidTransition:
    return InvalidTransition(
        f"job {job_id}'s key {key!r} is held by another live job",
        fix="let that job finish or cancel it, then retry this one",
    )


def cancel_flags_only(record: JobRecord) -> bool:
    """True: the job is running, so the cancel is a request; False: cancel it now. Raises for
    a job that has finished."""
    if record.state is JobState.RUNNING:
        return True
    if record.state in CANCELLABLE_STATES:
        return False
    raise InvalidTransition(
        f"job {record.id} is {record.state.value} and can no longer be cancelled",
        fix="nothing to do: it has finished",
    )


def check_delete(record: JobRecord) -> None:
    if record.state not in DELETABLE_STATES:
        raise InvalidTransition(
            f"job {record.id} is running and cannot be deleted",
            fix="cancel it first (its worker stops the run at its next lease renewal), then"
            " delete it once it is cancelled",
        )


def check_run_now(record: JobRecord) -> None:
    """Only a ready job: one scheduled ahead, backing off after a failure, or put off for a
    fleet limit. A suspended job waits in a step, which would suspend it again at once."""
    if record.state is JobState.READY:
        return
    if record.state is JobState.SUSPENDED:
        fix = "send the event it waits for, or let it sleep: a step.sleep woken early sleeps on"
    elif record.state in RETRYABLE_STATES:
        fix = "retry it instead (`jobs-trio retry ID`): it runs again now, its attempts reset"
    else:
        fix = "nothing to do: it is running or has finished"
    raise InvalidTransition(
        f"job {record.id} is {record.state.value}; only a ready job can be run now", fix=fix
    )


def cancel_instead(settlement: Settlement) -> CancelJob | None:
    """What a settlement becomes when an operator's cancel is pending on its job: an ending that
    would leave the job live (a retry, an interrupted attempt, a suspension, a park) ends it
    cancelled instead, its attempt counted, as a cancel heard at renewal would have. None for an
    ending that already finishes the job (completed, dead, cancelled): that one stands.

    Without this the flag was cleared by the settlement and the job ran again: the operator
    asked it to stop, and its body failing before the next renewal must not undo that. The
    drivers apply it under the settlement's own fence, in the same write (for PostgreSQL in the
    settle SQL, with this function's text as a column)."""
    match settlement:
        case Retry(error=ended) | Park(reason=ended):
            return CancelJob(
                settlement.lease,
                f"{OPERATOR_CANCEL_ERROR} (the attempt ended first: {ended})",
                note=settlement.note,  # the same attempt, as its history records it
            )
        case Suspend():
            return CancelJob(settlement.lease, OPERATOR_CANCEL_ERROR, note=settlement.note)
    return None


# Each transition as a bulk action: over one job by its id, or every job a filter matches.


@attrs.frozen
class Bulk:
    """One bulk action (a CLI command, a dashboard button): its verb, the states it acts on,
    the driver call, what it says of one job it acted on, and its help."""

    verb: str  # "retry" / "cancel" / ...
    done: str  # "retried" / "cancelled" / ...
    states: frozenset[JobState]  # a --state outside these is refused
    default_states: tuple[JobState, ...]  # with no --state
    act: Callable[[Driver, str], Awaitable[JobRecord]]
    said: Callable[[JobRecord], str]  # one job acted on, after its id
    text: str  # the command's help


def _cancelled(record: JobRecord) -> str:
    if record.state is JobState.RUNNING:
        return "running; cancel requested (its worker stops the run at its next lease renewal)"
    return str(record.state)


RETRY = Bulk(
    "retry",
    "retried",
    RETRYABLE_STATES,
    (JobState.DEAD,),
    lambda driver, job_id: driver.retry(job_id),
    lambda record: f"{record.state}, attempts reset ({record.attempts}/{record.max_attempts})",
    "Put dead, cancelled or parked jobs back to ready, attempts reset: one by ID, or every job"
    " the filters match (default --state dead).",
)
# A running job is cancelled only when asked for by --state running: its body is stopped at its
# worker's next renewal, which a filter by queue alone should not do to a whole queue.
CANCEL = Bulk(
    "cancel",
    "cancelled",
    CANCELLABLE_STATES | {JobState.RUNNING},
    tuple(sorted(CANCELLABLE_STATES)),
    lambda driver, job_id: driver.cancel(job_id),
    _cancelled,
    "Cancel jobs: one by ID (a running one stops at its next lease renewal), or every job the"
    " filters match (default: ready, suspended and parked; --state running for running ones).",
)
# A delete cannot be undone: with filters and no --state it takes only dead jobs, the ones an
# operator clears away most; every other state is asked for by name.
DELETE = Bulk(
    "delete",
    "deleted",
    DELETABLE_STATES,
    (JobState.DEAD,),
    lambda driver, job_id: driver.delete(job_id),
    lambda record: f"deleted (it was {record.state}), with its steps and attempt history",
    "Delete jobs that are not running, with their step records and attempt history (their keys"
    " are free again): one by ID, or every job the filters match (default --state dead).",
)
RUN_NOW = Bulk(
    "run-now",
    "made due",
    frozenset({JobState.READY}),
    (JobState.READY,),
    lambda driver, job_id: driver.run_now(job_id),
    lambda record: f"due now (attempts {record.attempts}/{record.max_attempts})",
    "Run ready jobs now that wait for their time (scheduled, backing off after a failure, put"
    " off for a fleet limit): one by ID, or every job the filters match. A job of a paused"
    " queue waits for its resume.",
)
BULKS = (RETRY, CANCEL, DELETE, RUN_NOW)
