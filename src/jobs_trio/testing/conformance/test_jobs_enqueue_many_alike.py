# A large batch is stored as the same jobs one at a time would be: a driver may write a large
# batch another way (PostgreSQL by COPY from 64 jobs on), and nothing of a row may differ.
from __future__ import annotations

import json

import attrs

from jobs_trio._core.records import JobLimits, JobRecord, NewJob, new_job_id
from jobs_trio.driver import Driver
from jobs_trio.testing._clock import ManualClock


def _varied(i: int) -> NewJob:
    limits = (
        JobLimits(slot_key=f"acct:{i % 3}", slots=2, rate_key=f"acct:{i % 3}", starts=5, per=60.0)
        if i % 4 == 0
        else None
    )
    return NewJob(
        job_id=new_job_id(),
        name=f"t.job{i % 5}",
        queue=("default", "other", "third")[i % 3],
        payload=json.dumps({"i": i, "text": "caf\u00e9 \\u0000 \u202e", "deep": [[i]]}),
        max_attempts=1 + i % 7,
        priority=(i % 9) - 4,
        delay=(0.0, 2.5, -3.0, 86_400.0)[i % 4],
        limits=limits,
        context=json.dumps({"tenant": f"t{i}"}) if i % 2 else None,
    )


def _stored(record: JobRecord) -> JobRecord:
    """A record without what is the job's own and differs by the job (its id)."""
    return attrs.evolve(record, id="")


async def test_a_large_batch_stores_each_job_as_a_single_enqueue_would(
    driver: Driver, manual_clock: ManualClock
) -> None:
    singles = [_varied(i) for i in range(100)]
    batch = [attrs.evolve(job, job_id=new_job_id()) for job in singles]
    for job in singles:
        await driver.enqueue([job])
    answers = await driver.enqueue(batch)
    assert [(a.job_id, a.created) for a in answers] == [(j.job_id, True) for j in batch]
    for one, many in zip(singles, batch, strict=True):
        alone, together = await driver.get(one.job_id), await driver.get(many.job_id)
        assert alone is not None and together is not None
        assert _stored(together) == _stored(alone), (one, many)
