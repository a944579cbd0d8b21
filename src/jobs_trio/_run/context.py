# What a job body is handed: who it is, which attempt this is, its durable steps, and its cancel.
# Apart because it is the one object user code sees of a running attempt.
from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

import trio

from .._core.errors import AttemptCancelled, JobsError
from .._core.logs import logger
from .._core.records import Claim
from .._core.run_context import app_context
from .run_scope import RunScope
from .steps import Steps

if TYPE_CHECKING:
    from .._jobs.registry import JobDefinition
    from ..drivers.contract import Driver


class JobContext:
    """``ctx.job_id``, ``ctx.name``, ``ctx.attempt``, ``ctx.step``, ``ctx.check_cancelled()``."""

    def __init__(
        self,
        claim: Claim,
        run: RunScope,
        worker_id: str,
        driver: Driver,
        definition: JobDefinition,
    ) -> None:
        self._claim = claim
        self._run = run
        self.worker_id = worker_id
        # What the steps are made of, kept rather than a closure that makes them: a closure
        # made its four variables cells of the attempt's frame, six objects more a job for the
        # garbage collector to count (issue 44).
        self._driver = driver
        self._definition = definition

    # Made when a body first asks: most bodies use neither, and both were made per attempt.
    @functools.cached_property
    def step(self) -> Steps:
        """The durable steps of this attempt (docs/steps.md)."""
        return Steps(self._driver, self._claim.lease, self._definition, self._run)

    @functools.cached_property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger whose records carry ``job_id`` and ``job``."""
        return logging.LoggerAdapter(
            logger, {"job_id": self._claim.job_id, "job": self._claim.name}
        )

    @functools.cached_property
    def context(self) -> Mapping[str, str]:
        """The run's context as enqueued (``enqueue(..., context=)`` or the registry's capture
        hook), read-only; empty when it carried none. The trace context is not in it."""
        return app_context(self._claim.context)

    @property
    def job_id(self) -> str:
        return self._claim.job_id

    @property
    def name(self) -> str:
        return self._claim.name

    @property
    def queue(self) -> str:
        return self._claim.queue

    @property
    def attempt(self) -> int:
        return self._claim.attempt

    @property
    def max_attempts(self) -> int:
        return self._claim.max_attempts

    @property
    def cancel_reason(self) -> JobsError | None:
        """Why this attempt was told to stop, or None while it was not: ``JobDrained``
        (``X_DRAINING``: the worker is going away, naming it and the signal), ``JobTimeout``, or
        ``Aborted`` (a lost lease, an operator's cancel). Readable from a shielded cleanup, and
        from a sync body's thread."""
        if _on_trio_thread():
            return self._run.cause
        try:
            trio.from_thread.check_cancelled()
        except trio.Cancelled:
            return self._run.cause_in_thread(thread_abandoned=True)
        return self._run.cause_in_thread(thread_abandoned=False)

    def check_cancelled(self) -> None:
        """Raise ``AttemptCancelled`` if this attempt has been told to stop (timeout, drain, lost
        lease, operator) — the same type on the Trio thread and in a sync body's thread, a
        BaseException that an ``except Exception`` does not swallow.

        For synchronous bodies running in a thread, the one way to stop early: call it between
        units of work. Async bodies are told at their next ``await`` anyway."""
        reason = self.cancel_reason
        if reason is not None:
            raise AttemptCancelled(reason)


def _on_trio_thread() -> bool:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True
