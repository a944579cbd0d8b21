# jobs_trio: durable background jobs for Trio applications.
# The public surface, loaded on first use: `import jobs_trio` costs nothing until a name is read,
# so the console script can hold SIGTERM before the second its imports take (_run/early_signals).
"""Everything an application uses is here. Every module whose name starts with ``_`` is private
and may change without notice; the other public modules are ``jobs_trio.driver`` (for a driver
of your own), ``jobs_trio.errors`` (every error, with its code), ``jobs_trio.testing``,
``jobs_trio.metrics``, ``jobs_trio.log_format``, ``jobs_trio.dashboard`` and the drivers
(``jobs_trio.drivers.memory``); docs/reference.md lists them."""

from __future__ import annotations

import importlib as _importlib
import types as _types
import typing as _typing

from ._core.version import VERSION as _VERSION

__version__ = _VERSION

# Each public name, by the module it lives in: the one table. The lazy imports read it and
# __all__ is made from it; tests/docs/test_public_surface.py holds the imports below to it.
_PUBLIC: dict[str, tuple[str, ...]] = {
    "._core.backoff": ("Backoff",),
    "._core.errors": (
        "Aborted",
        "AttemptCancelled",
        "ConfigError",
        "DriverError",
        "DuplicateJob",
        "InvalidArgument",
        "InvalidTransition",
        "JobDrained",
        "JobNotFound",
        "JobsError",
        "JobTimeout",
        "PayloadNotSerialisable",
        "StepError",
        "TerminalError",
        "TooLarge",
    ),
    "._core.fleet_limits": ("FleetLimit", "RateLimit"),
    "._core.records": ("JobRecord", "JobState", "OutcomeKind"),
    "._jobs.events": ("send_event",),
    "._jobs.outbox": ("Outbox",),
    "._jobs.pausing": ("PauseConfirmation", "pause_queue"),
    "._jobs.registry": ("JobDefinition", "Registry"),
    "._outbox.relay": ("Relay", "RelayState", "open_relay"),
    "._retention.pruner": ("Retention",),
    "._run.context": ("JobContext",),
    "._run.lifecycle": ("Lifecycle", "open_lifecycle"),
    "._run.steps": ("EventTimedOut",),
    "._run.worker": ("Worker", "WorkerState", "WorkerStats", "open_worker"),
    ".drivers._open_driver": ("DriverOptions", "open_driver"),
    ".drivers._transaction": ("Transaction", "current_transaction", "transaction"),
    ".drivers.contract": ("Driver",),
}
_WHERE: dict[str, str] = {name: module for module, names in _PUBLIC.items() for name in names}

if _typing.TYPE_CHECKING:
    # What mypy and pyright read instead of the table, which they cannot run: the same names,
    # each `X as X` (an explicit re-export, under mypy --strict and for pyright's py.typed
    # rules). The test prints this block from the table when the two differ.
    from ._core.backoff import Backoff as Backoff
    from ._core.errors import (
        Aborted as Aborted,
    )
    from ._core.errors import (
        AttemptCancelled as AttemptCancelled,
    )
    from ._core.errors import (
        ConfigError as ConfigError,
    )
    from ._core.errors import (
        DriverError as DriverError,
    )
    from ._core.errors import (
        DuplicateJob as DuplicateJob,
    )
    from ._core.errors import (
        InvalidArgument as InvalidArgument,
    )
    from ._core.errors import (
        InvalidTransition as InvalidTransition,
    )
    from ._core.errors import (
        JobDrained as JobDrained,
    )
    from ._core.errors import (
        JobNotFound as JobNotFound,
    )
    from ._core.errors import (
        JobsError as JobsError,
    )
    from ._core.errors import (
        JobTimeout as JobTimeout,
    )
    from ._core.errors import (
        PayloadNotSerialisable as PayloadNotSerialisable,
    )
    from ._core.errors import (
        StepError as StepError,
    )
    from ._core.errors import (
        TerminalError as TerminalError,
    )
    from ._core.errors import (
        TooLarge as TooLarge,
    )
    from ._core.fleet_limits import FleetLimit as FleetLimit
    from ._core.fleet_limits import RateLimit as RateLimit
    from ._core.records import (
        JobRecord as JobRecord,
    )
    from ._core.records import (
        JobState as JobState,
    )
    from ._core.records import (
        OutcomeKind as OutcomeKind,
    )
    from ._jobs.events import send_event as send_event
    from ._jobs.outbox import Outbox as Outbox
    from ._jobs.pausing import PauseConfirmation as PauseConfirmation
    from ._jobs.pausing import pause_queue as pause_queue
    from ._jobs.registry import JobDefinition as JobDefinition
    from ._jobs.registry import Registry as Registry
    from ._outbox.relay import Relay as Relay
    from ._outbox.relay import RelayState as RelayState
    from ._outbox.relay import open_relay as open_relay
    from ._retention.pruner import Retention as Retention
    from ._run.context import JobContext as JobContext
    from ._run.lifecycle import Lifecycle as Lifecycle
    from ._run.lifecycle import open_lifecycle as open_lifecycle
    from ._run.steps import EventTimedOut as EventTimedOut
    from ._run.worker import (
        Worker as Worker,
    )
    from ._run.worker import (
        WorkerState as WorkerState,
    )
    from ._run.worker import (
        WorkerStats as WorkerStats,
    )
    from ._run.worker import (
        open_worker as open_worker,
    )
    from .drivers._open_driver import DriverOptions as DriverOptions
    from .drivers._open_driver import open_driver as open_driver
    from .drivers._transaction import (
        Transaction as Transaction,
    )
    from .drivers._transaction import (
        current_transaction as current_transaction,
    )
    from .drivers._transaction import (
        transaction as transaction,
    )
    from .drivers.contract import Driver as Driver
else:
    # Out of the type checkers' sight: a computed __all__ would stand, for them, for no name at
    # all (mypy then exports none), and a visible __getattr__ would let them take any name
    # (`jobs_trio.Regsitry` passing the check); without either, they see exactly the imports.
    __all__ = sorted([*_WHERE, "__version__"])

    def __getattr__(name: str) -> _typing.Any:
        where = _WHERE.get(name)
        if where is None:
            raise AttributeError(f"module 'jobs_trio' has no attribute {name!r}")
        value = getattr(_importlib.import_module(where, __name__), name)
        globals()[name] = value  # read once: from here a plain module attribute
        return value

    def __dir__() -> list[str]:
        """The public surface only: ``__all__`` and the public modules already imported (the
        module's own helpers, the table, ``annotations``, are not the package's)."""
        loaded = [
            name
            for name, value in globals().items()
            if isinstance(value, _types.ModuleType)
            and not name.startswith("_")
            and value.__name__ == f"{__name__}.{name}"
        ]
        return sorted({*__all__, *loaded})
