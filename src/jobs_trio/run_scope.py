# The run scope of one claimed job: the cancel scope its body runs under, and the first reason
# it was cancelled for. Apart because the outcome of an attempt is decided HERE, from the scope.
from __future__ import annotations

import math

import trio

from .records import Claim

TIMEOUT = "timeout"  # the run's own deadline
LEASE_LOST = "lease-lost"  # a renewal found the lease gone: another worker may hold the job
DRAINING = "draining"  # the process is going away
CANCELLED = "cancelled"  # an operator cancelled the job


class RunScope:
    """One attempt's cancel scope. Every cancel goes through ``cancel`` so the first reason is
    kept; a deadline that fired first reads as ``timeout`` whatever came after it."""

    def __init__(self, claim: Claim, timeout: float | None) -> None:
        self.claim = claim
        deadline = trio.current_time() + timeout if timeout is not None else math.inf
        self.cancel_scope = trio.CancelScope(deadline=deadline)
        self._reason: str | None = None
        # The worker's own view of the lease, on the Trio clock: renewals move it; when it
        # passes with the database unreachable, the run is cancelled as lost rather than
        # racing the worker that may claim it next.
        self.lease_deadline = math.inf
        # The body has ended and its settlement waits to be written: still renewed (a slow
        # database must not turn a finished job into a lapsed one), no longer stopped.
        self.settling = False

    @property
    def job_id(self) -> str:
        return self.claim.job_id

    def cancel(self, reason: str) -> None:
        # Reading cancel_called first lets a deadline that has already passed register as
        # the first reason (Trio checks the deadline there), so a late drain cannot mask it.
        if self.cancel_scope.cancel_called:
            return
        self._reason = reason
        self.cancel_scope.cancel(reason=reason)

    @property
    def reason(self) -> str | None:
        """The first reason this run was cancelled for, or None while it was not."""
        if not self.cancel_scope.cancel_called:
            return None
        return self._reason or TIMEOUT
