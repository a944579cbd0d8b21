# Every error jobs_trio raises on purpose: a stable code, what happened, and what to do about it.
# Apart so that each boundary (enqueue, config, CLI, driver) raises the same kind of thing.
from __future__ import annotations

import difflib
import errno
import socket
from collections.abc import Collection
from typing import ClassVar


class JobsError(Exception):
    """Base of every deliberate jobs_trio error.

    ``code`` is stable across releases (match on it, not on the message); ``cause`` says what
    happened and where; ``fix`` says what to do. ``retryable`` tells the worker whether a job
    body that raised it should be tried again.
    """

    code: ClassVar[str] = "X_JOBS"
    retryable: ClassVar[bool] = True

    def __init__(self, cause: str, *, fix: str = "", code: str | None = None) -> None:
        self.cause = cause
        self.fix = fix
        if code is not None:
            self.code = code  # type: ignore[misc]
        super().__init__(self._message())

    def _message(self) -> str:
        text = f"[{self.code}] {self.cause}"
        return f"{text} — fix: {self.fix}" if self.fix else text


class ConfigError(JobsError):
    code = "X_CONFIG"
    retryable = False


class InvalidArgument(ConfigError):
    """An argument refused at the input boundary (_core/boundary.py), before any write."""

    code = "X_ARGUMENT"

    def __init__(self, argument: str, cause: str, *, fix: str) -> None:
        self.argument = argument
        super().__init__(f"{argument}: {cause}", fix=fix)


class TooLarge(JobsError):
    """A payload, result or step result over its size limit; nothing was written."""

    code = "X_TOO_LARGE"
    retryable = False

    def __init__(
        self, *, job: str, what: str, size: int, limit: int, fix: str | None = None
    ) -> None:
        self.job = job
        self.what = what
        self.size = size
        self.limit = limit
        super().__init__(
            f"job {job!r}: {what} of {size:,} bytes exceeds the limit of {limit:,} bytes",
            fix=fix
            or "store large data elsewhere and pass its key, or raise the limit: "
            "Registry(max_payload_bytes=, max_result_bytes=) or the same on @registry.job",
        )


class ResultNotStorable(JobsError):
    """A job body returned a value no driver can store; the attempt fails with this, nothing of
    the result is written. Not retried: the same body returns the same kind of value."""

    code = "X_RESULT"
    retryable = False


class UnknownJob(JobsError):
    code = "X_UNKNOWN_JOB"
    retryable = False


def unknown_job(name: str, known: Collection[str], *, where: str, fix: str) -> UnknownJob:
    """The refusal of a job name ``where`` does not declare (``known`` it does), naming the
    close matches (a typo's), then every name when there are a few, a count when many."""
    matches = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(map(repr, matches))}? " if matches else ""
    if not known:
        listed = "it declares none"
    elif len(known) <= 10:
        listed = "it declares " + ", ".join(sorted(known))
    else:
        listed = f"it declares {len(known)} names"
    return UnknownJob(f"{where} declares no job named {name!r} ({hint}{listed})", fix=fix)


class DuplicateJobName(JobsError):
    code = "X_DUPLICATE_NAME"
    retryable = False


class PayloadNotSerialisable(JobsError):
    code = "X_PAYLOAD"
    retryable = False

    def __init__(self, *, job: str, field: str, cause: str, fix: str) -> None:
        self.job = job
        self.field = field
        super().__init__(f"job {job!r}: {field}: {cause}", fix=fix)


class DuplicateJob(JobsError):
    """A live job already holds this unique key (raised only when the caller asked for it)."""

    code = "X_DUPLICATE"
    retryable = False

    def __init__(self, *, job: str, key: str, existing_id: str) -> None:
        self.job = job
        self.key = key
        self.existing_id = existing_id
        super().__init__(
            f"job {job!r}: key {key!r} is already held by live job {existing_id}",
            fix="drop on_duplicate='raise' to get the existing job's id back, or use another key",
        )


class Aborted(JobsError):
    """A write of a run whose claim is no longer current, or a body told to stop."""

    code = "X_ABORTED"
    retryable = True


class SlotLost(Aborted):
    """Why a run was cut short when its fleet slot was no longer its own: the slot's lease
    lapsed (its renewals did not land in time) and another run of the same limit took it.
    The attempt is handed back uncounted, as a drained one is (docs/limits.md)."""

    code = "X_SLOT_LOST"


class HandedBack(Aborted):
    """Why a claim never started: taken ahead (the worker's ``claim_ahead``), no slot of its
    worker freed within the hold limit; or the claim was answered after its lease ran out.
    Handed back uncounted, ready at once."""

    code = "X_HANDED_BACK"


class RelayFenced(Aborted):
    """A relay's write of outbox rows refused by the job store: its ticket (the batch's fencing
    token) was revoked when another relay took one of its rows over after its lease lapsed (it
    was paused, or slower than its lease), or forgotten as stale. Nothing was written; the rows
    are the other relay's now (docs/transactions.md)."""

    code = "X_RELAY_FENCED"


class JobNotFound(JobsError):
    code = "X_NOT_FOUND"
    retryable = False


class InvalidTransition(JobsError):
    code = "X_STATE"
    retryable = False


class StepError(JobsError):
    code = "X_STEP"
    retryable = False


class SchemaVersionError(JobsError):
    code = "X_SCHEMA"
    retryable = False


class DriverError(JobsError):
    code = "X_DRIVER"
    retryable = True


class ValueRefused(DriverError):
    """The database answered, and refused THIS write for the values it carries (a NUL in
    text, an integer past its column's range, a value past a limit, a constraint): the same
    call fails the same way every time, so it is not retryable. Apart from a plain
    DriverError ("unreachable, try again") so one poison settlement is split out of its batch,
    never retried forever in front of every other.
    A DriverError still, so that code catching the database's failures catches it too; tell
    the two apart by ``retryable`` (or this class), not by ``except`` order."""

    code = "X_VALUE"
    retryable = False


class RowLocked(DriverError):
    """Another session holds a lock this write needs (a row's, or a whole table's), past the
    driver's lock timeout (an operator's transaction left open, a migration queued behind a
    long reader). Retryable, but only the writes touching that row: a batch that meets it is
    split so the rest land, and the one row's write is retried on its own, never in front of
    every other. The message names the sessions that held it, where they could be found."""

    code = "X_LOCKED"
    retryable = True

    def __init__(
        self,
        cause: str,
        *,
        fix: str = "",
        written: frozenset[str] = frozenset(),
        busy: frozenset[str] = frozenset(),
        holders: tuple[object, ...] = (),
    ) -> None:
        super().__init__(cause, fix=fix)
        # The sessions that held the lock (PostgreSQL: _postgres_locks.LockHolder), longest
        # open first; empty when not looked up or already gone.
        self.holders = holders
        # A settle that skipped the locked rows instead of waiting for them: the job ids it
        # did write (committed), and those of the rows it skipped, still the caller's claims.
        # Both empty: nothing was written (the lock timeout failed the whole call).
        self.written = written
        self.busy = busy


class TerminalError(JobsError):
    """Raise from a job body to dead-letter the job at once, whatever attempts are left."""

    code = "X_TERMINAL"
    retryable = False


class JobTimeout(JobsError):
    code = "JOB_TIMEOUT"
    retryable = True


class JobDrained(JobsError):
    """Why a drained attempt was cut short: the worker holding it is going away. Stored as the
    job's ``last_error`` and readable in the body as ``ctx.cancel_reason``."""

    code = "X_DRAINING"
    retryable = True

    def __init__(self, *, worker: str, signal: str) -> None:
        self.worker = worker
        self.signal = signal
        super().__init__(
            f"interrupted: worker {worker!r} is draining ({_what_stopped(signal)}); the job "
            "was handed back to the queue with its attempt uncounted",
            fix="nothing to do for this job: the next worker claims it at once. To stop within "
            "the grace period, let trio.Cancelled propagate in an async body and call "
            "ctx.check_cancelled() between units of work in a sync one",
        )


def _what_stopped(signal: str) -> str:
    # The lifecycle passes a signal's name; the other reasons a worker drains are spelled out.
    if signal.startswith("SIG"):
        return signal
    return {
        "shutdown": "a programmatic shutdown",
        "exit": "the block around open_worker was left by an exception",
    }.get(signal, signal)


class KilledWorker(JobsError):
    """Why a job was dead-lettered by the orphan rule (docs/model.md, "A worker's death"): it
    was running ALONE on its worker (a suspect: orphaned twice before) and that worker died
    again, so nothing else can have killed it. Stored as the job's ``last_error``."""

    code = "X_KILLED_WORKER"
    retryable = False


class OrphanedTooOften(JobsError):
    """Why a job was dead-lettered by the orphan rule's bound: its worker died under it
    ``rules.ORPHAN_LIMIT`` times, never once while it ran alone (a fleet of an older release
    claimed it beside others, or whole machines kept dying). Stored as ``last_error``."""

    code = "X_ORPHANED"
    retryable = False


class AttemptCancelled(BaseException):
    """What ``ctx.check_cancelled()`` raises once the attempt was told to stop — on the Trio
    thread and in a sync body's thread alike. A BaseException, like ``trio.Cancelled``, so that an
    ``except Exception`` in a body cannot swallow it and run on. ``reason`` is the typed error
    that says why: ``JobDrained`` (X_DRAINING), ``JobTimeout``, or ``Aborted`` (a lost lease, an
    operator's cancel)."""

    def __init__(self, reason: JobsError) -> None:
        self.reason = reason
        super().__init__(str(reason))

    @property
    def code(self) -> str:
        return self.reason.code


def cannot_listen(
    what: str, host: str, port: int, exc: OSError, *, flag: str, host_flag: str = "--host"
) -> ConfigError:
    """A server of ours (the dashboard, /metrics) could not bind ``host:port``: a port in use,
    an address this machine does not have, a low port without the right. The user's to fix,
    never "a bug": ``flag`` names the option that picks the port, ``host_flag`` the address."""
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        fix = (
            f"give {host_flag} an address of this machine (127.0.0.1, the default; 0.0.0.0 for"
            " every address)"
        )
    elif exc.errno == errno.EADDRINUSE:
        fix = f"pick another port ({flag} N; 0 picks a free one), or stop what listens on {port}"
    else:
        fix = (
            f"pick another port ({flag} N; 0 picks a free one; below 1024 needs privileges),"
            f" or give {host_flag} an address of this machine"
        )
    return ConfigError(f"{what} cannot listen on {host}:{port}: {exc.strerror or exc}", fix=fix)
