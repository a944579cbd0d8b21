# A batch's jobs run in the order given: their ids count up from one random start (records.py,
# new_job_ids), so the claim's order (priority, run-at, id) is the batch's on every driver.
from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import jobs_trio
from jobs_trio._core.records import new_job_ids
from jobs_trio.driver import Driver
from tests.conftest import require_postgres

DRIVERS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@given(st.integers(min_value=1, max_value=3000))
def test_a_batchs_ids_sort_in_the_order_given_and_keep_their_shape(n: int) -> None:
    ids = new_job_ids(n)
    assert ids == sorted(ids)
    assert len(set(ids)) == n
    assert {len(i) for i in ids} == {27}
    assert len({i[:11] for i in ids}) == 1  # one clock read: the millisecond, in hex
    int("".join(ids), 16)  # hex digits only


@contextlib.asynccontextmanager
async def store(kind: str, tmp_path: Path) -> AsyncIterator[Driver]:
    if kind == "memory":
        async with jobs_trio.open_driver("memory://") as driver:
            yield driver
    elif kind == "sqlite":
        async with jobs_trio.open_driver(f"sqlite:///{tmp_path / 'jobs.db'}") as driver:
            yield driver
    else:
        schema = f"jt_{uuid.uuid4().hex[:12]}"
        async with jobs_trio.open_driver(
            require_postgres(), schema=schema, migrate=True, drop_schema_on_close=True
        ) as driver:
            yield driver


@pytest.mark.parametrize("kind", DRIVERS)
async def test_the_jobs_of_one_enqueue_many_are_claimed_in_the_order_given(
    kind: str, tmp_path: Path
) -> None:
    registry = jobs_trio.Registry()

    @registry.job("batch.job", queue="batch")
    async def job(ctx: object, payload: Any) -> None: ...

    async with store(kind, tmp_path) as driver:
        await job.enqueue_many(driver, [{"n": n} for n in range(60)])
        claims = await driver.claim(["batch"], 60, lease=30.0, worker_id="w1")
        assert [json.loads(c.payload)["n"] for c in claims] == list(range(60))
