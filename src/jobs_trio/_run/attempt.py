# One claimed job run to its outcome: parked if this deploy does not know it, else its body under
# its run scope with a context of its own, then the verdict.
# Apart because "what did this attempt end as" is answered here and nowhere else.
from __future__ import annotations

import logging
import os
import time
import traceback
import types
from contextlib import AbstractContextManager
from types import CodeType
from typing import Any

import attrs
import outcome
import trio

from .._core.boundary import MAX_ERROR_CHARS, dump_json, load_json, storable_text
from .._core.errors import AttemptCancelled, JobsError, ResultNotStorable
from .._core.fast_init import fast_init
from .._core.forked_child import end_if_forked, own_pid
from .._core.logs import ExcInfo, log_event, log_exception
from .._core.operator_transitions import OPERATOR_CANCEL_ERROR
from .._core.records import (
    AttemptNote,
    CancelJob,
    Claim,
    Complete,
    DeadLetter,
    OutcomeKind,
    Park,
    Retry,
    Settlement,
    Suspend,
)
from .._core.run_context import RestoreContext, restored, trace_of
from .._core.tracing import AttemptSpan, attempt_span, tracing
from .._jobs.registry import JobDefinition, Registry
from ..drivers.contract import Driver
from .context import JobContext
from .run_scope import CancelReason, RunScope
from .steps import Suspension
from .thread_slots import ThreadSlots


@fast_init  # made for every job: see fast_init.py
@attrs.frozen
class Outcome:
    job_id: str
    name: str
    kind: OutcomeKind
    settlement: Settlement | None  # None: nothing to write (lost)
    error: str | None = None
    seconds: float = 0.0
    traceback: str | None = None  # the tail of the error's traceback, when the body raised
    # The error that ended the job (dead-lettered), for its log line's record (error trackers).
    exc_info: ExcInfo | None = attrs.field(default=None, eq=False, repr=False)


def describe(error: BaseException) -> str:
    """``error`` as the text stored with its job: ``Type: message`` (and a foreign ``code``),
    made storable by every driver and cut to ``MAX_ERROR_CHARS``. Never raises: an error whose
    ``__str__`` or ``code`` raises is described by what it raised, not allowed to crash the
    worker that is recording it."""
    try:
        message = str(error)
    except BaseException as exc:  # whatever a hostile __str__ raises
        message = f"<str() of this error raised {type(exc).__name__}>"
    text = f"{type(error).__name__}: {message}"
    if isinstance(error, BaseExceptionGroup):
        # "Exceptions from Trio nursery (1 sub-exception)" says nothing of what failed: the
        # errors inside it do (a body's own nursery wraps whatever its tasks raised).
        text += " [" + "; ".join(describe(leaf) for leaf in _leaves(error)[:_LEAVES]) + "]"
    if not isinstance(error, JobsError):
        try:
            code = getattr(error, "code", None)
            if code:
                text = f"{code}: {text}"
        except BaseException:
            pass  # a broken ``code`` property: the type and message still say what happened
    return storable_text(text)


async def run_attempt(
    claim: Claim,
    definition: JobDefinition | None,
    run: RunScope,
    *,
    registry: Registry,
    driver: Driver,
    worker_id: str,
    threads: ThreadSlots,
    in_span: bool = False,
) -> Outcome:
    """The verdict on one claim. Parked when this deploy's ``registry`` declares no job of its
    name (``definition`` None), unless a hand-back reason cancelled it first; else its body
    runs with a context of its own under ``run``'s cancel scope, and is judged: a body that
    RETURNED completed, whatever was asked of its scope meanwhile; one that UNWOUND is judged
    by the scope's first cancel reason, never by what it raised (a body cut short by a drain
    may surface any error at all, and it is still interrupted). ``in_span``: called by itself
    inside the attempt's span (a tracer provider is set)."""
    if definition is None:
        if run.reason in _HANDED_BACK:
            # Cancelled before it was looked at (a claim answered late, a drain): handed back
            # like any unstarted claim, so a worker that declares the job may run it, rather
            # than parked here until an operator retries it.
            return _handed_back(claim, run, None, 0.0, _note(claim, worker_id, None))
        # No span: nothing ran.
        return _parked(claim, sorted(d.name for d in registry), _note(claim, worker_id, None))
    if not in_span:
        # A run started in a worker that is being cancelled from outside (a slot freed by a
        # run going away hands itself to the next claim): it ends here, before a line of its
        # body, rather than at the body's first checkpoint. Nothing is written; its lease
        # lapses.
        await trio.lowlevel.checkpoint_if_cancelled()
        if tracing():
            # One span per attempt (with OpenTelemetry and a tracer provider), a child of the
            # enqueue's span; the attempt runs inside it.
            with _span_of(claim) as span:
                outcome = await run_attempt(
                    claim,
                    definition,
                    run,
                    registry=registry,
                    driver=driver,
                    worker_id=worker_id,
                    threads=threads,
                    in_span=True,
                )
                span.ended(outcome.kind, run.reason, outcome.error)
            return outcome
    # The body runs in this frame, the attempt's run and its judgement one function: a second
    # coroutine for the judgement was a share of a no-op job's cost (issue 44). The lease
    # lifeline finds the claim of a body that blocks the loop here (judged_code).
    ctx = JobContext(claim, run, worker_id, driver, definition)
    # When the body's time starts: None while it has not (a payload that does not decode).
    started: float | None = None
    # How the body ended: it returned (``result``), raised (``error``), suspended, or none of
    # those — it unwound with the run scope's own ``Cancelled``, or never started.
    returned, result = False, None
    error: BaseException | None = None
    suspension: Suspension | None = None
    try:
        payload = load_json(claim.payload)
        restore = definition.restore_context
        if restore is None and definition.is_async and run.reason is None:
            # The common attempt (an async body, no restore hook, not cancelled before it
            # starts): its reason read once, no context entered around it, its clock started
            # at the entry as below. Its own path: the general one below was a tenth of a
            # no-op job's verdict (issue 44).
            run.start_clock_at_entry()
            with run.cancel_scope:
                started = run.clock_started_at()
                result = await definition.fn(ctx, payload)
                returned = True
        else:
            started = trio.current_time()
            # The application's context variables are set around the body (and copied into a
            # sync body's thread by Trio); a restore hook that raises fails this attempt like
            # the body.
            with _restored_around(restore, ctx):
                # A run cancelled before its body started (a claim that committed after the
                # drain was signalled) is handed back without running a line of it. Read before
                # the clock starts: a timeout shorter than the clock's grain has passed by the
                # time the scope is entered, and the body still starts (and ends at its first
                # checkpoint), as a body whose deadline fell inside it. (Before its clock
                # starts a run is cancelled only through RunScope.cancel: its reason says it,
                # with no look at Trio's clock.)
                starts = run.reason is None
                if definition.is_async:
                    run.start_clock_at_entry()
                with run.cancel_scope:
                    if starts:
                        if definition.is_async:
                            result = await definition.fn(ctx, payload)
                            returned = True
                        else:
                            # Its own scope swallows the cancel that abandons the thread:
                            # "returned" is known only in here.
                            with run.thread_scope():
                                result = await threads.run(
                                    run, _call_in_thread, definition, ctx, payload
                                )
                                returned = True
    except Suspension as exc:
        suspension = exc
    except trio.Cancelled:
        # Caught here only when it was NOT our run scope's (which swallows its own): an outer
        # scope is going away, and that must propagate.
        raise
    except BaseException as exc:
        # Anything else a body raises — SystemExit, GeneratorExit, a BaseException of its own —
        # is that job's failure, never the worker's: only its own cancellation may stop it.
        if isinstance(exc, BaseExceptionGroup) and exc.subgroup(trio.Cancelled) is not None:
            raise
        if isinstance(exc, GeneratorExit) and not _in_trio_run():
            raise  # this coroutine itself is being closed (garbage-collected), not the body
        end_if_forked(run.owner, job_id=claim.job_id, code=_exit_code(exc))
        suspension = _suspended_in(exc)
        if suspension is None:
            error = exc
    # A child the body forked that returned (or raised) here is not this attempt's worker.
    end_if_forked(run.owner, job_id=claim.job_id)
    ended = run.ended_at = trio.current_time()
    # Never below 0: a start read back from the deadline (clock_started_at) may sit a float's
    # step past the entry, and a body that took no time on a mock clock read -1e-15 s. (Not
    # max(): its arguments' tuple iterator was one more object a job, issue 44.)
    seconds = 0.0 if started is None or ended <= started else ended - started
    if returned and not run.abandoned:
        # Completed, whatever was asked of the scope meanwhile (a shielded or threaded body
        # that finished its work has nothing to redo); a lost lease still fences the write.
        try:
            # None, what most bodies return: its text without a look at the body's limits.
            text = "null" if result is None else _result_json(result, definition)
        except JobsError as exc:  # too large, too deep, not JSON: this job's failure alone
            error = exc
        else:
            note = AttemptNote(claim.attempt, worker_id, seconds)
            done = Complete(claim.lease, text, note)
            return Outcome(claim.job_id, claim.name, OutcomeKind.COMPLETED, done, None, seconds)
    try:
        return _verdict(claim, definition, run, returned, error, suspension, seconds, worker_id)
    finally:
        # The error's traceback holds this frame, and this frame held the error: a cycle that
        # kept every failed attempt's frames (its body's locals, its payload) until a garbage
        # collection, which a worker process runs less often (docs/cli.md). Let go here, the
        # failed attempt is freed once its outcome is.
        error = suspension = None


# The two closures an attempt may need, made here: a closure inside run_attempt made each
# variable it reads a cell of every attempt's frame, objects more a job for the garbage
# collector to count (issue 44), though the common attempt makes neither.


def _span_of(claim: Claim) -> AbstractContextManager[AttemptSpan]:
    """The attempt's span; its parent read from the claim's context only if a span is made."""
    return attempt_span(claim, lambda: trace_of(claim.context))


def _restored_around(
    restore: RestoreContext | None, ctx: JobContext
) -> AbstractContextManager[Any]:
    """The application's restore hook (if any), called with the run's context."""
    return restored(restore, lambda: ctx.context)


def judged_code() -> CodeType:
    """The code of the frame every job body runs under (``run_attempt``): how the lease
    lifeline finds, in a blocked Trio thread's stack, which claim's body holds the loop."""
    return run_attempt.__code__


def _note(
    claim: Claim, worker_id: str, seconds: float | None, traceback: str | None = None
) -> AttemptNote:
    """What the job's history keeps of this attempt, carried by its settlement; ``seconds``
    None: its body never started."""
    return AttemptNote(claim.attempt, worker_id, seconds, traceback)


def _suspended_in(exc: BaseException) -> Suspension | None:
    """The suspension a body raised from inside a nursery of its own: Trio hands it up wrapped
    in an exception group, and read as an error it cost the job an attempt at every sleep (a
    helper task beside the steps is a common shape). Only a group of nothing but suspensions:
    one that also carries an error is that error's failure."""
    if not isinstance(exc, BaseExceptionGroup):
        return None
    suspended, rest = exc.split(Suspension)
    if suspended is None or rest is not None:
        return None
    first = _leaves(suspended)[0]
    assert isinstance(first, Suspension)
    return first


def _parked(claim: Claim, known: list[str], note: AttemptNote) -> Outcome:
    reason = (
        f"no job named {claim.name!r} in this deploy's registry (known: {', '.join(known)}); "
        "parked, not failed: retry it once a deploy that declares it is running"
    )
    park = Park(claim.lease, reason=reason, note=note)
    return Outcome(claim.job_id, claim.name, OutcomeKind.PARKED, park, reason)


def _in_trio_run() -> bool:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


def _call_in_thread(definition: JobDefinition, ctx: JobContext, payload: Any) -> Any:
    owner = own_pid()
    started = time.monotonic()
    try:
        result = definition.fn(ctx, payload)
    except SystemExit as exc:
        end_if_forked(owner, job_id=ctx.job_id, code=_exit_code(exc))
        raise
    finally:
        # Forked in this thread, the child has no Trio loop to hand its ending to: it ends here.
        end_if_forked(owner, job_id=ctx.job_id)
    try:
        trio.from_thread.check_cancelled()
    except trio.Cancelled:
        # The run was abandoned at its cancel and this body finished anyway: its result goes
        # nowhere (the run was already settled, fenced), and this line is how to find it.
        log_event("jobs.timeout.abandoned", logging.WARNING, job_id=ctx.job_id, job=ctx.name)
        raise
    # Noted on the run from this thread: the result reaches the run's task only through the
    # Trio loop, and while a body blocks that loop the lease lifeline is the one that writes
    # it (a finished body handed back as interrupted ran again).
    ctx._run.returned_in_thread = (result, time.monotonic() - started)
    return result


def _exit_code(exc: BaseException) -> int | None:
    """The status a forked child that raised ``exc`` asked to exit with (``sys.exit(0)`` in the
    child is the common way to end one), else None."""
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    return None


def _verdict(
    claim: Claim,
    definition: JobDefinition,
    run: RunScope,
    returned: bool,
    error: BaseException | None,
    suspension: Suspension | None,
    seconds: float,
    worker_id: str,
) -> Outcome:
    """The verdict on a body that did not complete (``run_attempt`` decides a completion): it
    raised ``error``, suspended, or unwound; or it ``returned`` a result that could not be
    stored (``error``), or at the teardown's budget."""
    lease = claim.lease
    # Each settlement carries the attempt's note, for the job's history: made with it, not
    # added after (two attrs.evolve calls were a tenth of a no-op job's verdict, issue 35).
    note = _note(claim, worker_id, seconds)

    def ended_as(
        kind: OutcomeKind,
        settlement: Settlement | None,
        why: str | None,
        traceback: str | None = None,
        exc_info: ExcInfo | None = None,
    ) -> Outcome:
        return Outcome(
            claim.job_id, claim.name, kind, settlement, why, seconds, traceback, exc_info
        )

    if run.abandoned:
        # The teardown's budget ran out on it: nothing is written, its lease lapses and it runs
        # again elsewhere (at-least-once). Never handed back while it may still be running.
        why = "abandoned at the teardown's budget"
        return ended_as(OutcomeKind.ABANDONED, None, why)
    if not returned:
        reason = run.reason
        abandoned_thread = not definition.is_async and error is None and suspension is None
        if reason is CancelReason.LEASE_EXPIRED and abandoned_thread:
            # A sync body's thread, abandoned at the expiry, may still be running: handed back,
            # its job could start elsewhere beside it. Left to lapse, as a lost lease is.
            return ended_as(OutcomeKind.LOST, None, "lease expired; its thread runs on")
        # A lost fleet slot is the drain's row of the table: not the job's fault, handed back
        # uncounted and ready at once (it waits there for a slot like any other). So is a lease
        # that ran out because no renewal reached the database (issue 32: an outage charged an
        # attempt to every job whose lease lapsed in it): the worker that ran it hands it back,
        # fenced by its token, so a job that kills its worker (nothing hands it back) still
        # runs out of attempts.
        if reason in _HANDED_BACK:
            return _handed_back(claim, run, error, seconds, note)
        if reason is CancelReason.LEASE_LOST:
            return ended_as(OutcomeKind.LOST, None, "lease lost")
        if reason is CancelReason.OPERATOR:
            why = OPERATOR_CANCEL_ERROR
            return ended_as(OutcomeKind.CANCELLED, CancelJob(lease, why, note), why)
        if reason is CancelReason.TIMEOUT:
            error = run.cause
        elif suspension is not None:
            settle = Suspend(
                lease,
                suspension.delay,
                suspension.event,
                seen=suspension.seen,
                match=suspension.match,
                note=note,
            )
            return ended_as(OutcomeKind.SUSPENDED, settle, None)
    if error is None:  # unwound with no reason and no error: cannot happen, judged as a failure
        error = JobsError(f"job {claim.name!r} ended without returning", code="X_JOBS")
    why = _safe_text(error)
    tail = None
    exc_info: ExcInfo = (type(error), error, _from_the_body(error.__traceback__))
    if error.__traceback__ is not None:
        tail = _traceback_tail(exc_info)
        # With the exception itself (exc_info), for error trackers; its traceback from the
        # body's own frame, where the application's code is (issue 46).
        log_exception(
            "jobs.attempt.failed",
            logging.WARNING,
            exc_info,
            job_id=claim.job_id,
            job=claim.name,
            queue=claim.queue,
            attempt=claim.attempt,
            error=why,
            traceback=tail,
        )
    note = _note(claim, worker_id, seconds, tail)
    if _is_terminal(definition, error) or claim.attempt >= claim.max_attempts:
        dead = DeadLetter(lease, why, note)
        return ended_as(OutcomeKind.DEAD_LETTERED, dead, why, tail, exc_info)
    delay = definition.backoff.delay(claim.attempt)
    return ended_as(OutcomeKind.RETRIED, Retry(lease, delay, why, note=note), why, tail)


# Handed back unstarted or unwound, uncounted: the drain's row of the table, and the reasons
# that are not the job's fault either (the write is fenced: a job another worker holds now is
# left to it).
_HANDED_BACK = (
    CancelReason.DRAINING,
    CancelReason.SLOT_LOST,
    CancelReason.HELD_TOO_LONG,
    CancelReason.CLAIM_LATE,
    CancelReason.LEASE_EXPIRED,
    CancelReason.QUEUE_PAUSED,
)


def _handed_back(
    claim: Claim, run: RunScope, error: BaseException | None, seconds: float, note: AttemptNote
) -> Outcome:
    """Interrupted: ready at once, its attempt uncounted, its cause recorded."""
    why = _safe_text(run.cause)
    if error is not None and not isinstance(error, AttemptCancelled):
        why += f" (body stopped with {_safe_text(error)})"
    retry = Retry(claim.lease, delay=0.0, error=why, hands_back=True, note=note)
    return Outcome(claim.job_id, claim.name, OutcomeKind.INTERRUPTED, retry, why, seconds)


def _safe_text(error: BaseException | None) -> str:
    return describe(error) if error is not None else "no reason recorded"


def _traceback_tail(exc_info: ExcInfo) -> str:
    """The traceback from the body's frame on, and the error line, as every driver stores it
    (the job's history keeps it) and the failure's log line shows it: its END kept when it is
    long, for that is where the error is. Its lines as Python indents them (a strip() took the
    first frame's two spaces, and only its: issue 46)."""
    try:
        tail = "".join(traceback.format_exception(*exc_info)).rstrip()
    except BaseException as exc:
        return f"<traceback could not be rendered: {type(exc).__name__}>"
    if len(tail) > MAX_ERROR_CHARS:
        tail = "… " + tail[2 - MAX_ERROR_CHARS :]
    return storable_text(tail)


# Where the frames of the worker's own machinery are, before a body's: this package's
# (run_attempt, a sync body's _call_in_thread), and Trio's and outcome's (a thread's result handed
# back to the Trio thread).
_MACHINERY = tuple(
    os.path.dirname(path) + os.sep for path in (trio.__file__, outcome.__file__, __file__) if path
)


def _from_the_body(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` from its first frame that is not the worker's: where the application's code is.
    A traceback of the worker's frames alone (an error the worker raised) is kept whole."""
    first = tb
    while first is not None and first.tb_frame.f_code.co_filename.startswith(_MACHINERY):
        first = first.tb_next
    return tb if first is None else first


def _is_terminal(definition: JobDefinition, error: BaseException) -> bool:
    """Whether ``error`` ends the job at once. A group from the body's own nursery is terminal
    when every error in it is: a StepError raised beside a helper task is still a mistake no
    retry fixes."""
    try:
        if isinstance(error, BaseExceptionGroup):
            return all(definition.is_terminal(leaf) for leaf in _leaves(error))
        return definition.is_terminal(error)
    except BaseException:
        return False  # a hostile `code` attribute: judged by the attempt count alone


# How many of a group's errors its stored text names (the text is cut to MAX_ERROR_CHARS anyway).
_LEAVES = 3


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The errors inside ``group`` and its nested groups, in order."""
    found: list[BaseException] = []
    for inner in group.exceptions:
        found += _leaves(inner) if isinstance(inner, BaseExceptionGroup) else [inner]
    return found


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
