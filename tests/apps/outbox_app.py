# The processes of tests/outbox/test_outbox_process.py: an application committing orders with an
# outbox enqueue each, and relays (killed and restarted by the test). Apart because each is a
# real process started by name, as an application's would be.
from __future__ import annotations

import logging
import os
import sqlite3
import sys
from typing import Any

import trio

import jobs_trio

registry = jobs_trio.Registry()


@registry.job("orders.ship", queue="orders", attempts=3)
async def ship(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
    # One write(2) of one line on an O_APPEND file: a job run twice shows up twice.
    fd = os.open(payload["seen"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{payload['order']} {ctx.job_id}\n".encode())
    finally:
        os.close(fd)


async def place_orders(app_url: str, count: int, seen: str) -> None:
    async with jobs_trio.open_driver(app_url) as app_db:
        conn = sqlite3.connect(app_db.path, check_same_thread=False)  # type: ignore[attr-defined]
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
        conn.commit()
        outbox = jobs_trio.Outbox(app_db)
        for order in range(count):
            async with jobs_trio.transaction(conn) as tx:
                await tx.execute("INSERT INTO orders (id) VALUES (?)", order)
                # Half keyed: a key also dedupes a live job, so the unkeyed half is what shows
                # that the relay's exactly-once does not lean on keys.
                key = f"order:{order}" if order % 2 == 0 else None
                await ship.enqueue(outbox, {"order": order, "seen": seen}, key=key)
        conn.close()


async def relay(app_url: str, jobs_url: str) -> None:
    async with (
        jobs_trio.open_driver(app_url) as app_db,
        jobs_trio.open_driver(jobs_url) as store,
        jobs_trio.open_lifecycle(grace=10) as lifecycle,
        # A short lease: a killed relay's rows come back to the others within a second.
        jobs_trio.open_relay(
            app_db, store, batch=25, poll_interval=0.02, lease=1.0, lifecycle=lifecycle
        ),
    ):
        await trio.sleep_forever()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    mode, *args = sys.argv[1:]
    if mode == "orders":
        trio.run(place_orders, args[0], int(args[1]), args[2])
    else:
        trio.run(relay, args[0], args[1])
