# Small builders the conformance tests share, so every test reads as the behaviour it checks.
from __future__ import annotations

import json

from jobs_trio.driver import Driver
from jobs_trio.records import Claim, NewJob, new_job_id


def new_job(
    name: str = "t.job",
    *,
    queue: str = "default",
    payload: object = None,
    attempts: int = 3,
    priority: int = 0,
    delay: float = 0.0,
    key: str | None = None,
) -> NewJob:
    return NewJob(
        job_id=new_job_id(),
        name=name,
        queue=queue,
        payload=json.dumps(payload if payload is not None else {}),
        max_attempts=attempts,
        priority=priority,
        delay=delay,
        key=key,
    )


async def enqueue_one(driver: Driver, **kw: object) -> str:
    [answer] = await driver.enqueue([new_job(**kw)])  # type: ignore[arg-type]
    return answer.job_id


async def claim_one(driver: Driver, queue: str = "default", lease: float = 30.0) -> Claim:
    claims = await driver.claim([queue], 1, lease=lease, worker_id="w1")
    assert len(claims) == 1, claims
    return claims[0]
