# How the drivers' rows map to the records they answer, and back: a job's, a step's, an event's
# row, a stored result's value, a job's limits as fields. Apart from _rules.py: a mapping every
# driver reads by, not a rule of what a write does.
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any, Final

import attrs

from .._core.records import (
    EventRecord,
    JobLimits,
    JobRecord,
    JobState,
    StepRecord,
    StepStatus,
)

# Rows to records: a driver's column names are the record's field names, in this order.
# The token is deliberately absent: a record is what operators read, and a fencing token must
# never leak into `show` output.
JOB_FIELDS: Final = tuple(field.name for field in attrs.fields(JobRecord))
JOB_COLUMNS: Final = ", ".join(JOB_FIELDS)


def stored_value(text: Any) -> Any:
    """A stored result (JSON text) as the value it stands for (``JobRecord.result``). What does
    not parse is answered as stored: a row written outside jobs_trio must not fail a listing.
    So is what JSON cannot carry, which jobs_trio never writes (its encoder refuses it) and a
    row written outside it may hold: NaN, Infinity, a number past a float ("1e400"). Read as
    floats, `--json` printed them as NaN / Infinity, which no strict JSON reader takes (and jq
    turns into null)."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError):
        return text


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _finite(number: str) -> float:
    value = float(number)
    if not math.isfinite(value):
        raise ValueError(f"{number} is past a float")
    return value


def job_record(row: Iterable[Any]) -> JobRecord:
    """A job's row, its values in ``JOB_FIELDS`` order, as its record."""
    fields = dict(zip(JOB_FIELDS, row, strict=True))
    fields["state"] = JobState(fields["state"])
    fields["result"] = stored_value(fields["result"])
    fields["cancel_requested"] = bool(fields["cancel_requested"])  # SQLite stores 0 / 1
    # SQLite stores a job's limits whole (a slot count of 0 beside no slot key); a record says
    # None for the half a job does not have, as PostgreSQL stores it.
    if fields["slot_key"] is None:
        fields["slots"] = None
    if fields["rate_key"] is None:
        fields["starts"] = fields["per"] = None
    return JobRecord(**fields)


# A step's row, in this order: the record's field names (PostgreSQL's column for `match` is
# match_key). The job's id is the row's too, but not the record's.
STEP_FIELDS: Final = (
    "name", "status", "started_at", "finished_at", "result", "wake_at", "event", "match",
)  # fmt: skip


def step_record(row: Iterable[Any]) -> StepRecord:
    """A step's row, its values in ``STEP_FIELDS`` order, as its record."""
    fields = dict(zip(STEP_FIELDS, row, strict=True))
    fields["status"] = StepStatus(fields["status"])
    return StepRecord(**fields)


def step_values(step: StepRecord) -> tuple[Any, ...]:
    """A step record as its row's values, in ``STEP_FIELDS`` order (the status as its value)."""
    return (
        step.name,
        StepStatus(step.status).value,
        step.started_at,
        step.finished_at,
        step.result,
        step.wake_at,
        step.event,
        step.match,
    )


def event_record(row: Sequence[Any]) -> EventRecord:
    """An event's row as its record: its first values id, name, key, payload, created_at."""
    return EventRecord(id=str(row[0]), name=row[1], key=row[2], payload=row[3], created_at=row[4])


_UNLIMITED = JobLimits()  # frozen: one for every job without limits, not one made a job


def limit_fields(limits: JobLimits | None) -> dict[str, Any]:
    """A job's limits as its record's fields: None for the half it does not have."""
    has = limits or _UNLIMITED
    slot, rate = has.slot_key is not None, has.rate_key is not None
    return {
        "slot_key": has.slot_key,
        "slots": has.slots if slot else None,
        "rate_key": has.rate_key,
        "starts": has.starts if rate else None,
        "per": has.per if rate else None,
    }
