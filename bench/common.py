# What every library adapter shares: its command line, and the marks its job handler writes (and
# what the scripts measuring one database share: reading CPU, running their setup's SQL). Apart
# so the three adapters differ only in how each library enqueues and runs a worker.
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

JOB = "bench.job"  # the one job name every library registers
QUEUE = "bench"  # the queue it goes to, where a library has queues


def process_cpu(pid: int) -> float | None:
    """Seconds of CPU (user + system) process ``pid`` has spent, or None where /proc cannot
    tell (another OS, a process already gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            rest = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")  # fields 14 and 15


def postgres_cpu_by_pid() -> dict[int, float]:
    """Seconds of CPU each process named ``postgres`` alive now has spent, by pid (empty where
    /proc cannot tell)."""
    spent: dict[int, float] = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return spent
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as comm:
                if comm.read().strip() != "postgres":
                    continue
        except OSError:
            continue  # ended meanwhile, or not ours to read
        cpu = process_cpu(pid)
        if cpu is not None:
            spent[pid] = cpu
    return spent


def postgres_spent(before: dict[int, float], after: dict[int, float]) -> float | None:
    """The server's CPU between two ``postgres_cpu_by_pid`` reads: what each process alive at
    the second read spent since the first (all of it, for one that started between them). A
    process that ended between them is left out, where a difference of two sums would subtract
    all it had spent (another workload's backend closing: a negative figure on a busy server)."""
    if not after:
        return None
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def postgres_cpu() -> float | None:
    """Seconds of CPU spent so far by the processes named ``postgres`` that are alive now (the
    server's backends and helpers: the local server's share of a workload), or None where
    /proc cannot tell. A backend that ends between two reads takes its share with it."""
    spent = postgres_cpu_by_pid()
    return sum(spent.values()) if spent else None


@contextlib.contextmanager
def own_database(admin: str, name: str) -> Iterator[str]:
    """The URL of a fresh database on the server ``admin`` names (``name`` and this process's
    id), dropped on the way out."""
    db = f"{name}_{os.getpid()}"
    subprocess.run(["psql", admin, "-qc", f"DROP DATABASE IF EXISTS {db}"], check=True)
    subprocess.run(["psql", admin, "-qc", f"CREATE DATABASE {db}"], check=True)
    try:
        yield f"{admin}/{db}"
    finally:
        subprocess.run(["psql", admin, "-qc", f"DROP DATABASE IF EXISTS {db}"], check=True)


async def pg_execute(url: str, *statements: tuple[str, tuple[object, ...]]) -> None:
    """A script's setup (a fill of a million rows, a VACUUM): ``statements`` in order, on a
    connection of their own, each given an hour."""
    import asyncpg
    import trio_asyncio

    async def run() -> None:
        conn = await asyncpg.connect(url)
        try:
            for sql, args in statements:
                await conn.execute(sql, *args, timeout=3600)
        finally:
            await conn.close()

    async with trio_asyncio.open_loop():
        await trio_asyncio.aio_as_trio(run)()


class CollectorTime:
    """The process CPU Python's garbage collector spends while it is open (``with``), and its
    collections by generation: a reading of worker_cpu.py's or floor_worker.py's per-job CPU
    includes it, and callgrind's instructions count little of it (its scans stall on memory).
    What a collection costs follows what is alive at it, so it tells where objects a job live
    longer than the floor's (issue 44)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._began = 0.0

    def _heard(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.process_time()
        else:
            self.seconds += time.process_time() - self._began
            self.collections[info["generation"]] += 1

    def __enter__(self) -> CollectorTime:
        gc.callbacks.append(self._heard)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._heard)

    def per_job(self, jobs: int) -> str:
        """``GC 2.6 µs a job (collections 140/13/1)``: by generation, young to old."""
        by_generation = "/".join(str(n) for n in self.collections)
        return f"GC {self.seconds / jobs * 1e6:.1f} µs a job (collections {by_generation})"


class Marks:
    """What a handler tells the orchestrator, as lines appended to a file (one write(2) each,
    O_APPEND). ``noop`` writes one line, at the first job's start (wall clock: the end of the
    run is read from the database's own timestamps). ``latency`` writes ``i monotonic`` per
    job; ``sleep`` writes ``start monotonic`` per attempt. ``probe`` (latency under load) is
    ``latency`` for the jobs whose payload has ``i`` and silent for the load's own jobs.
    ``flaky`` (retries) is ``noop`` plus a ``fail i`` line for each job made to fail: its first
    attempt, when its payload has ``fail`` (the set is this process's: one worker runs them
    all). CLOCK_MONOTONIC is system-wide on Linux, so the orchestrator compares it with its
    own."""

    def __init__(self, path: str, kind: str) -> None:
        self.kind = kind
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._first_seen = False
        self._failed: set[int] = set()

    def started(self, payload: dict[str, Any]) -> float:
        """Call at the handler's first line; answers how long the job should sleep (0: none).
        Raises :class:`Flaky` for a job of a ``flaky`` run that is to fail this attempt."""
        if self.kind in ("noop", "flaky", "steps"):
            if not self._first_seen:
                self._first_seen = True
                os.write(self._fd, f"first {time.time()!r}\n".encode())
            fail = payload.get("fail")
            if self.kind == "flaky" and fail is not None and fail not in self._failed:
                self._failed.add(fail)
                os.write(self._fd, f"fail {fail}\n".encode())
                raise Flaky(f"job {fail} fails its first attempt (bench retries)")
            return 0.0
        if self.kind == "latency" or (self.kind == "probe" and "i" in payload):
            os.write(self._fd, f"{payload['i']} {time.monotonic()!r}\n".encode())
            return 0.0
        if self.kind == "probe":
            return 0.0
        os.write(self._fd, f"start {time.monotonic()!r}\n".encode())
        return float(payload.get("sleep", 0.0))


class Flaky(Exception):
    """A job's planned failure (retries workload): every library retries it."""


def payloads(n: int, sleep: float, fail_every: int) -> list[dict[str, Any]]:
    """The batch's payloads: ``{"fail": i}`` for every ``fail_every``-th job (0: none)."""
    base: dict[str, Any] = {"sleep": sleep} if sleep else {}
    return [
        {**base, "fail": i} if fail_every and i % fail_every == 0 else dict(base) for i in range(n)
    ]


def read_order() -> int | None:
    """The load generator's next order from the orchestrator: one batch size per stdin line;
    None once stdin closes. Blocking: the adapters read it in a thread."""
    line = sys.stdin.readline()
    return int(line) if line.strip() else None


def done_order() -> None:
    sys.stdout.write("ok\n")
    sys.stdout.flush()


def ready() -> None:
    """The worker is up (start-up done): the orchestrator starts its clocks after this line."""
    sys.stdout.write("ready\n")
    sys.stdout.flush()


def emit(result: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="one library's side of bench/run.py")
    sub = parser.add_subparsers(dest="command", required=True)
    enqueue = sub.add_parser("enqueue", help="enqueue N jobs in one batch")
    enqueue.add_argument("--db", required=True)
    enqueue.add_argument("--n", type=int, required=True)
    enqueue.add_argument("--sleep", type=float, default=0.0, help="each job awaits this long")
    enqueue.add_argument("--install", action="store_true", help="install the schema first")
    enqueue.add_argument("--fail-every", type=int, default=0, help="retries: every Nth fails once")
    worker = sub.add_parser("worker", help="run one worker until SIGTERM")
    worker.add_argument("--db", required=True)
    worker.add_argument("--concurrency", type=int, required=True)
    worker.add_argument(
        "--kind", choices=("noop", "latency", "sleep", "probe", "flaky", "steps"), required=True
    )
    worker.add_argument("--mark", required=True)
    latency = sub.add_parser("latency", help="enqueue N jobs one at a time, GAP apart")
    latency.add_argument("--db", required=True)
    latency.add_argument("--n", type=int, required=True)
    latency.add_argument("--gap", type=float, required=True)
    load = sub.add_parser("load", help="enqueue a batch per stdin line (its size), say ok")
    load.add_argument("--db", required=True)
    return parser.parse_args(argv)


def dispatch(args: argparse.Namespace, commands: dict[str, Callable[[argparse.Namespace], Any]]):
    return commands[args.command](args)
