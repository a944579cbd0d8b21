# The outbox end to end in real processes: an application commits 1,000 orders with an outbox
# enqueue each while relays move them, one SIGKILLed twice and restarted, two running at once
# for part of the time: exactly 1,000 jobs, each run once.
from __future__ import annotations

import collections
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import jobs_trio
from jobs_trio.driver import Driver
from tests.apps.outbox_app import registry
from tests.helpers.process_helpers import ROOT, killed_on_exit, until

pytestmark = pytest.mark.slow

ORDERS = 1000


async def spawn(started: list[trio.Process], tmp_path: Path, *args: str) -> trio.Process:
    log = tmp_path / f"process-{len(started)}-{args[0]}.log"
    with log.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "tests.apps.outbox_app", *args],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stderr=stderr,
        )
    started.append(process)
    if args[0] == "relay":

        async def relaying() -> bool:
            return "jobs.relay.started" in log.read_text()

        # Its signal handlers are in place only from here: a SIGTERM before would kill it.
        await until(f"relay process {process.pid} to start", 30, relaying)
    return process


async def jobs_in(store: Driver) -> int:
    return sum(sum(q.depth.values()) for q in await store.stats())


async def test_a_thousand_orders_through_killed_and_concurrent_relays(tmp_path: Path) -> None:
    app_url = f"sqlite:///{tmp_path / 'app.db'}"
    jobs_url = f"sqlite:///{tmp_path / 'jobs.db'}"
    seen = tmp_path / "seen.txt"
    async with (
        jobs_trio.open_driver(app_url) as app_db,  # created (and migrated) before the app runs
        jobs_trio.open_driver(jobs_url) as store,
        killed_on_exit() as started,
    ):
        orders = await spawn(started, tmp_path, "orders", app_url, str(ORDERS), str(seen))
        first = await spawn(started, tmp_path, "relay", app_url, jobs_url)

        async def at_least(n: int) -> bool:
            return await jobs_in(store) >= n

        await until("the first relay to move 100 jobs", 60, lambda: at_least(100))
        first.kill()  # SIGKILL 1: whatever it held mid-pass is left to the others
        await first.wait()
        second = await spawn(started, tmp_path, "relay", app_url, jobs_url)
        third = await spawn(started, tmp_path, "relay", app_url, jobs_url)  # two at once
        await until("the relays to reach 400 jobs", 60, lambda: at_least(400))
        second.kill()  # SIGKILL 2
        await second.wait()
        fourth = await spawn(started, tmp_path, "relay", app_url, jobs_url)  # restarted

        with trio.fail_after(120):
            assert await orders.wait() == 0

        async def outbox_empty() -> bool:
            return (await app_db.outbox_stats()).pending == 0

        await until("the outbox to drain", 60, outbox_empty)
        for relay in (third, fourth):
            relay.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert [await third.wait(), await fourth.wait()] == [0, 0]

        jobs = await store.list_jobs(limit=10 * ORDERS)
        assert len(jobs) == ORDERS
        assert len({json.loads(j.payload)["order"] for j in jobs}) == ORDERS
        assert {j.key for j in jobs if j.key} == {f"order:{n}" for n in range(0, ORDERS, 2)}
        logs = "".join(p.read_text() for p in tmp_path.glob("process-*-relay.log"))
        assert logs.count("jobs.relay.started") == 4 and "jobs.relay.moved" in logs

        # Each job runs once.
        async with jobs_trio.open_worker(store, registry, concurrency=50, poll_interval=0.05):

            async def all_ran() -> bool:
                return seen.exists() and len(seen.read_text().splitlines()) >= ORDERS

            await until("every job to run", 120, all_ran)
        runs = collections.Counter(line.split()[0] for line in seen.read_text().splitlines())
        assert len(runs) == ORDERS and set(runs.values()) == {1}
