# A worker whose one job writes a row per transactional step into an application table of the job
# store's own database, for tests/jobs/test_steps_transaction_processes.py: SIGKILLed at random and
# replaced, or paused (its loop blocked, then SIGSTOPped) by the test at a chosen step.
# Every step's entry is a line in a notes file first, so the test sees which runs began.
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import trio

import jobs_trio
from jobs_trio.driver import Driver


def rows_table(schema: str) -> str:
    return f'"{schema}".app_rows' if schema else "app_rows"


def note(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def paused_before(path: str) -> bool:
    """Whether a run paused already (its line is in the notes): the attempt number does not
    say, a worker's death hands the attempt back (orphaned)."""
    try:
        with open(path) as notes:
            return any(line.startswith("paused ") for line in notes)
    except FileNotFoundError:
        return False


def blocked_until(gate: str) -> None:
    """The loop held, as a long GC pause holds it: nothing of this worker's Trio side runs,
    not its renewals, not its watchdog, until the test opens the gate."""
    while not os.path.exists(gate):
        time.sleep(0.01)


def registry_for(driver: Driver, schema: str) -> jobs_trio.Registry:
    registry = jobs_trio.Registry()
    postgres = not driver.url.startswith("sqlite")
    insert = f"INSERT INTO {rows_table(schema)} (step, attempt, pid) VALUES " + (
        "($1, $2, $3)" if postgres else "(?, ?, ?)"
    )

    @registry.job("rows.write", queue="rows", attempts=100, timeout=120)
    async def write_rows(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> int:
        notes, pause, at = payload["notes"], payload.get("pause"), payload.get("at")

        async def write(tx: jobs_trio.Transaction, n: int) -> int:
            note(notes, f"enter {n} {ctx.attempt} {os.getpid()}")
            await tx.execute(insert, n, ctx.attempt, os.getpid())
            # Time inside the transaction, after its row: where a random SIGKILL mostly lands.
            await trio.sleep(payload["spacing"])
            if pause == "inside" and n == at and not paused_before(notes):
                note(notes, f"paused {n} {os.getpid()}")
                # The row written, not committed. Last: from here to the step's record nothing
                # awaits, so nothing of the worker's own clock is heard before the record.
                blocked_until(payload["gate"])
            return n

        for n in range(payload["steps"]):
            if pause == "before" and n == at and not paused_before(notes):
                note(notes, f"paused {n} {os.getpid()}")
                blocked_until(payload["gate"])  # outside any transaction: the file is free
            await ctx.step.transaction(f"row-{n:03d}", write, n)
        return int(payload["steps"])

    return registry


async def main(url: str, schema: str, lease: float) -> None:
    options: dict[str, Any] = {"schema": schema} if schema else {}
    async with (
        jobs_trio.open_driver(url, **options) as driver,
        jobs_trio.open_worker(
            driver,
            registry_for(driver, schema),
            queues=["rows"],
            concurrency=1,
            lease=lease,
            poll_interval=0.05,
            stats_interval=None,
            retention=None,
        ),
    ):
        await trio.sleep_forever()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    trio.run(main, sys.argv[1], sys.argv[2], float(sys.argv[3]))
