# The example web application over real HTTP: an order's row and its job are written in one
# transaction, and the worker beside the server runs the job.
from __future__ import annotations

from pathlib import Path

import pytest
import trio

httpx = pytest.importorskip("httpx")
pytest.importorskip("hypercorn")
pytest.importorskip("starlette")

from examples.orders_web import run  # noqa: E402

from jobs_trio._core.records import JobState  # noqa: E402


async def test_an_order_posted_over_http_gets_its_job_run(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            driver, bound = await nursery.start(run, f"sqlite:///{tmp_path / 'orders.db'}", 0)
            async with httpx.AsyncClient(base_url=bound) as client:
                made = await client.post("/orders", json={"item": "tea"})
                assert made.status_code == 201
                order, job_id = made.json()["order"], made.json()["job"]
                refused = await client.post("/orders", json={"item": ""})
                assert refused.status_code == 400
                assert (await client.get(f"/orders/{order}")).json()["item"] == "tea"
            while (
                record := await driver.get(job_id)
            ) is None or record.state != JobState.COMPLETED:
                await driver.wait_for_work(["orders"], timeout=0.1)
            assert record.result == {"confirmed": order}
            assert [r.id for r in await driver.list_jobs()] == [job_id]
            nursery.cancel_scope.cancel()
