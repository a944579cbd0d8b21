# The PostgreSQL driver's claim arguments and its enqueue by COPY: what a claim or a large
# enqueue sends. Apart from _jobs.py, which decides when to send them.
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..._core.operator_transitions import OPERATOR_CANCEL_ERROR
from ..._core.records import NewJob
from .._claim_slots import ClaimSlots
from .._postgres_pool import Connection
from .._postgres_sql import Statements
from .._rows import limit_fields
from .._rules import KILLED_WORKER_ERROR, LAPSED_ERROR, ORPHANED_ERROR, ORPHANED_TOO_OFTEN_ERROR


def _claim_arguments(
    now: float,
    slots: ClaimSlots,
    lease: float,
    worker_id: str,
    free: Mapping[str, int] | None,
    rescue: bool,
    alone: bool = False,
) -> tuple[Any, ...]:
    """The claim statement's parameters, $1 to $14 (settle_claim_<kind> takes them first too).
    With no ``free`` given, every claim has a slot: none is marked ahead."""
    caps = list(slots.caps.values())
    return (
        now,
        list(slots.caps),
        slots.total,
        float(lease),
        worker_id,
        LAPSED_ERROR,
        KILLED_WORKER_ERROR,
        caps,
        caps if free is None else [free.get(q, 0) for q in slots.caps],
        now if rescue else -math.inf,
        ORPHANED_TOO_OFTEN_ERROR,
        ORPHANED_ERROR,
        alone,
        OPERATOR_CANCEL_ERROR,
    )


def _handed_back(rows: Sequence[Any]) -> bool:
    """Whether a claim statement handed a lapsed job back (claim_answer): it then claimed
    nothing, its snapshot being older than the hand-back (_jobs.sql, claim)."""
    return any(row["released"] is not None for row in rows)


# From this many unkeyed jobs an enqueue writes them by COPY: 20,000 jobs went in at 71,000 a
# second by COPY against 50,000 by INSERT ... unnest, and the client's encoding from 5 us a job
# to 1 (/tmp-style A/B on this machine, plain asyncpg). Below it, the statement is cheaper.
COPY_AT_LEAST = 64


_COPY_COLUMNS = (
    "id", "name", "queue", "state", "payload", "priority", "attempts", "max_attempts",
    "run_at", "created_at", "updated_at", "slot_key", "slots", "rate_key", "starts", "per",
    "context",
)  # fmt: skip


def _copy_row(job: NewJob, now: float) -> tuple[Any, ...]:
    """One COPY row, in _COPY_COLUMNS' order."""
    limits = limit_fields(job.limits)
    return (
        job.job_id,
        job.name,
        job.queue,
        "ready",
        job.payload,
        job.priority,
        0,
        job.max_attempts,
        now + max(float(job.delay), 0.0),
        now,
        now,
        limits["slot_key"],
        limits["slots"],
        limits["rate_key"],
        limits["starts"],
        limits["per"],
        job.context,
    )


async def _copy_in(conn: Connection, sql: Statements, now: float, batch: Sequence[NewJob]) -> None:
    """Write ``batch`` (no job of it keyed) by COPY, then notify its queues: as ``enqueue``
    does, row for row (run_at now + the delay, its fleet limits' columns)."""
    records = [_copy_row(job, now) for job in batch]
    await conn.copy_records_to_table(
        "jobs", schema_name=sql.schema, columns=_COPY_COLUMNS, records=records
    )
    await conn.execute(sql["notify"], sql.channel, sorted({job.queue for job in batch}))
