# A process of the PREVIOUS release, run by the upgrade test with that release's package first on
# PYTHONPATH (releases/: its archive): only that release's public API is used here. Two modes:
#   fixture URL SCHEMA  write a database as that release would have it (jobs in every state,
#                       steps, events, cron marks, outbox rows), then stay on as its worker
#                       (queues default and old-a) until SIGTERM;
#   worker URL SCHEMA   a worker of that release started against the database as it is now
#                       (queues default and old-b): a rolling deploy's old pod, or a rollback.
# It says it is ready by writing $UPGRADE_MARKS/<mode>.json (the fixture's ids in it).
from __future__ import annotations

import json
import os
import sys
from typing import Any

import trio
from upgrade_jobs import ONLY_A, ONLY_B, RELEASE, make_registry, write

import jobs_trio

# The sleeper's nap: long enough to be asleep while the migration runs, short for the suite.
NAP = 3.0


def ready(name: str, **fields: Any) -> None:
    marks = os.environ["UPGRADE_MARKS"]
    path = os.path.join(marks, f"{name}.json")
    with open(path + ".part", "w", encoding="utf-8") as file:
        json.dump({"pid": os.getpid(), "release": RELEASE, **fields}, file)
    os.replace(path + ".part", path)  # whole or absent: the test polls for it


async def until(what: str, check: Any) -> None:
    with trio.fail_after(30):
        while not await check():
            await trio.sleep(0.05)


async def write_fixture(driver: Any, registry: jobs_trio.Registry) -> dict[str, Any]:
    """Every kind of row that release writes, before its worker runs."""
    job = registry.get
    # A job of the newer release (its application enqueued it): this worker parks it.
    newer = jobs_trio.Registry()

    @newer.job("up.future", attempts=1)
    async def future(ctx: Any, payload: Any) -> None:  # pragma: no cover - parked, never run
        raise AssertionError("run by the previous release")

    ids: dict[str, Any] = {
        "completed": [await job("up.work").enqueue(driver, {"n": n}) for n in range(4)],
        "flaky": await job("up.flaky").enqueue(driver, {}),
        "sleeper": await job("up.sleeper").enqueue(driver, {"nap": NAP}),
        "waiter": await job("up.waiter").enqueue(driver, {"order": "order-1"}),
        "future": await future.enqueue(driver, {}),
        "cancelled": await job("up.work").enqueue(driver, {}, delay=3600),
        # A live job holding a unique key (due once the new release says so).
        "keyed": await job("up.work").enqueue(driver, {}, key="up-key", delay=3600),
        # Due around the migration, and after.
        "delayed": [await job("up.work").enqueue(driver, {}, delay=1 + n / 2) for n in range(6)],
        # Running on this worker while the migration runs.
        "slow": [
            await job("up.slow").enqueue(driver, {"seconds": 0.8}, delay=0.5 + n / 2)
            for n in range(3)
        ],
    }
    await driver.cancel(ids["cancelled"])
    # Rows of the outbox that no relay has moved yet.
    outbox = jobs_trio.Outbox(driver)
    ids["outbox"] = [await job("up.work").enqueue(outbox, {"outbox": n}) for n in range(3)]
    # An event no job waits for (one of another order), kept in the events table.
    await jobs_trio.send_event(driver, "up.paid", {"paid": False}, key="order-0")
    return ids


async def fixture(url: str, options: dict[str, Any]) -> None:
    registry = make_registry(with_future=False)
    # PostgreSQL: migrated by that release; SQLite: by any open to write.
    migrate = {"migrate": True} if url.startswith("postgresql") else {}
    async with jobs_trio.open_driver(url, **migrate, **options) as driver:
        ids = await write_fixture(driver, registry)
        await serve(driver, registry, [ONLY_A], ids)


async def serve(
    driver: Any, registry: jobs_trio.Registry, only: list[str], ids: dict[str, Any] | None
) -> None:
    async with (
        jobs_trio.open_lifecycle(grace=5) as lifecycle,
        jobs_trio.open_worker(
            driver,
            registry,
            queues=["default", *only],
            concurrency=4,
            lifecycle=lifecycle,
            poll_interval=0.1,
        ),
    ):
        if ids is not None:
            await reached(driver, ids)
            ready("fixture", ids=ids)
            await enqueue_until_told(driver, registry)
        else:
            ready("worker")
        await trio.sleep_forever()  # ended by the lifecycle once the drain is done


async def enqueue_until_told(driver: Any, registry: jobs_trio.Registry) -> None:
    """The application of that release enqueuing while the new one migrates: every 50 ms, until
    $UPGRADE_MARKS/stop-enqueuing exists. Each outcome in the ledger, the counts in
    enqueuer.json. Stopped between two enqueues, never inside one (a cut one may commit)."""
    enqueued, failed = 0, 0
    work = registry.get("up.work")
    while not os.path.exists(os.path.join(os.environ["UPGRADE_MARKS"], "stop-enqueuing")):
        started = trio.current_time()
        try:
            job_id = await work.enqueue(driver, {"by": "enqueuer"})
        except jobs_trio.JobsError as exc:
            failed += 1
            write({"kind": "enqueue-failed", "error": str(exc)})
        else:
            enqueued += 1
            write({"kind": "enqueued", "job": job_id, "seconds": trio.current_time() - started})
        await trio.sleep(0.05)
    ready("enqueuer", enqueued=enqueued, failed=failed)


async def reached(driver: Any, ids: dict[str, Any]) -> None:
    """Wait until the fixture's jobs rest where that release put them."""

    async def state(job_id: str) -> str:
        record = await driver.get(job_id)
        return record.state.value if record is not None else "missing"

    async def all_there() -> bool:
        states = [await state(i) for i in ids["completed"]]
        return (
            states == ["completed"] * 4
            and await state(ids["flaky"]) == "dead"
            and await state(ids["sleeper"]) == "suspended"
            and await state(ids["waiter"]) == "suspended"
            and await state(ids["future"]) == "parked"
        )

    await until("the fixture's states", all_there)


async def worker(url: str, options: dict[str, Any]) -> None:
    async with jobs_trio.open_driver(url, **options) as driver:
        await serve(driver, make_registry(with_future=False), [ONLY_B], None)


def main() -> None:
    mode, url, schema = sys.argv[1:4]
    options = {"schema": schema} if schema else {}
    trio.run(fixture if mode == "fixture" else worker, url, options)


if __name__ == "__main__":
    main()
