# A small Trio web application (Starlette on hypercorn's Trio worker): POST /orders writes the
# order's row and enqueues its confirmation job in ONE transaction, so there is never an order
# without its job, nor a job for an order that was rolled back. Run it:
#
#     python -m examples.orders_web sqlite:///orders.db 8000
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


def build_app(driver: jobs_trio.Driver) -> Starlette:
    async def create_order(request: Request) -> JSONResponse:
        body = await request.json()
        item = body.get("item") if isinstance(body, dict) else None
        if not isinstance(item, str) or not item:
            return JSONResponse({"error": "give an item"}, status_code=400)
        # The driver's own SQLite connection holds the transaction: the row and the job
        # commit together when the block ends, or neither does if anything in it raises.
        async with jobs_trio.transaction(driver) as tx:
            [(order_id,)] = await tx.execute(
                "INSERT INTO orders (item) VALUES (?) RETURNING id", item
            )
            job_id = await confirm.enqueue(driver, {"order": order_id}, key=f"order:{order_id}")
        return JSONResponse({"order": order_id, "job": job_id}, status_code=201)

    async def show_order(request: Request) -> JSONResponse:
        order_id = int(request.path_params["order_id"])
        async with jobs_trio.transaction(driver) as tx:
            rows = await tx.execute("SELECT id, item FROM orders WHERE id = ?", order_id)
        if not rows:
            return JSONResponse({"error": "no such order"}, status_code=404)
        return JSONResponse({"order": rows[0][0], "item": rows[0][1]})

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
    task_status: trio.TaskStatus[tuple[jobs_trio.Driver, str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve on ``port`` (0: any free one) with a worker beside the server, until a signal."""
    async with (
        jobs_trio.open_driver(url) as driver,
        jobs_trio.open_lifecycle(grace=10) as lifecycle,
    ):
        async with jobs_trio.transaction(driver) as tx:
            await tx.execute(
                "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)"
            )
        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.accesslog = None
        async with (
            jobs_trio.open_worker(driver, registry, lifecycle=lifecycle, poll_interval=0.5),
            trio.open_nursery() as nursery,
        ):
            [bound] = await nursery.start(serve, build_app(driver), config)
            task_status.started((driver, bound))
            await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(run, sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8000)
