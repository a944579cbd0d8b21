# One claimed job run to its outcome: the body under its run scope, then the verdict.
# Apart because "what did this attempt end as" is answered here and nowhere else.
from __future__ import annotations

import json
import logging
import traceback
from typing import Any

import attrs
import trio

from .boundary import dump_json, storable_text
from .errors import JobsError, JobTimeout, ResultNotStorable
from .logs import log_event
from .operator_transitions import OPERATOR_CANCEL_ERROR
from .records import (
    CancelJob,
    Claim,
    Complete,
    DeadLetter,
    Park,
    Retry,
    Settlement,
    Suspend,
)
from .registry import JobDefinition
from .run_scope import CANCELLED, DRAINING, LEASE_LOST, TIMEOUT, RunScope
from .steps import Suspension

# Outcome names, as DESIGN's table and WorkerStats spell them.
COMPLETED = "completed"
SUSPENDED = "suspended"
RETRIED = "retried"
DEAD_LETTERED = "dead-lettered"
INTERRUPTED = "interrupted"
LOST = "lost"
CANCELLED_OUTCOME = "cancelled"
PARKED = "parked"
OUTCOMES = (
    COMPLETED,
    SUSPENDED,
    RETRIED,
    DEAD_LETTERED,
    INTERRUPTED,
    LOST,
    CANCELLED_OUTCOME,
    PARKED,
)


@attrs.frozen
class Outcome:
    job_id: str
    name: str
    kind: str
    settlement: Settlement | None  # None: nothing to write (lost)
    error: str | None = None
    seconds: float = 0.0


def describe(error: BaseException) -> str:
    """``error`` as the text stored with its job: ``Type: message`` (and a foreign ``code``),
    made storable by every driver and cut to ``MAX_ERROR_CHARS``. Never raises: an error whose
    ``__str__`` or ``code`` raises is described by what it raised, not allowed to crash the
    worker that is recording it."""
    try:
        message = str(error)
    except Exception as exc:
        message = f"<str() of this error raised {type(exc).__name__}>"
    text = f"{type(error).__name__}: {message}"
    if not isinstance(error, JobsError):
        try:
            code = getattr(error, "code", None)
            if code:
                text = f"{code}: {text}"
        except Exception:
            pass  # a broken ``code`` property: the type and message still say what happened
    return storable_text(text)


def parked(claim: Claim, known: list[str]) -> Outcome:
    reason = (
        f"no job named {claim.name!r} in this deploy's registry (known: {', '.join(known)}); "
        "parked, not failed: retry it once a deploy that declares it is running"
    )
    return Outcome(claim.job_id, claim.name, PARKED, Park(claim.lease, reason=reason), reason)


async def run_attempt(
    claim: Claim, definition: JobDefinition, run: RunScope, ctx: Any, worker_id: str
) -> Outcome:
    """Run the body under ``run``'s cancel scope; the verdict is read off the scope's first
    cancel reason, never off what the body raised: a body cut short by a drain may surface
    any error at all, and it is still interrupted."""
    started = trio.current_time()
    error: BaseException | None = None
    result: Any = None
    suspension: Suspension | None = None
    try:
        payload = json.loads(claim.payload)
        with run.cancel_scope:
            if definition.is_async:
                result = await definition.fn(ctx, payload)
            else:
                result = await trio.to_thread.run_sync(
                    _call_in_thread, definition, ctx, payload, abandon_on_cancel=True
                )
    except Suspension as exc:
        suspension = exc
    except trio.Cancelled:
        # Caught here only when it was NOT our run scope's (which swallows its own): an outer
        # scope is going away, and that must propagate.
        raise
    except Exception as exc:
        error = exc
    seconds = trio.current_time() - started
    return _verdict(claim, definition, run, result, error, suspension, seconds, worker_id)


def _call_in_thread(definition: JobDefinition, ctx: Any, payload: Any) -> Any:
    result = definition.fn(ctx, payload)
    try:
        trio.from_thread.check_cancelled()
    except trio.Cancelled:
        # The run was abandoned at its cancel and this body finished anyway: its result goes
        # nowhere (the run was already settled, fenced), and this line is how to find it.
        log_event("jobs.timeout.abandoned", logging.WARNING, job_id=ctx.job_id, job=ctx.name)
        raise
    return result


def _verdict(
    claim: Claim,
    definition: JobDefinition,
    run: RunScope,
    result: Any,
    error: BaseException | None,
    suspension: Suspension | None,
    seconds: float,
    worker_id: str,
) -> Outcome:
    lease = claim.lease
    reason = run.reason
    if reason == DRAINING:
        why = f"interrupted: worker {worker_id} is draining" + (
            f" (body stopped with {describe(error)})" if error else ""
        )
        retry = Retry(lease, delay=0.0, error=why, counts_as_attempt=False)
        return Outcome(claim.job_id, claim.name, INTERRUPTED, retry, why, seconds)
    if reason == LEASE_LOST:
        return Outcome(claim.job_id, claim.name, LOST, None, "lease lost", seconds)
    if reason == CANCELLED:
        why = OPERATOR_CANCEL_ERROR
        return Outcome(
            claim.job_id, claim.name, CANCELLED_OUTCOME, CancelJob(lease, why), why, seconds
        )
    if reason == TIMEOUT:
        error = JobTimeout(
            f"job {claim.name!r} ran past its timeout of {definition.timeout}s",
            fix="raise the job's timeout=, or make the body finish sooner",
        )
    if suspension is not None and reason is None:
        settle = Suspend(lease, delay=suspension.delay, event=suspension.event)
        return Outcome(claim.job_id, claim.name, SUSPENDED, settle, None, seconds)
    if error is None:
        try:
            text = _result_json(result, definition)
        except JobsError as exc:
            error = exc
        else:
            return Outcome(
                claim.job_id, claim.name, COMPLETED, Complete(lease, text), None, seconds
            )
    why = describe(error)
    if error.__traceback__ is not None:
        tail = "".join(traceback.format_exception(error)[-3:]).strip()
        log_event(
            "jobs.attempt.failed",
            logging.WARNING,
            job_id=claim.job_id,
            job=claim.name,
            attempt=claim.attempt,
            error=why,
            traceback=tail,
        )
    if definition.is_terminal(error) or claim.attempt >= claim.max_attempts:
        return Outcome(
            claim.job_id, claim.name, DEAD_LETTERED, DeadLetter(lease, why), why, seconds
        )
    delay = definition.backoff.delay(claim.attempt)
    return Outcome(claim.job_id, claim.name, RETRIED, Retry(lease, delay, why), why, seconds)


def _result_json(result: Any, definition: JobDefinition) -> str:
    """The result as JSON text every driver stores, within the job's ``max_result_bytes``;
    else ``ResultNotStorable`` (the verdict makes it the job's own failure). Checked by the
    same boundary as payloads, so a result nested 100,000 deep or holding a 5,000-digit int
    is a failure of its job, not a RecursionError or ValueError that takes the worker down."""
    try:
        return dump_json(
            result, job=definition.name, what="result", max_bytes=definition.max_result_bytes
        )
    except JobsError as exc:
        detail = exc.cause.removeprefix(f"job {definition.name!r}: ")
        raise ResultNotStorable(
            f"job {definition.name!r} returned a value that cannot be stored: {detail}",
            fix="return JSON values (dict, list, str, numbers, bool, None) or nothing, and "
            "keep large data elsewhere (return its key)",
        ) from exc
