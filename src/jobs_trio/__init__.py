# jobs_trio: durable background jobs for Trio applications.
# The public surface; everything else is reachable from its own module.
from __future__ import annotations

# The release (pyproject.toml reads it from here; CHANGELOG.md says what each one changed).
__version__ = "0.2.0"

from .attempt import OutcomeKind
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
from .open_driver import open_driver
from .outbox import Outbox
from .pruner import Retention
from .records import JobRecord, JobState
from .registry import JobDefinition, Registry
from .relay import Relay, open_relay
from .steps import EventTimedOut
from .worker import Worker, WorkerState, WorkerStats, open_worker

__all__ = [
    "Aborted",
    "AttemptCancelled",
    "Backoff",
    "ConfigError",
    "Driver",
    "DriverError",
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
