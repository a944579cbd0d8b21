# What one driver round trip costs the worker process: CPU and wall per call of an empty claim
# and a get, on PostgreSQL through trio-asyncio. Apart because it isolates the crossing's cost
# from everything a worker does around it (issue 16: the steady-trickle gap).
"""One round trip's cost in the calling process.

    python bench/round_trip.py [--db postgresql://postgres@127.0.0.1:5432/postgres] [--n 1000]

Opens a driver on the database (migrating a schema `bench_round_trip` first), warms up, then
times N calls of each: `claim` on a queue with no jobs (the claim statement, nothing found)
and `get` of a missing id (one indexed read), then `SELECT 1` crossed as an asyncio Task,
stepped from Trio (drivers/asyncio_stepper.py) with the loop reading the socket, and stepped
with the Trio task reading it (drivers/direct_reads.py), alternating; the schema is left for
the next run (drop it with `DROP SCHEMA bench_round_trip CASCADE`). Prints CPU µs
(time.process_time: this process only, the kernel's share of its socket calls included) and
wall µs per call."""

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
    """`SELECT 1` on one pooled connection, crossed three ways, alternating in 3 rounds: as an
    asyncio Task (trio_asyncio.aio_as_trio, how the driver crossed before); stepped from the
    Trio task with the loop reading the socket (asyncio_stepper alone); and stepped with the
    Trio task reading the socket itself (direct_reads: how every pooled operation runs now)."""
    import trio_asyncio

    from jobs_trio.drivers._asyncio_stepper import step_to_end
    from jobs_trio.drivers._direct_reads import let_loop_read, take_over, transport_of

    bridge = driver.bridge
    async with bridge._pool.checkout() as conn:

        def loop_reads() -> None:
            let_loop_read(conn)  # named give_back until 840f352 (one name per idea)

        ways: dict[str, tuple[Callable[[], object], Callable[[], Awaitable[object]]]] = {
            "SELECT 1 as a Task": (
                loop_reads,
                lambda: trio_asyncio.aio_as_trio(conn.fetchval, loop=bridge.loop)("SELECT 1"),
            ),
            "SELECT 1 stepped": (
                loop_reads,
                lambda: step_to_end(bridge.loop, conn.fetchval("SELECT 1")),
            ),
            "SELECT 1 read here": (
                lambda: take_over(conn),
                lambda: step_to_end(
                    bridge.loop, conn.fetchval("SELECT 1"), reads=transport_of(conn)
                ),
            ),
        }
        for round_ in range(1, 4):
            for name, (setup, call) in ways.items():
                setup()
                await trio.sleep(0)  # the loop's reader task starts or ends
                cpu, wall = await per_call(call, n)
                print(f"{name:20} {cpu:6.0f} µs CPU {wall:6.0f} µs wall per call (round {round_})")
        take_over(conn)  # back to the pool as it came out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--n", type=int, default=1000)
    trio.run(main, parser.parse_args())
