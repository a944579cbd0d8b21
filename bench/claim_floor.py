# What one settle-and-claim of a single job costs PostgreSQL, beside the least statement that
# could do it: the default worker's c=1 and c=10 pay it once per claim. Apart because it times
# the server alone (plain asyncpg on asyncio, the backend's own CPU), not the worker.
"""The server's cost of the worker's one-job settle-and-claim against a minimal one.

    python bench/claim_floor.py [--db postgresql://postgres@127.0.0.1:5432/postgres] [--n 1500]

Enqueues jobs into a schema of its own (`bench_claim_floor`, dropped at the end), VACUUM
ANALYZE, then on one connection with the pool's session settings runs, in rounds, N of each:
``full``, the driver's own settle_claim_complete statement settling the previous job (with the
attempt's note, as the worker settles it) and claiming one; ``minimal``, one statement that only
completes the previous job (fenced by its token) and claims the next due one (no lapsed-lease
rescue, no burial of exhausted jobs, no fleet limits, no NOTIFY, no attempt history); and
``select1``, a bare round trip. Prints wall µs per statement and the backend's CPU µs per
statement (/proc/<pid>/stat of the server process: 10 ms ticks, so use thousands). The
difference full - minimal is what the features cost each claim."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import trio

import jobs_trio
from jobs_trio._core.records import AttemptNote, Complete, Lease
from jobs_trio.drivers._claim_slots import ClaimSlots
from jobs_trio.drivers._postgres_pool import PLANNER_SETTINGS
from jobs_trio.drivers._postgres_sql import load_statements
from jobs_trio.drivers.postgres import _claim_arguments, _settle_columns

SCHEMA = "bench_claim_floor"
registry = jobs_trio.Registry()


@registry.job("bench.claim_floor", queue="bench_claim_floor")
async def noop(ctx: jobs_trio.JobContext, payload: Any) -> None:
    pass


MINIMAL = f"""
WITH settled AS (
    UPDATE {SCHEMA}.jobs AS j
    SET state = 'completed', result = $7, token = NULL, lease_until = NULL, worker_id = NULL,
        updated_at = $1
    WHERE j.id = $5 AND j.token = $6 AND j.state = 'running'
    RETURNING j.id
), due AS MATERIALIZED (
    SELECT id FROM {SCHEMA}.jobs
    WHERE queue = $2 AND state IN ('ready', 'suspended') AND run_at <= $1
    ORDER BY priority, run_at, id LIMIT $3
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {SCHEMA}.jobs AS j
    SET state = 'running', attempts = j.attempts + 1, lease_until = $1::float8 + 8,
        worker_id = $4, token = gen_random_uuid()::text, updated_at = $1
    WHERE j.id = ANY (ARRAY(SELECT id FROM due))
    RETURNING j.id, j.token, j.name, j.queue, j.payload, j.attempts
)
SELECT id, token, true AS claimed FROM claimed
UNION ALL SELECT id, NULL, false FROM settled
"""


def backend_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        rest = stat.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


async def enqueue(url: str, count: int) -> None:
    async with jobs_trio.open_driver(url, schema=SCHEMA, migrate=True) as driver:
        await noop.enqueue_many(driver, [{"i": i} for i in range(count)])


async def measure(url: str, n: int, rounds: int) -> None:
    sql = load_statements(SCHEMA)
    conn = await asyncpg.connect(url, server_settings=dict(PLANNER_SETTINGS))
    try:
        await conn.execute(f"VACUUM ANALYZE {SCHEMA}.jobs")
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        queue = noop.queue
        slots = ClaimSlots.of([queue], 1)

        # The driver's own argument builders (as postgres.py calls them): the statements'
        # parameters change with the driver, and a list spelled out here went stale.
        def claim_args() -> tuple[Any, ...]:
            return _claim_arguments(time.time(), slots, 8.0, "w", None, True)

        async def full(prev: Any) -> Any:
            # As the worker settles a run: Complete, with the attempt's note for its history.
            note = AttemptNote(attempt=1, worker_id="w", seconds=0.0)
            done = Complete(Lease(prev["id"], prev["token"]), "null", note=note)
            return await conn.fetch(
                sql["settle_claim_complete"], *claim_args(), sql.channel, *_settle_columns([done])
            )

        async def minimal(prev: Any) -> Any:
            return await conn.fetch(
                MINIMAL, time.time(), queue, 1, "w", prev["id"], prev["token"], "null"
            )

        async def select1(prev: Any) -> Any:
            await conn.fetch("SELECT 1")
            return [prev]

        [first] = await conn.fetch(sql["claim"], *claim_args())
        prev: Any = {"id": first["id"], "token": first["token"], "claimed": True}
        kinds: list[tuple[str, Callable[[Any], Awaitable[Any]]]] = [
            ("full", full),
            ("minimal", minimal),
            ("select1", select1),
        ]
        for round_ in range(1, rounds + 1):
            for name, statement in kinds:
                for _ in range(50):  # warm: the statement prepared, its plan cached
                    prev = next(r for r in await statement(prev) if r["claimed"])
                cpu, wall = backend_cpu(pid), time.perf_counter()
                for _ in range(n):
                    prev = next(r for r in await statement(prev) if r["claimed"])
                cpu, wall = backend_cpu(pid) - cpu, time.perf_counter() - wall
                print(
                    f"round {round_} {name:8} {wall / n * 1e6:5.0f} µs wall, "
                    f"backend CPU {cpu / n * 1e6:4.0f} µs a statement",
                    flush=True,
                )
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--n", type=int, default=1500, help="statements of each kind a round")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    trio.run(enqueue, args.db, (args.n + 50) * 2 * args.rounds + 100)
    asyncio.run(measure(args.db, args.n, args.rounds))


if __name__ == "__main__":
    main()
