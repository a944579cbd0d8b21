# An application on PostgreSQL that writes its rows and enqueues in one transaction, typed as an
# application would write it: checked by `mypy --strict` (the lint session) with no ignore at
# all, and run against a real server so every line here is also a working one.
# Apart from test_surface_types.py because that one holds the calls mypy must refuse.
from __future__ import annotations

import uuid
from typing import Any, assert_type

import pytest

import jobs_trio
from jobs_trio import DriverOptions, JobContext, Registry, Transaction
from jobs_trio._core.records import JobId
from tests.conftest import require_postgres

registry = Registry()


@registry.job("typed.confirm", queue="orders")
async def confirm(ctx: JobContext, payload: dict[str, int]) -> None:
    pass


async def place_order(driver: jobs_trio.Driver, schema: str, item: str) -> tuple[int, JobId]:
    """A request handler: the order's row, its job and an event, committed together."""
    async with jobs_trio.transaction(driver) as tx:
        assert_type(tx, Transaction)
        order_id = await tx.fetchval(
            f'INSERT INTO "{schema}".orders (item) VALUES ($1) RETURNING id', item
        )
        assert isinstance(order_id, int)
        job_id = await confirm.enqueue(driver, {"order": order_id}, key=f"order:{order_id}")
        await jobs_trio.send_event(driver, "order.placed", {"order": order_id})
    return order_id, job_id


async def order_items(driver: jobs_trio.Driver, schema: str) -> list[str]:
    """The application's own reads, on the same pool: a transaction of their own."""
    async with jobs_trio.transaction(driver) as tx:
        rows: list[Any] = await tx.fetch(f'SELECT item FROM "{schema}".orders ORDER BY id')
        first = await tx.fetchrow(f'SELECT item FROM "{schema}".orders ORDER BY id LIMIT 1')
        assert first is None or isinstance(first["item"], str)
    return [str(row["item"]) for row in rows]


def driver_options(schema: str) -> DriverOptions:
    # Built apart from the call, typed: a misspelt key fails the type check (test_surface_types).
    return {"schema": schema, "migrate": True, "pool_size": 4, "drop_schema_on_close": True}


@pytest.mark.postgres
async def test_a_typed_postgres_application_writes_its_row_and_job_in_one_transaction() -> None:
    schema = f"jt_{uuid.uuid4().hex[:12]}"
    async with jobs_trio.open_driver(require_postgres(), **driver_options(schema)) as driver:
        async with jobs_trio.transaction(driver) as tx:
            await tx.execute(f'CREATE TABLE "{schema}".orders (id serial PRIMARY KEY, item text)')
        order_id, job_id = await place_order(driver, schema, "tea")
        assert await order_items(driver, schema) == ["tea"]
        record = await driver.get(job_id)
        assert record is not None and record.key == f"order:{order_id}"
