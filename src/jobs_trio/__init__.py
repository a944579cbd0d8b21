# jobs_trio: durable background jobs for Trio applications.
# The public surface, loaded on first use: `import jobs_trio` costs nothing until a name is read,
# so the console script can hold SIGTERM before the second its imports take (_run/early_signals).
"""Everything an application uses is here. Every module whose name starts with ``_`` is private
and may change without notice; the other public modules are ``jobs_trio.driver`` (for a driver
of your own), ``jobs_trio.errors`` (every error, with its code), ``jobs_trio.testing``,
``jobs_trio.metrics``, ``jobs_trio.log_format``, ``jobs_trio.dashboard`` and the drivers
(``jobs_trio.drivers.memory``); docs/reference.md lists them."""

from __future__ import annotations

import importlib
import types
from typing import TYPE_CHECKING, Any

from ._core.version import VERSION as __version__

if TYPE_CHECKING:
    from ._core.backoff import Backoff
    from ._core.errors import (
        Aborted,
        AttemptCancelled,
        ConfigError,
        DriverError,
        DuplicateJob,
        InvalidArgument,
        InvalidTransition,
        JobDrained,
        JobNotFound,
        JobsError,
        JobTimeout,
        PayloadNotSerialisable,
        StepError,
        TerminalError,
        TooLarge,
    )
    from ._core.fleet_limits import FleetLimit, RateLimit
    from ._core.records import JobRecord, JobState, OutcomeKind
    from ._jobs.events import send_event
    from ._jobs.outbox import Outbox
    from ._jobs.pausing import PauseConfirmation, pause_queue
    from ._jobs.registry import JobDefinition, Registry
    from ._outbox.relay import Relay, RelayState, open_relay
    from ._retention.pruner import Retention
    from ._run.context import JobContext
    from ._run.lifecycle import Lifecycle, open_lifecycle
    from ._run.steps import EventTimedOut
    from ._run.worker import Worker, WorkerState, WorkerStats, open_worker
    from .drivers._open_driver import DriverOptions, open_driver
    from .drivers._transaction import Transaction, current_transaction, transaction
    from .drivers.contract import Driver

# Each public name, and the module it lives in (tests/docs/test_public_surface.py holds this
# table and the imports above to the same names).
_WHERE: dict[str, str] = {
    "Backoff": "._core.backoff",
    "Aborted": "._core.errors",
    "AttemptCancelled": "._core.errors",
    "ConfigError": "._core.errors",
    "DriverError": "._core.errors",
    "DuplicateJob": "._core.errors",
    "InvalidArgument": "._core.errors",
    "InvalidTransition": "._core.errors",
    "JobDrained": "._core.errors",
    "JobNotFound": "._core.errors",
    "JobsError": "._core.errors",
    "JobTimeout": "._core.errors",
    "PayloadNotSerialisable": "._core.errors",
    "StepError": "._core.errors",
    "TerminalError": "._core.errors",
    "TooLarge": "._core.errors",
    "FleetLimit": "._core.fleet_limits",
    "RateLimit": "._core.fleet_limits",
    "JobRecord": "._core.records",
    "JobState": "._core.records",
    "OutcomeKind": "._core.records",
    "JobContext": "._run.context",
    "send_event": "._jobs.events",
    "JobDefinition": "._jobs.registry",
    "Registry": "._jobs.registry",
    "EventTimedOut": "._run.steps",
    "Outbox": "._jobs.outbox",
    "PauseConfirmation": "._jobs.pausing",
    "pause_queue": "._jobs.pausing",
    "Relay": "._outbox.relay",
    "RelayState": "._outbox.relay",
    "open_relay": "._outbox.relay",
    "Transaction": ".drivers._transaction",
    "current_transaction": ".drivers._transaction",
    "transaction": ".drivers._transaction",
    "Retention": "._retention.pruner",
    "Lifecycle": "._run.lifecycle",
    "open_lifecycle": "._run.lifecycle",
    "Worker": "._run.worker",
    "WorkerState": "._run.worker",
    "WorkerStats": "._run.worker",
    "open_worker": "._run.worker",
    "Driver": ".drivers.contract",
    "DriverOptions": ".drivers._open_driver",
    "open_driver": ".drivers._open_driver",
}

__all__ = [
    "Aborted",
    "AttemptCancelled",
    "Backoff",
    "ConfigError",
    "Driver",
    "DriverError",
    "DriverOptions",
    "DuplicateJob",
    "EventTimedOut",
    "FleetLimit",
    "InvalidArgument",
    "InvalidTransition",
    "JobContext",
    "JobDefinition",
    "JobDrained",
    "JobNotFound",
    "JobRecord",
    "JobState",
    "JobTimeout",
    "JobsError",
    "Lifecycle",
    "Outbox",
    "OutcomeKind",
    "PauseConfirmation",
    "PayloadNotSerialisable",
    "RateLimit",
    "Registry",
    "Relay",
    "RelayState",
    "Retention",
    "StepError",
    "TerminalError",
    "TooLarge",
    "Transaction",
    "Worker",
    "WorkerState",
    "WorkerStats",
    "__version__",
    "current_transaction",
    "open_driver",
    "open_lifecycle",
    "open_relay",
    "open_worker",
    "pause_queue",
    "send_event",
    "transaction",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'jobs_trio' has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value  # read once: from here a plain module attribute
    return value


def __dir__() -> list[str]:
    """The public surface only: ``__all__`` and the public modules already imported (the
    module's own helpers, ``importlib``, ``Any``, ``TYPE_CHECKING``, are not the package's)."""
    loaded = [
        name
        for name, value in globals().items()
        if isinstance(value, types.ModuleType)
        and not name.startswith("_")
        and value.__name__ == f"{__name__}.{name}"
    ]
    return sorted({*__all__, *loaded})
