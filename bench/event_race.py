# The suspend/send race (issue 45): jobs that wait for an event while another process sends it a
# few milliseconds after the job said it was about to wait, so the send lands anywhere around the
# job's look and its suspend. Apart because it measures a wake-up, not throughput.
"""Count the racing sends that a waiting job missed, and time the wake-ups.

    python bench/event_race.py --db URL [--jobs 3000] [--rate 300] [--concurrency 50]
                               [--event-poll 10] [--spread 0.005] [--hold 0] [--one-at-a-time]

The worker runs in this process; jobs are enqueued RATE a second (no backlog: a woken job does
not wait behind first runs), and a job notes the moment it is about to wait (``step.
wait_for_event``, a key of its own) and a SENDER process sends its event ``0..spread`` seconds
after that note (``--hold S``: inside ``jobs_trio.transaction(driver)`` held open S seconds after
the send; ``--one-at-a-time``: the sender sends serially). Each wake-up is timed from its send's
return (CLOCK_MONOTONIC, system-wide on Linux) to the body's return from the wait; a wake-up that
took half the job's ``event_poll`` or more is one the send missed (it waited for the poll).
PostgreSQL: a schema of its own, dropped after; SQLite: a fresh file in a temporary folder.
Prints the count missed, and p50/p99/max of the wake-ups."""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import trio

import jobs_trio

EVENT = "race.go"


def options(url: str, schema: str) -> dict[str, Any]:
    return {"schema": schema} if url.startswith("postgres") else {}


# -- the sender: a process of its own ------------------------------------------------------------


async def sender(
    url: str, schema: str, after: float, spread: float, hold: float, serial: bool
) -> None:
    """Reads ``key noted_at`` lines on stdin; sends each key's event ``after + 0..spread`` s
    after its note; answers ``key sent_at`` on stdout (when the send returned, or committed)."""
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    lock = trio.Lock()
    async with jobs_trio.open_driver(url, **options(url, schema)) as driver:

        async def send(key: str, noted: float) -> None:
            await trio.sleep(max(noted + after + random.uniform(0, spread) - time.monotonic(), 0))
            async with lock if serial else _nothing():
                if hold > 0:
                    async with jobs_trio.transaction(driver) as tx:
                        await driver.send_event(EVENT, "{}", key=key, connection=tx)
                        await trio.sleep(hold)
                else:
                    await driver.send_event(EVENT, "{}", key=key)
            sys.stdout.write(f"{key} {time.monotonic()}\n")
            sys.stdout.flush()

        async with trio.open_nursery() as nursery:
            pending = b""
            while chunk := await stdin.receive_some():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    key, noted = line.decode().split()
                    nursery.start_soon(send, key, float(noted))


class _nothing:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


# -- the worker and the count --------------------------------------------------------------------


async def race(args: argparse.Namespace, url: str, schema: str) -> None:
    notes_send, notes_receive = trio.open_memory_channel[str](math.inf)
    woke: dict[str, float] = {}
    noted: set[str] = set()
    all_woke = trio.Event()
    registry = jobs_trio.Registry()

    @registry.job("race.wait", queue="race", event_poll=args.event_poll, attempts=3)
    async def wait(ctx: jobs_trio.JobContext, payload: dict[str, str]) -> None:
        key = payload["key"]
        if key not in noted:  # the first run only: a woken job replays to its wait
            noted.add(key)
            notes_send.send_nowait(f"{key} {time.monotonic()}\n")
        # include_earlier: a send that lands before the wait's record is written counts too (by
        # the rules, one sent before the wait began does not): what is timed is the race of the
        # send with the look and the suspend, not that rule.
        await ctx.step.wait_for_event("go", EVENT, match=key, include_earlier=True)
        woke.setdefault(key, time.monotonic())
        if len(woke) == args.jobs:
            all_woke.set()

    connect = {**options(url, schema), "migrate": True} if url.startswith("postgres") else {}
    if url.startswith("postgres"):
        connect["drop_schema_on_close"] = True
    sent: dict[str, float] = {}
    command = [
        sys.executable,
        __file__,
        "--sender",
        "--db",
        url,
        "--schema",
        schema,
        "--after",
        str(args.after),
        "--spread",
        str(args.spread),
        "--hold",
        str(args.hold),
    ] + (["--one-at-a-time"] if args.one_at_a_time else [])
    async with jobs_trio.open_driver(url, **connect) as driver:
        process = await trio.lowlevel.open_process(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert process.stdin is not None and process.stdout is not None
        to_sender, from_sender = process.stdin, process.stdout

        async def forward_notes() -> None:
            async for line in notes_receive:
                await to_sender.send_all(line.encode())

        async def read_sends() -> None:
            pending = b""
            while chunk := await from_sender.receive_some():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    key, at = line.decode().split()
                    sent[key] = float(at)

        keys = [f"k{n}" for n in range(args.jobs)]

        async def enqueue_at_rate() -> None:
            # Paced, so that a woken job never waits behind a backlog of first runs: what is
            # timed is the wake-up, not the queue.
            step = max(1, round(args.rate / 20))
            for start in range(0, args.jobs, step):
                await wait.enqueue_many(driver, [{"key": k} for k in keys[start : start + step]])
                await trio.sleep(step / args.rate)

        started = time.monotonic()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(forward_notes)
                nursery.start_soon(read_sends)
                nursery.start_soon(enqueue_at_rate)
                async with jobs_trio.open_worker(
                    driver,
                    registry,
                    queues=["race"],
                    concurrency=args.concurrency,
                    drain_on_shutdown=False,
                ):
                    with trio.move_on_after(max(60.0, args.event_poll * 3 + args.jobs / 20)):
                        await all_woke.wait()
                nursery.cancel_scope.cancel()
        finally:
            process.kill()
            await process.wait()
    took = time.monotonic() - started
    latencies = sorted(woke[k] - sent[k] for k in keys if k in woke and k in sent)
    missed = sum(1 for latency in latencies if latency >= args.event_poll / 2)
    never = args.jobs - len(latencies)
    print(
        f"{'postgres' if url.startswith('postgres') else 'sqlite'}: {args.jobs} jobs,"
        f" sends {args.after * 1000:g}-{(args.after + args.spread) * 1000:g} ms after each note"
        + (f", each in a transaction held {args.hold * 1000:g} ms" if args.hold else "")
        + (", one at a time" if args.one_at_a_time else "")
        + f", event_poll {args.event_poll:g} s, concurrency {args.concurrency}; {took:.1f} s"
    )
    print(f"waited for the poll: {missed} of {args.jobs}; never woke or never sent: {never}")
    if latencies:
        p50 = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, math.ceil(len(latencies) * 0.99) - 1)]
        print(
            f"wake-up after the send: p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms,"
            f" max {latencies[-1] * 1000:.1f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="postgresql://... or sqlite (a fresh file)")
    parser.add_argument("--schema", default="")
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--event-poll", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=300.0, help="jobs enqueued a second")
    parser.add_argument("--after", type=float, default=0.0, help="the sends' offset (s)")
    parser.add_argument("--spread", type=float, default=0.005)
    parser.add_argument("--hold", type=float, default=0.0)
    parser.add_argument("--one-at-a-time", action="store_true")
    parser.add_argument("--sender", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sender:
        trio.run(
            sender, args.db, args.schema, args.after, args.spread, args.hold, args.one_at_a_time
        )
        return
    if args.db.startswith("postgres"):
        trio.run(race, args, args.db, f"bench_race_{uuid.uuid4().hex[:8]}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(race, args, f"sqlite:///{Path(tmp) / 'race.db'}", "")


if __name__ == "__main__":
    main()
