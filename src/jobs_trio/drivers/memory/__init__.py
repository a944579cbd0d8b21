# The memory driver: the whole contract on dicts, for tests and examples (nothing survives exit).
# Apart because it is the reference the SQLite and PostgreSQL drivers are checked against.
from __future__ import annotations

from ..contract import Capabilities
from ._admin import MemoryAdmin
from ._cron import MemoryCron
from ._fleet import MemoryFleet
from ._jobs import MemoryJobs
from ._outbox_relay import MemoryOutboxAndRelay
from ._steps_events import MemoryStepsAndEvents


class MemoryDriver(
    MemoryJobs, MemoryStepsAndEvents, MemoryCron, MemoryOutboxAndRelay, MemoryFleet, MemoryAdmin
):
    """Jobs in a dict. ``clock`` defaults to the wall clock; tests on Trio's ``MockClock`` pass
    ``trio.current_time`` so leases and delays move with the mock time."""

    # Every capability of the contract (Capabilities): the conformance suite tests each.
    capabilities = Capabilities.every()
