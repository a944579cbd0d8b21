# Where a probe job's time goes while a worker runs a steady load, on PostgreSQL: an in-process
# worker at concurrency 50 with timestamps around its claims, fed by bench/lib_jobs_trio.py.
"""Time probe jobs under a steady load, stage by stage (the latency-under-load workload of
bench/run.py, the worker in this process).

    python bench/probe_path.py [--rate 4000] [--n 200] [--gap 0.05] [--warmup 3]

Creates (and drops) a database ``bench_probe_path``. The worker (concurrency 50, every other
option at its default, its INFO lines on stderr as the CLI writes them) runs in this process;
``bench/lib_jobs_trio.py load`` is fed RATE jobs/s in orders every 20 ms, as run.py's feed
(without its backlog cap), and after WARMUP s ``bench/lib_jobs_trio.py latency`` sends N single
enqueues GAP apart. Each probe's claim is found by its payload in the worker's claim answers.
Prints p50/p75/p90 of: the enqueue call; its return to the claim that took it being sent (the
worker may be busy); that claim's round trip (sent to answered in the driver, the Trio loop's
turn included); answered to the handler's start; and call to start (the figure run.py reports),
then the slowest probes' stages. Compare trees with PYTHONPATH=<tree>/src (the feed and the
probe inherit it). Peers: bench/run.py load."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio
from wake_path import a_database, single_enqueues

import jobs_trio
from jobs_trio._cli.logging_flags import configure_logging
from jobs_trio.drivers import postgres

HERE = Path(__file__).resolve().parent
NAME = "bench_probe_path"
TICK = 0.02  # the feed's order interval, as run.py's load_tick
registry = jobs_trio.Registry()
started: dict[int, float] = {}
# Every claim's (sent, answered, probes it brought), monotonic.
claims: list[tuple[float, float, list[int]]] = []
# The worker's calls by kind: claims alone, claims that carried settlements, settles alone.
calls = {"_claim": 0, "_settle_and_claim": 0, "settle": 0}


# bench/lib_jobs_trio.py's job name and queue: the feed and the probe enqueue these.
@registry.job("bench.job", queue="bench")
async def handler(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
    if "i" in payload:
        started[payload["i"]] = time.monotonic()


def patch() -> None:
    """Timestamps around the driver's two claim calls (this process's only), and its calls
    counted by kind."""
    settle = postgres.PostgresDriver.settle

    async def counted_settle(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["settle"] += 1
        return await settle(self, *args, **kwargs)

    postgres.PostgresDriver.settle = counted_settle  # type: ignore[method-assign]
    for name, answer in (("_claim", lambda r: r), ("_settle_and_claim", lambda r: r[1])):
        original = getattr(postgres.PostgresDriver, name)

        def timed(original: Any, answer: Any, name: str) -> Any:
            async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
                calls[name] += 1
                sent = time.monotonic()
                result = await original(self, *args, **kwargs)
                probes = [json.loads(c.payload)["i"] for c in answer(result) if '"i"' in c.payload]
                claims.append((sent, time.monotonic(), probes))
                return result

            return call

        setattr(postgres.PostgresDriver, name, timed(original, answer, name))


async def feed(url: str, rate: float, stop: trio.Event) -> None:
    """RATE jobs/s to the load process, an order a TICK, each acknowledged before the next."""
    process = await trio.lowlevel.open_process(
        [sys.executable, str(HERE / "lib_jobs_trio.py"), "load", "--db", url],
        stdin=-1,
        stdout=-1,
        cwd=str(HERE),
    )
    assert process.stdin is not None and process.stdout is not None
    owed, due, answer = 0.0, trio.current_time(), b""
    try:
        while not stop.is_set():
            owed += rate * TICK
            order, owed = int(owed), owed - int(owed)
            if order:
                await process.stdin.send_all(f"{order}\n".encode())
                while b"\n" not in answer:
                    answer += await process.stdout.receive_some()
                answer = answer.split(b"\n", 1)[1]
            due += TICK
            await trio.sleep_until(max(due, trio.current_time()))
        await process.stdin.aclose()
        with trio.move_on_after(10):
            await process.wait()
    finally:
        process.kill()


def quantiles(values: Sequence[float]) -> str:
    v = sorted(values)
    return " ".join(
        f"p{int(q * 100)} {v[min(len(v) - 1, int(len(v) * q))]:7.3f}" for q in (0.5, 0.75, 0.9)
    )


async def main(args: argparse.Namespace) -> None:
    async with a_database(NAME) as url:
        patch()
        configure_logging(argparse.Namespace(log_level="info", log_format="text"))
        async with (
            jobs_trio.open_driver(url) as driver,
            jobs_trio.open_worker(driver, registry, concurrency=50, drain_on_shutdown=False),
            trio.open_nursery() as nursery,
        ):
            stop = trio.Event()
            nursery.start_soon(feed, url, args.rate, stop)
            await trio.sleep(args.warmup)
            answer = await single_enqueues(url, args.n, args.gap)
            await trio.sleep(0.5)
            stop.set()
    stages: dict[str, list[float]] = {
        k: [] for k in ("call", "return->sent", "round trip", "answered->start", "call->start")
    }
    rows = []
    for i, (called, returned) in enumerate(zip(answer["called"], answer["returned"], strict=True)):
        took = [c for c in claims if i in c[2]]
        if not took or i not in started:
            continue
        sent, answered, _ = took[0]
        row = (
            returned - called,
            sent - returned,  # negative: the claim went before the call's answer came back
            answered - sent,
            started[i] - answered,
            started[i] - called,
        )
        rows.append(row)
        for key, value in zip(stages, row, strict=True):
            stages[key].append(value * 1000)
    for key, values in stages.items():
        print(f"{key:16} {quantiles(values)} ms")
    print(f"({len(rows)} of {args.n} probes; load {args.rate:g} jobs/s; {jobs_trio.__file__})")
    # Whether settlements rode on the claims (one round trip for both) or went alone.
    print(
        f"calls: {calls['_claim']:,} claims alone, {calls['_settle_and_claim']:,} that carried"
        f" settlements, {calls['settle']:,} settles alone"
    )
    for row in sorted(rows, key=lambda r: -r[-1])[:3]:
        print("slow: " + ", ".join(f"{k} {v * 1000:.2f}" for k, v in zip(stages, row, strict=True)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=4000.0)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.05)
    parser.add_argument("--warmup", type=float, default=3.0)
    trio.run(main, parser.parse_args())
