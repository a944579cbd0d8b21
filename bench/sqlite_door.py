# How a SQLite worker's two threads share the GIL: the door's transactions (its thread) and the
# worker's loop (the main thread). Apart from worker_cpu.py because it times the door's inside.
"""When the SQLite door works, and when the worker's loop waits for it (issue 44).

    python bench/sqlite_door.py [--jobs 40000] [--concurrency 10]

Runs bench/worker_cpu.py's worker on a fresh SQLite file with the door timed from inside:
each call's wait for its thread (from the call until the thread runs it: the GIL, while the
loop runs jobs), its transaction (BEGIN to COMMIT, in the thread) and the thread's CPU in it;
and the loop's waits for I/O (Trio's before/after_io_wait: the loop had nothing to run).
Prints the share of the run the door spent in transactions, the share the loop spent idle,
and the share both did at once: a door that works only while the loop idles (both near the
door's share) is serial with it, and the worker's rate is then one over the sum of the two
threads' CPU a job, whatever either does in parallel in principle."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import worker_cpu  # noqa: E402  (bench/ on the path first)

import jobs_trio  # noqa: E402
from jobs_trio.drivers import _sqlite_door as door  # noqa: E402

Interval = tuple[float, float]


class _Watch(trio.abc.Instrument):
    """The loop's waits for I/O that really waited (a timeout above 0)."""

    def __init__(self) -> None:
        self.idle: list[Interval] = []
        self._since = 0.0

    def before_io_wait(self, timeout: float) -> None:
        self._since = time.perf_counter()

    def after_io_wait(self, timeout: float) -> None:
        if timeout > 0:
            self.idle.append((self._since, time.perf_counter()))


def _overlap(a: list[Interval], b: list[Interval]) -> float:
    """Seconds that intervals of ``a`` and of ``b`` (each sorted, none overlapping its own
    list's others) share."""
    shared, j = 0.0, 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            shared += max(0.0, min(end, b[k][1]) - max(start, b[k][0]))
            k += 1
    return shared


def _timed_door() -> tuple[list[Interval], dict[str, list[float]]]:
    """Wrap the door's thread side and its call (module functions and a method, for the
    length of this process): the transactions' intervals, and per call its phases."""
    transactions: list[Interval] = []
    phases: dict[str, list[float]] = defaultdict(list)
    run_transaction: Callable[..., Any] = door._run_transaction
    in_thread: Callable[..., Any] = door._in_thread
    run_in_thread = door.SqliteDoor._run_in_thread
    started: list[float] = [0.0]

    def thread_side(*args: Any) -> Any:
        started[0] = time.perf_counter()
        return in_thread(*args)

    def transaction(*args: Any) -> Any:
        begun, cpu = time.perf_counter(), time.thread_time()
        try:
            return run_transaction(*args)
        finally:
            transactions.append((begun, time.perf_counter()))
            phases["thread_cpu"].append(time.thread_time() - cpu)

    async def call(self: door.SqliteDoor, work: Any, mode: door.Mode) -> Any:
        sent = time.perf_counter()
        answer = await run_in_thread(self, work, mode)
        phases["wait"].append(started[0] - sent)
        phases["transaction"].append(transactions[-1][1] - transactions[-1][0])
        return answer

    door._in_thread = thread_side
    door._run_transaction = transaction
    door.SqliteDoor._run_in_thread = call  # type: ignore[method-assign]
    return transactions, phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--concurrency", type=int, default=10)
    args = parser.parse_args()
    transactions, phases = _timed_door()
    watch = _Watch()
    opened = jobs_trio.open_worker
    seen: dict[str, float] = {}

    @contextlib.asynccontextmanager
    async def watched(*a: Any, **kw: Any) -> AsyncIterator[Any]:
        trio.lowlevel.add_instrument(watch)
        transactions.clear()
        phases.clear()
        began, loop_cpu = time.perf_counter(), time.thread_time()
        async with opened(*a, **kw) as worker:
            try:
                yield worker
            finally:
                seen["wall"] = time.perf_counter() - began
                seen["loop_cpu"] = time.thread_time() - loop_cpu
                seen["began"] = began

    jobs_trio.open_worker = watched
    with tempfile.TemporaryDirectory(prefix="bench_sqlite_door_") as folder:
        url = f"sqlite:///{os.path.join(folder, 'door.db')}"
        options = argparse.Namespace(
            db=url, jobs=args.jobs, concurrency=args.concurrency, profile=None, ahead=None, spy=None
        )
        worker_cpu.configure_logging(argparse.Namespace(log_level="info", log_format="text"))
        trio.run(worker_cpu.main, options)
    wall, jobs = seen["wall"], args.jobs
    ran = [t for t in transactions if t[0] >= seen["began"]]
    busy = sum(end - start for start, end in ran)
    idle = sum(end - start for start, end in watch.idle)
    both = _overlap(ran, watch.idle)
    calls = len(phases["wait"]) or 1
    print(
        f"sqlite c={args.concurrency} {jobs / wall:,.0f} jobs/s: door in a transaction"
        f" {busy / wall:.0%} of the run, loop idle {idle / wall:.0%}, both {both / wall:.0%}"
    )
    print(
        f"CPU a job: door thread {sum(phases['thread_cpu']) / jobs * 1e6:,.1f} µs"
        f" (in transactions), loop thread {seen['loop_cpu'] / jobs * 1e6:,.1f} µs"
    )
    print(
        f"a door call ({calls:,} calls, {jobs / calls:,.0f} jobs each): waited for its thread"
        f" {sum(phases['wait']) / calls * 1e3:.2f} ms, in its transaction"
        f" {sum(phases['transaction']) / calls * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()
