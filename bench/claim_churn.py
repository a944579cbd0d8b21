# What a claim costs PostgreSQL under a steady trickle, as finished jobs accumulate: the worker's
# own claim statement, timed while another connection keeps enqueuing into the same queue. Apart
# from run.py: it isolates the one statement that grew in the steady-load workload (issue 16).
"""The PostgreSQL claim's cost under churn, on plans made while the table was empty.

    python bench/claim_churn.py [--db postgresql://postgres@127.0.0.1:5432/postgres] [--seconds 8]
        [--rounds 150]

A schema `bench_claim_churn` (migrated, emptied and VACUUM ANALYZEd first; left for the next
run). Two ways, one after the other, each for --seconds:

* apart: every round enqueues 20 jobs, then claims (the worker's statement, on a connection set
  as the driver's pool sets its own) and completes what it claimed;
* beside a feed: the same rounds, but the jobs come from a second connection that enqueues 5
  into the same queue every 2 ms, as a producer beside a worker does (~2,000 jobs/s, less than
  the rounds can claim: the queue stays short, as a worker keeping up keeps it).

Prints the claim's mean wall time per 150 rounds, then VACUUMs the table and times 150 more
rounds. Each connection prepares the claim on the emptied table's statistics, as a worker
started on a fresh deploy does. Measured here (2026-11-30, load ~0.5), beside a feed: before
migration 0008 the claim went from 1.9 ms to 5.5 ms to 16.8 ms over 14,000 jobs (its UPDATE
found rows by id by walking the newest-first index whole), and a VACUUM "fixed" it (new size
statistics, so the cached plan was made again); since, 0.8-1.1 ms throughout, apart 0.6-1.1 ms
(docs/drivers.md, 'Plans made on an empty table')."""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import asyncpg

from jobs_trio.drivers._claim_slots import ClaimSlots
from jobs_trio.drivers._postgres_pool import PLANNER_SETTINGS
from jobs_trio.drivers._postgres_sql import load_statements
from jobs_trio.drivers.postgres import _claim_arguments

SCHEMA = "bench_claim_churn"
ROUNDS = 150
INSERT = (
    f"INSERT INTO {SCHEMA}.jobs (id, name, queue, payload, priority, max_attempts, run_at,"
    " created_at, updated_at, state, attempts)"
    " SELECT i, 'noop', 'q', '{{}}', 0, 3, $2, $2, $2, 'ready', 0 FROM unnest($1::text[]) AS i"
)
COMPLETE = (
    f"UPDATE {SCHEMA}.jobs SET state = 'completed', token = NULL, lease_until = NULL"
    " WHERE id = ANY($1::text[])"
)


async def feed(url: str, stop: asyncio.Event) -> None:
    conn = await asyncpg.connect(url)
    try:
        while not stop.is_set():
            await conn.execute(INSERT, [uuid.uuid4().hex for _ in range(5)], time.time())
            await asyncio.sleep(0.002)
    finally:
        await conn.close()


async def rounds(url: str, seconds: float, *, fed: bool) -> None:
    sql = load_statements(SCHEMA)
    conn = await asyncpg.connect(url, server_settings=dict(PLANNER_SETTINGS))
    side = await asyncpg.connect(url)
    await side.execute(f"DELETE FROM {SCHEMA}.jobs")
    await side.execute(f"VACUUM ANALYZE {SCHEMA}.jobs")
    claim = await conn.prepare(sql["claim"])
    stop = asyncio.Event()
    feeding = asyncio.create_task(feed(url, stop)) if fed else None
    label = "beside a feed" if fed else "apart"
    slots = ClaimSlots.of(["q"], 50)

    async def timed(n: int) -> tuple[float, int]:
        spent, claimed = 0.0, 0
        for _ in range(n):
            if not fed:  # beside a feed, the feed alone enqueues: the queue stays short
                await side.execute(INSERT, [uuid.uuid4().hex for _ in range(20)], time.time())
            started = time.perf_counter()
            # The driver's own argument builder: the claim's parameters change with it.
            rows = await claim.fetch(*_claim_arguments(time.time(), slots, 8.0, "w", None, True))
            spent += time.perf_counter() - started
            claimed += len(rows)
            await side.execute(COMPLETE, [row["id"] for row in rows])
            await asyncio.sleep(0.008)
        return spent / n * 1e3, claimed

    try:
        began, total = time.monotonic(), 0
        while time.monotonic() - began < seconds:
            mean, claimed = await timed(ROUNDS)
            total += claimed
            print(f"{label:14} {total:7,} jobs claimed: claim {mean:5.2f} ms (mean of {ROUNDS})")
        await side.execute(f"VACUUM {SCHEMA}.jobs")
        mean, _ = await timed(ROUNDS)
        print(f"{label:14} after VACUUM:        claim {mean:5.2f} ms (mean of {ROUNDS})")
    finally:
        stop.set()
        if feeding is not None:
            await feeding
        await conn.close()
        await side.close()


async def main(args: argparse.Namespace) -> None:
    global ROUNDS
    ROUNDS = args.rounds  # fewer for a smoke run (tests/bench): each mean takes ~2 s at 150
    import trio

    from jobs_trio import open_driver

    async def migrate() -> None:
        async with open_driver(args.db, schema=SCHEMA, migrate=True):
            pass

    # The driver migrates on Trio; the timing runs on plain asyncio, the statement alone.
    await asyncio.to_thread(trio.run, migrate)
    for fed in (False, True):
        await rounds(args.db, args.seconds, fed=fed)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="claims per mean")
    asyncio.run(main(parser.parse_args()))
