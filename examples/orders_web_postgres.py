# The example web application on PostgreSQL (Starlette on hypercorn's Trio worker): POST /orders
# writes the order's row and enqueues its confirmation job in ONE transaction, on a connection of
# the driver's own pool, so there is never an order without its job, nor a job for an order that
# was rolled back (an item found sold out after the writes rolls both back). Run it:
#
#     python -m examples.orders_web_postgres postgresql://postgres@127.0.0.1/postgres 8000
#     curl -X POST localhost:8000/orders -d '{"item": "tea"}'
from __future__ import annotations

import sys
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import jobs_trio

registry = jobs_trio.Registry()


@registry.job("orders.confirm", queue="orders")
async def confirm(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    # A real application would send the e-mail here; the result is what a test can read.
    return {"confirmed": payload["order"]}


class SoldOut(Exception):
    """Found after the order's writes: the whole transaction rolls back."""


def build_app(driver: jobs_trio.Driver, schema: str) -> Starlette:
    orders = f'"{schema}".orders'

    async def create_order(request: Request) -> JSONResponse:
        body = await request.json()
        item = body.get("item") if isinstance(body, dict) else None
        if not isinstance(item, str) or not item:
            return JSONResponse({"error": "give an item"}, status_code=400)
        try:
            # A connection of the driver's pool holds the transaction for the block: the row
            # and the job commit together when it ends, or neither does if anything raises.
            async with jobs_trio.transaction(driver) as tx:
                order_id = await tx.fetchval(
                    f"INSERT INTO {orders} (item) VALUES ($1) RETURNING id", item
                )
                job_id = await confirm.enqueue(driver, {"order": order_id}, key=f"order:{order_id}")
                if item.startswith("sold-out"):
                    raise SoldOut(item)
        except SoldOut:
            return JSONResponse({"error": f"{item} is sold out"}, status_code=409)
        return JSONResponse({"order": order_id, "job": job_id}, status_code=201)

    async def show_order(request: Request) -> JSONResponse:
        # The application's reads go through the same pool: a transaction of their own.
        async with jobs_trio.transaction(driver) as tx:
            row = await tx.fetchrow(
                f"SELECT id, item FROM {orders} WHERE id = $1", request.path_params["order_id"]
            )
        if row is None:
            return JSONResponse({"error": "no such order"}, status_code=404)
        return JSONResponse({"order": row["id"], "item": row["item"]})

    return Starlette(
        routes=[
            Route("/orders", create_order, methods=["POST"]),
            Route("/orders/{order_id:int}", show_order, methods=["GET"]),
        ]
    )


async def run(
    url: str,
    port: int = 8000,
    *,
    schema: str = "jobs_trio",
    task_status: trio.TaskStatus[tuple[jobs_trio.Driver, str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve on ``port`` (0: any free one) with a worker beside the server, until a signal. The
    orders table lives in ``schema``, beside the jobs."""
    async with (
        jobs_trio.open_driver(url, schema=schema, migrate=True, pool_size=10) as driver,
        jobs_trio.open_lifecycle(grace=10) as lifecycle,
    ):
        async with jobs_trio.transaction(driver) as tx:
            await tx.execute(
                f'CREATE TABLE IF NOT EXISTS "{schema}".orders'
                " (id serial PRIMARY KEY, item text NOT NULL)"
            )
        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.accesslog = None
        async with (
            jobs_trio.open_worker(driver, registry, lifecycle=lifecycle),
            trio.open_nursery() as nursery,
        ):
            [bound] = await nursery.start(serve, build_app(driver, schema), config)
            task_status.started((driver, bound))
            await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(run, sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8000)
