# jobs_trio.testing: what an application's tests and a third-party driver's tests need.
# Apart from the package because it is for tests only; importing it needs no pytest (the
# conformance suite, jobs_trio.testing.conformance, does: pip install 'jobs-trio[testing]').
from __future__ import annotations

from .._run.attempt import Outcome
from ._clock import ManualClock
from ._enqueued import ANY, assert_enqueued, enqueued, refute_enqueued
from ._rounds import drain, memory_driver, new_worker, run_until_idle

__all__ = [
    "ANY",
    "ManualClock",
    "Outcome",
    "assert_enqueued",
    "drain",
    "enqueued",
    "memory_driver",
    "new_worker",
    "refute_enqueued",
    "run_until_idle",
]
