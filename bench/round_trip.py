# What one driver round trip costs the worker process: CPU and wall per call of an empty claim
# and a get, on PostgreSQL through trio-asyncio. Apart because it isolates the crossing's cost
# from everything a worker does around it (issue 16: the steady-trickle gap).
"""One round trip's cost in the calling process.

    python bench/round_trip.py [--db postgresql://postgres@127.0.0.1:5432/postgres] [--n 1000]

Opens a driver on the database (migrating a schema `bench_round_trip` first), warms up, then
times N calls of each: `claim` on a queue with no jobs (the claim statement, nothing found)
and `get` of a missing id (one indexed read), then `SELECT 1` crossed as an asyncio Task and
stepped from Trio (drivers/asyncio_stepper.py), alternating; the schema is left for the next
run (drop it with `DROP SCHEMA bench_round_trip CASCADE`). Prints CPU µs (time.process_time:
this process only, the kernel's share of its socket calls included) and wall µs per call."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from jobs_trio import open_driver

SCHEMA = "bench_round_trip"


async def per_call(call: Callable[[], Awaitable[object]], n: int) -> tuple[float, float]:
    for _ in range(50):
        await call()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        await call()
    return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6


async def main(args: argparse.Namespace) -> None:
    print(f"load average {os.getloadavg()[0]:.2f}")
    async with open_driver(args.db, schema=SCHEMA, migrate=True) as driver:
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "claim, nothing due": lambda: driver.claim(
                ["bench.empty"], 10, lease=8.0, worker_id="bench"
            ),
            "get, a missing id": lambda: driver.get("no-such-job"),
        }
        for name, call in calls.items():
            cpu, wall = await per_call(call, args.n)
            print(f"{name:20} {cpu:6.0f} µs CPU {wall:6.0f} µs wall per call")
        await crossings(driver, args.n)


async def crossings(driver: Any, n: int) -> None:
    """`SELECT 1` on one pooled connection, crossed the two ways, alternating in 3 rounds: as an
    asyncio Task (trio_asyncio.aio_as_trio, how the driver crossed before) and stepped from the
    Trio task (asyncio_stepper, how every driver operation crosses now)."""
    import trio_asyncio

    from jobs_trio.drivers.asyncio_stepper import step_to_end

    bridge = driver.bridge
    async with bridge._pool.checkout() as conn:
        ways: dict[str, Callable[[], Awaitable[object]]] = {
            "SELECT 1 as a Task": lambda: trio_asyncio.aio_as_trio(conn.fetchval, loop=bridge.loop)(
                "SELECT 1"
            ),
            "SELECT 1 stepped": lambda: step_to_end(bridge.loop, conn.fetchval("SELECT 1")),
        }
        for round_ in range(1, 4):
            for name, call in ways.items():
                cpu, wall = await per_call(call, n)
                print(f"{name:20} {cpu:6.0f} µs CPU {wall:6.0f} µs wall per call (round {round_})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--n", type=int, default=1000)
    trio.run(main, parser.parse_args())
