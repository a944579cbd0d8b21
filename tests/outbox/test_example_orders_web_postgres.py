# The PostgreSQL example web application over real HTTP against a real server: concurrent
# requests, some rolled back on purpose (an item found sold out after the order's writes) and
# some refused before any write; afterwards orders and jobs match one to one, each job ran once.
from __future__ import annotations

import functools
import json
import random

import pytest
import trio

from tests.conftest import require_postgres

httpx = pytest.importorskip("httpx")
pytest.importorskip("hypercorn")
pytest.importorskip("starlette")

from examples.orders_web_postgres import run  # noqa: E402

import jobs_trio  # noqa: E402
from jobs_trio._core.records import JobState  # noqa: E402

REQUESTS = 60

pytestmark = pytest.mark.postgres


async def test_concurrent_orders_and_rollbacks_leave_orders_and_jobs_one_to_one(
    pg_schema: str,
) -> None:
    url = require_postgres()
    items = [f"sold-out-{n}" if n % 4 == 3 else f"item-{n}" for n in range(REQUESTS)]
    items += ["", ""]  # refused before anything is written
    random.Random(33).shuffle(items)
    answers: dict[str, httpx.Response] = {}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            driver, bound = await nursery.start(functools.partial(run, url, 0, schema=pg_schema))
            try:
                async with httpx.AsyncClient(base_url=bound, timeout=30) as client:

                    async def post(n: int, item: str) -> None:
                        answers[f"{n}:{item}"] = await client.post("/orders", json={"item": item})

                    async with trio.open_nursery() as requests:  # all at once
                        for n, item in enumerate(items):
                            requests.start_soon(post, n, item)
                    made = {
                        key.split(":", 1)[1]: r.json()
                        for key, r in answers.items()
                        if r.status_code == 201
                    }
                    shown = await client.get(f"/orders/{next(iter(made.values()))['order']}")
                    assert shown.status_code == 200
                    assert (await client.get("/orders/999999")).status_code == 404
                statuses = sorted(r.status_code for r in answers.values())
                assert statuses.count(409) == REQUESTS // 4 and statuses.count(400) == 2
                assert statuses.count(201) == REQUESTS - REQUESTS // 4

                async def every_job_done() -> bool:
                    done = await driver.list_jobs(state=JobState.COMPLETED, limit=1000)
                    return len(done) >= len(made)

                while not await every_job_done():
                    await driver.wait_for_work(["orders"], timeout=0.1)
                async with jobs_trio.transaction(driver) as tx:
                    rows = await tx.fetch(f'SELECT id, item FROM "{pg_schema}".orders')
                jobs = await driver.list_jobs(limit=1000)
            finally:
                nursery.cancel_scope.cancel()
        # The example keeps its schema; this test's goes with it.
        async with jobs_trio.open_driver(url, schema=pg_schema, drop_schema_on_close=True):
            pass
    # One to one: every committed order has exactly one job, which ran once and confirmed it;
    # no job for an order rolled back, no order row for a sold-out item.
    orders = {row["id"]: row["item"] for row in rows}
    assert sorted(orders.values()) == sorted(made)
    assert not any(item.startswith("sold-out") for item in orders.values())
    assert sorted(json.loads(j.payload)["order"] for j in jobs) == sorted(orders)
    assert {j.key for j in jobs} == {f"order:{order}" for order in orders}
    assert all(j.state is JobState.COMPLETED and j.attempts == 1 for j in jobs)
    assert {j.result["confirmed"] for j in jobs} == set(orders)
    assert {made[item]["job"] for item in made} == {j.id for j in jobs}
