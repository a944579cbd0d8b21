# Issue 19's "deep queue" workload beside the peers: a real worker's rate with N jobs waiting.
# Apart from deep_backlog.py (jobs_trio alone, its CLI worker) because it drives every library
# through run.py's adapters and databases, interleaved in one run.
"""Worker throughput with 20,000 and 1,000,000 jobs waiting, jobs_trio beside the peers.

    python bench/deep_queue.py                                  # c=50, then c=10
    python bench/deep_queue.py --concurrency 50 --depth 20000 --depth 1000000 --rounds 1

For each concurrency, each depth, each library (libraries interleaved innermost): a fresh
database (run.py's fresh_db, dropped after), N no-op jobs enqueued, VACUUM ANALYZE (every library
alike), one worker started by the library's adapter (lib_<lib>.py, its best documented
configuration), and the jobs completed over WINDOW seconds after WARMUP from the first handler
start. The rate is the database's own: completed(t2) - completed(t1) over the span of the
completion timestamps the two samples read (run.py's DONE_SQL), while the queue is still deep;
a queue that drains sooner (20,000 at a fast library's rate) is timed over the whole batch,
first handler start to last completion, as run.py times its batch.

Enqueue: jobs_trio and PgQueuer through their own bulk API (`enqueue_many` / `Queries.enqueue`
with lists) in batches of 100,000, each batch one adapter process; Procrastinate by one SQL
INSERT ... SELECT generate_series into procrastinate_jobs (its triggers fire as for a defer),
because its `batch_defer_async` runs ~8,000 jobs/s here (2 minutes per million)."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import asyncpg  # noqa: E402

from run import (  # noqa: E402
    DONE_SQL,
    LIBS,
    BenchError,
    _workdir,
    analyze,
    fresh_db,
    query_row,
    read_marks,
    run_once,
    running,
    start_worker,
)

BATCH = 100_000
PROCRASTINATE_INSERT = (
    "INSERT INTO procrastinate_jobs (queue_name, task_name, args)"
    " SELECT 'bench', 'bench.job', '{}'::jsonb FROM generate_series(1, $1)"
)


def load1() -> float:
    return os.getloadavg()[0]


async def enqueue(lib: str, url: str, n: int, workdir: Path) -> float:
    """N jobs waiting; answers the seconds the enqueue itself took (schema install excluded)."""
    if lib == "procrastinate":
        args = ["enqueue", "--install", "--db", url, "--n", "0"]
        await run_once(lib, args, workdir, f"{lib}-schema", 120)
        conn = await asyncpg.connect(url, timeout=10)
        try:
            started = time.perf_counter()
            await conn.execute(PROCRASTINATE_INSERT, n, timeout=1800)
            return time.perf_counter() - started
        finally:
            await conn.close()
    spent = 0.0
    for i, start in enumerate(range(0, n, BATCH)):
        size = min(BATCH, n - start)
        args = ["enqueue", "--db", url, "--n", str(size), *(["--install"] if i == 0 else [])]
        answer = await run_once(lib, args, workdir, f"{lib}-enqueue", 900)
        spent += float(answer["seconds"])
    return spent


async def done(lib: str, url: str) -> tuple[int, float]:
    row = await query_row(url, DONE_SQL[lib])
    return int(row[0]), float(row[1] or 0.0)


async def cell(
    lib: str, depth: int, conc: int, warmup: float, window: float, workdir: Path
) -> dict[str, Any]:
    async with fresh_db(lib) as url:
        load_before = load1()
        enqueue_s = await enqueue(lib, url, depth, workdir)
        analyze_s = await analyze(url)
        mark = workdir / f"{lib}-{time.monotonic_ns()}.marks"
        worker = await start_worker(lib, url, conc, "noop", mark, workdir)
        async with running(worker, grace=30):
            deadline = time.monotonic() + 120
            while not read_marks(mark):
                if worker.proc.returncode is not None or time.monotonic() > deadline:
                    raise BenchError(f"{lib}: no job started{worker.tail()}")
                await asyncio.sleep(0.05)
            first = float(read_marks(mark)[0].split()[1])
            await asyncio.sleep(max(0.0, first + warmup - time.time()))
            c1, t1 = await done(lib, url)
            load_start = load1()
            window_ends = time.monotonic() + window
            # A queue that drains before the window ends (20,000 at a fast library's rate) is
            # timed over the whole batch instead: first start to last completion.
            while time.monotonic() < window_ends:
                await asyncio.sleep(0.25)
                c2, t2 = await done(lib, url)
                if c2 >= depth:
                    break
            load_end = load1()
            if worker.proc.returncode is not None:
                raise BenchError(f"{lib}: the worker exited inside the window{worker.tail()}")
    drained = c2 >= depth
    if drained:
        rate, counted = depth / (t2 - first), depth
    else:
        rate, counted = (c2 - c1) / (t2 - t1), c2 - c1
    return {
        "lib": lib,
        "depth": depth,
        "concurrency": conc,
        "jps": rate,
        "over": "whole batch" if drained else "window",
        "jobs_counted": counted,
        # The same measure as a drained batch's (ramp-up included), for a like-for-like ratio.
        "from_first_jps": c2 / (t2 - first),
        "enqueue_s": enqueue_s,
        "analyze_s": analyze_s,
        "loads": [load_before, load_start, load_end],
    }


def row(r: dict[str, Any]) -> str:
    loads = "/".join(f"{x:.1f}" for x in r["loads"])
    return (
        f"| c={r['concurrency']} | {r['depth']:,} | {r['lib']} | {r['jps']:,.0f} |"
        f" {r['from_first_jps']:,.0f} | {r['jobs_counted']:,} ({r['over']}) |"
        f" {r['enqueue_s']:.1f} | {r['analyze_s']:.1f} | {loads} |"
    )


HEADER = (
    "| concurrency | waiting | library | jobs/s | jobs/s from the first start |"
    " jobs counted (over) | enqueue s | VACUUM ANALYZE s |"
    " load 1-min (before enqueue / window start / end) |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


async def main(args: argparse.Namespace) -> None:
    began = time.monotonic()
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, command: {' '.join(sys.argv)}")
    print(HEADER, flush=True)
    results = []
    with _workdir() as workdir:
        for _ in range(args.rounds):
            for conc in args.concurrency:
                for depth in args.depth:
                    for lib in args.lib:
                        if lib == "procrastinate" and depth > args.procrastinate_max:
                            continue
                        try:
                            result = await cell(lib, depth, conc, args.warmup, args.window, workdir)
                        except BenchError as exc:
                            print(f"<!-- {lib} c={conc} depth={depth}: {exc} -->", flush=True)
                            continue
                        results.append(result)
                        print(row(result), flush=True)
    print(f"({(time.monotonic() - began) / 60:.1f} min)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lib", action="append", choices=LIBS, help="default: all three")
    parser.add_argument("--depth", action="append", type=int, help="default 20000, 1000000")
    parser.add_argument("--concurrency", action="append", type=int, help="default 50, 10")
    parser.add_argument("--warmup", type=float, default=5.0, help="s after the first start")
    parser.add_argument("--window", type=float, default=20.0, help="s counted")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--procrastinate-max", type=int, default=1_000_000, help="deepest Procrastinate cell"
    )
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    args.lib = args.lib or list(LIBS)
    args.depth = args.depth or [20_000, 1_000_000]
    args.concurrency = args.concurrency or [50, 10]
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
