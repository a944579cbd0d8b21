# jobs_trio: durable background jobs for Trio applications.
# The public surface, loaded on first use: `import jobs_trio` costs nothing until a name is read,
# so the console script can hold SIGTERM before the second its imports take (early_signals.py).
from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

# The release (pyproject.toml reads it from here; CHANGELOG.md says what each one changed).
__version__ = "0.2.0"

if TYPE_CHECKING:
    from .backoff import Backoff
    from .context import JobContext
    from .current_transaction import Transaction, current_transaction, transaction
    from .driver import Driver
    from .errors import (
        Aborted,
        AttemptCancelled,
        ConfigError,
        DriverError,
        DuplicateJob,
        DuplicateJobName,
        HandedBack,
        InvalidArgument,
        InvalidTransition,
        JobDrained,
        JobNotFound,
        JobsError,
        JobTimeout,
        PayloadNotSerialisable,
        ResultNotStorable,
        RowLocked,
        SchemaVersionError,
        SlotLost,
        StepError,
        TerminalError,
        TooLarge,
        UnknownJob,
        ValueRefused,
    )
    from .events import send_event
    from .fleet_limits import FleetLimit, RateLimit
    from .lifecycle import Lifecycle, open_lifecycle
    from .open_driver import DriverOptions, open_driver
    from .outbox import Outbox
    from .pruner import Retention
    from .records import JobRecord, JobState, OutcomeKind
    from .registry import JobDefinition, Registry
    from .relay import Relay, RelayState, open_relay
    from .steps import EventTimedOut
    from .worker import Worker, WorkerState, WorkerStats, open_worker

# Each public name, and the module it lives in.
_WHERE: dict[str, str] = {
    "Backoff": ".backoff",
    "JobContext": ".context",
    "Transaction": ".current_transaction",
    "current_transaction": ".current_transaction",
    "transaction": ".current_transaction",
    "Driver": ".driver",
    "Aborted": ".errors",
    "AttemptCancelled": ".errors",
    "ConfigError": ".errors",
    "DriverError": ".errors",
    "DuplicateJob": ".errors",
    "DuplicateJobName": ".errors",
    "HandedBack": ".errors",
    "InvalidArgument": ".errors",
    "InvalidTransition": ".errors",
    "JobDrained": ".errors",
    "JobNotFound": ".errors",
    "JobsError": ".errors",
    "JobTimeout": ".errors",
    "PayloadNotSerialisable": ".errors",
    "ResultNotStorable": ".errors",
    "RowLocked": ".errors",
    "SchemaVersionError": ".errors",
    "SlotLost": ".errors",
    "StepError": ".errors",
    "TerminalError": ".errors",
    "TooLarge": ".errors",
    "UnknownJob": ".errors",
    "ValueRefused": ".errors",
    "send_event": ".events",
    "FleetLimit": ".fleet_limits",
    "RateLimit": ".fleet_limits",
    "Lifecycle": ".lifecycle",
    "open_lifecycle": ".lifecycle",
    "DriverOptions": ".open_driver",
    "open_driver": ".open_driver",
    "Outbox": ".outbox",
    "Retention": ".pruner",
    "JobRecord": ".records",
    "JobState": ".records",
    "OutcomeKind": ".records",
    "JobDefinition": ".registry",
    "Registry": ".registry",
    "Relay": ".relay",
    "RelayState": ".relay",
    "open_relay": ".relay",
    "EventTimedOut": ".steps",
    "Worker": ".worker",
    "WorkerState": ".worker",
    "WorkerStats": ".worker",
    "open_worker": ".worker",
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
    "DuplicateJobName",
    "EventTimedOut",
    "FleetLimit",
    "HandedBack",
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
    "PayloadNotSerialisable",
    "RateLimit",
    "Registry",
    "Relay",
    "RelayState",
    "ResultNotStorable",
    "Retention",
    "RowLocked",
    "SchemaVersionError",
    "SlotLost",
    "StepError",
    "TerminalError",
    "TooLarge",
    "Transaction",
    "UnknownJob",
    "ValueRefused",
    "Worker",
    "WorkerState",
    "WorkerStats",
    "__version__",
    "current_transaction",
    "open_driver",
    "open_lifecycle",
    "open_relay",
    "open_worker",
    "send_event",
    "transaction",
]


class _Surface(types.ModuleType):
    """The package module. Importing a submodule binds it on the package under its own name,
    and two public names are their modules' names (``open_driver``, ``current_transaction``):
    bound here, such a name stays the function it was, never the module."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _WHERE.get(name) == f".{name}":
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Surface


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'jobs_trio' has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value  # read once: from here a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
