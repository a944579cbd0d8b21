# What an application's test asks of the jobs its code enqueued: the jobs matching a name, a
# payload (or a test of it), a queue, a key and a state, and assertions that fail with what WAS
# enqueued. Apart from _rounds.py (which runs jobs) because these only read; they work on any
# driver, as Oban.Testing's assert_enqueued reads the database.
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Final

from .._core.records import JobRecord, JobState
from ..drivers.contract import Driver


class _Any:
    def __repr__(self) -> str:
        return "ANY"


# `payload=ANY` (the default): any payload matches.
ANY: Final = _Any()

# Enough to see every job of a test's store.
_LISTED = 100_000

PayloadTest = Callable[[Any], bool]


def _matches(job: JobRecord, payload: object) -> bool:
    if payload is ANY:
        return True
    value = json.loads(job.payload)
    if callable(payload):
        return bool(payload(value))
    return bool(value == payload)


async def enqueued(
    driver: Driver,
    *,
    name: str | None = None,
    payload: object = ANY,
    queue: str | None = None,
    key: str | None = None,
    state: JobState | None = JobState.READY,
) -> list[JobRecord]:
    """The jobs of ``driver`` that match, oldest first: ``name`` and ``queue`` exactly,
    ``payload`` equal to the job's (as decoded from its JSON) or, given a function, those whose
    payload it answers True for; ``key`` its unique key; ``state`` (default READY: waiting to
    run, now or later; None: any state)."""
    jobs = await driver.list_jobs(state=state, queue=queue, name=name, limit=_LISTED)
    return [
        job for job in reversed(jobs) if (key is None or job.key == key) and _matches(job, payload)
    ]


def _shown(jobs: Sequence[JobRecord]) -> str:
    if not jobs:
        return "  (none)"
    return "\n".join(
        f"  {job.name} [{job.state.value}, queue {job.queue}] payload={job.payload}"
        + (f" key={job.key}" if job.key else "")
        for job in jobs
    )


def _asked(**criteria: object) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in criteria.items() if v is not None and v is not ANY)


async def assert_enqueued(
    driver: Driver,
    *,
    name: str | None = None,
    payload: object = ANY,
    queue: str | None = None,
    key: str | None = None,
    state: JobState | None = JobState.READY,
    count: int | None = None,
) -> list[JobRecord]:
    """``enqueued(...)`` that fails (AssertionError, listing the jobs that are there) when no
    job matches, or when ``count`` is given and another number do; answers the matches."""
    found = await enqueued(driver, name=name, payload=payload, queue=queue, key=key, state=state)
    if (not found and count is None) or (count is not None and len(found) != count):
        everything = await driver.list_jobs(state=state, limit=_LISTED)
        wanted = "a job" if count is None else f"{count} job(s)"
        raise AssertionError(
            f"expected {wanted} with {_asked(name=name, payload=payload, queue=queue, key=key)}"
            f" in state {state or 'any'}, found {len(found)}; enqueued:\n"
            + _shown(list(reversed(everything)))
        )
    return found


async def refute_enqueued(
    driver: Driver,
    *,
    name: str | None = None,
    payload: object = ANY,
    queue: str | None = None,
    key: str | None = None,
    state: JobState | None = JobState.READY,
) -> None:
    """Fail (AssertionError, listing them) when a job matches."""
    found = await enqueued(driver, name=name, payload=payload, queue=queue, key=key, state=state)
    if found:
        raise AssertionError(
            f"expected no job with {_asked(name=name, payload=payload, queue=queue, key=key)},"
            f" found {len(found)}:\n" + _shown(found)
        )
