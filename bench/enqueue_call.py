# One `enqueue` call's latency on PostgreSQL, old code beside new in one run: each round runs
# every given source tree in a process of its own, interleaved, on one database per tree.
"""Time N single ``enqueue`` calls (no worker running), per source tree, interleaved.

    python bench/enqueue_call.py --src src --src /tmp/old/src --rounds 4 --n 1000
    python bench/enqueue_call.py --variant as-is --variant listening   # an experiment
    python bench/enqueue_call.py --profile --n 3000      # cProfile of the calls, this tree

Every round starts one process per (tree, variant) (A B, A B, ...: drift in a shared machine
hits both); each process opens the driver on its own database (created once, dropped at the
end), warms up 200 calls, then times N. Answers p50/p99 per run, medians over the rounds.

Variants: ``as-is``; ``listening``, the same calls from a driver that LISTENs (one
``wait_for_work`` first, as a worker's driver does; a driver LISTENed from its open until
the lazy LISTEN), to measure what the driver's own notification, delivered back to the
enqueuing process, costs each call;
``pgqueuer``, the peer's single ``Queries.enqueue`` on one asyncpg connection, on uvloop when
installed (as in bench/lib_pgqueuer.py), for a side-by-side figure (bench environment only);
``raw-asyncio`` and ``raw-trio-asyncio``, jobs_trio's own enqueue statement sent by bare
asyncpg (same session settings, one connection, no LISTEN), on plain asyncio and from Trio
through trio-asyncio: the floor under the driver, and what the crossing alone adds to it."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VARIANTS = ("as-is", "listening", "pgqueuer", "raw-asyncio", "raw-trio-asyncio")
# Seconds idle between timed calls (--gap): 0 is a hot loop; run.py's latency workload leaves
# 30 ms, and a process waking from idle pays for it (see RESULTS.md).
GAP = 0.0
ADMIN_URL = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _timed(took: list[float]) -> dict[str, Any]:
    took.sort()
    q = statistics.quantiles(took, n=100, method="inclusive")
    return {"p50_ms": q[49], "p99_ms": q[98], "mean_ms": statistics.fmean(took)}


def _pgqueuer_child(url: str, n: int) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    async def main() -> dict[str, Any]:
        conn = await asyncpg.connect(url)
        try:
            queries = Queries(AsyncpgDriver(conn))
            if not await queries.has_table("pgqueuer"):
                await queries.install()
            for i in range(200):
                await queries.enqueue("bench.enqueue_call", json.dumps({"i": i}).encode())
            took = []
            for i in range(n):
                started = time.perf_counter()
                await queries.enqueue("bench.enqueue_call", json.dumps({"i": i}).encode())
                took.append((time.perf_counter() - started) * 1000)
                if GAP:
                    await asyncio.sleep(GAP)
        finally:
            await conn.close()
        return _timed(took)

    try:
        import uvloop

        answer = uvloop.run(main())
    except ImportError:
        answer = asyncio.run(main())
    answer["jobs_trio"] = "pgqueuer"
    print(json.dumps(answer), flush=True)


def _raw_child(url: str, n: int, via_trio: bool) -> None:
    """jobs_trio's enqueue statement through bare asyncpg: the schema migrated by the driver
    first, then one connection with the pool's session settings, no LISTEN anywhere."""
    import asyncpg
    import trio

    import jobs_trio
    from jobs_trio._core.records import NewJob, new_job_id
    from jobs_trio.drivers._postgres_plan import job_columns, limit_columns
    from jobs_trio.drivers._postgres_pool import session_settings

    async def statement() -> tuple[str, str]:
        async with jobs_trio.open_driver(url, migrate=True) as driver:
            return driver._sql["enqueue"], driver._sql.channel  # type: ignore[attr-defined]

    sql, channel = trio.run(statement)

    async def one(conn: asyncpg.Connection, i: int) -> None:
        # The driver's own argument builders: the statement's parameters change with it.
        job = NewJob(new_job_id(), "bench.enqueue_call", "bench", json.dumps({"i": i}), 3)
        await conn.fetch(sql, time.time(), *job_columns([job]), channel, *limit_columns([job]))

    async def timed(call: Any) -> dict[str, Any]:
        for i in range(200):
            await call(i)
        took = []
        for i in range(n):
            started = time.perf_counter()
            await call(i)
            took.append((time.perf_counter() - started) * 1000)
            if GAP:
                await (trio.sleep(GAP) if via_trio else asyncio.sleep(GAP))
        return _timed(took)

    async def connect() -> asyncpg.Connection:
        return await asyncpg.connect(url, server_settings=session_settings(url))

    if not via_trio:

        async def on_asyncio() -> dict[str, Any]:
            conn = await connect()
            try:
                return await timed(lambda i: one(conn, i))
            finally:
                await conn.close()

        answer = asyncio.run(on_asyncio())
    else:
        import trio_asyncio

        async def on_trio() -> dict[str, Any]:
            async with trio_asyncio.open_loop():
                conn = await trio_asyncio.aio_as_trio(connect)()
                try:
                    return await timed(lambda i: trio_asyncio.aio_as_trio(one)(conn, i))
                finally:
                    await trio_asyncio.aio_as_trio(conn.close)()

        answer = trio.run(on_trio)
    answer["jobs_trio"] = "bare asyncpg"
    print(json.dumps(answer), flush=True)


def _child(url: str, n: int, profile: bool, variant: str) -> None:
    if variant == "pgqueuer":
        _pgqueuer_child(url, n)
        return
    if variant.startswith("raw-"):
        _raw_child(url, n, via_trio=variant == "raw-trio-asyncio")
        return
    import trio

    import jobs_trio

    registry = jobs_trio.Registry()

    @registry.job("bench.enqueue_call", queue="bench")
    async def handler(ctx: jobs_trio.JobContext, payload: object) -> None:
        pass

    async def main() -> dict[str, Any]:
        async with jobs_trio.open_driver(url, migrate=True) as driver:
            if variant == "listening":
                await driver.wait_for_work(["bench"], timeout=0)  # LISTENs from here on
            for i in range(200):
                await handler.enqueue(driver, {"i": i})
            took = []
            for i in range(n):
                started = time.perf_counter()
                await handler.enqueue(driver, {"i": i})
                took.append((time.perf_counter() - started) * 1000)
                if GAP:
                    await trio.sleep(GAP)
        return _timed(took)

    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        answer = trio.run(main)
        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    else:
        answer = trio.run(main)
    answer["jobs_trio"] = str(Path(jobs_trio.__file__).parent)
    print(json.dumps(answer), flush=True)


async def _admin(sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(ADMIN_URL)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def _url(name: str) -> str:
    return ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--src", action="append", help="a tree holding jobs_trio/ (repeatable)")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variant", action="append", choices=VARIANTS)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--gap", type=float, default=0.0, help="s idle between timed calls")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global GAP
    GAP = args.gap
    if args.child:
        _child(args.child, args.n, args.profile, (args.variant or ["as-is"])[0])
        return 0
    sources = [str(Path(s).resolve()) for s in (args.src or [str(HERE.parent / "src")])]
    plan = [(src, v) for src in sources for v in (args.variant or ["as-is"])]
    names = [f"bench_enqcall_{os.getpid()}_{i}" for i in range(len(plan))]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {run: [] for run in plan}
    try:
        for name in names:
            asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
        for rnd in range(args.rounds):
            for (src, variant), name in zip(plan, names, strict=True):
                env = {**os.environ, "PYTHONPATH": src}
                argv = [sys.executable, __file__, "--child", _url(name), "--n", str(args.n)]
                argv += ["--variant", variant, "--gap", str(args.gap)]
                if args.profile:
                    argv.append("--profile")
                out = subprocess.run(argv, env=env, check=True, stdout=subprocess.PIPE, text=True)
                answer = json.loads(out.stdout.strip().splitlines()[-1])
                runs[(src, variant)].append(answer)
                print(
                    f"round {rnd + 1} {src} {variant}: p50 {answer['p50_ms']:.3f} ms,"
                    f" p99 {answer['p99_ms']:.3f} ms (load {os.getloadavg()[0]:.2f};"
                    f" imported {answer['jobs_trio']})",
                    flush=True,
                )
    finally:
        for name in names:
            asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    for (src, variant), answers in runs.items():
        p50 = statistics.median(a["p50_ms"] for a in answers)
        p99 = statistics.median(a["p99_ms"] for a in answers)
        print(
            f"{src} {variant}: p50 {p50:.3f} ms, p99 {p99:.3f} ms (median of {len(answers)} rounds)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
