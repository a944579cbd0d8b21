# Issue 44's CPU targets read in one command: the floor and the six worker readings, alternated,
# each as a user runs its script. Apart because one reading moves by a quarter with the host.
"""Issue 44's CPU-a-job targets, each read ``--reps`` times in alternation, with the floor.

    python bench/cpu_targets.py [--reps 3] [--jobs 30000] [--db URL]

A round runs, one after the other as their own processes: ``bench/floor_worker.py``
(concurrency 50), ``bench/worker_cpu.py`` at concurrency 50 and 10 on PostgreSQL and at 10 on
a fresh SQLite file, then ``bench/cli_worker_cpu.py`` (a ``jobs-trio worker`` process) the same
three ways. It prints each reading as its round ends, then every reading's median against its
target, and the worker's c=50 over the floor read in the same round: on this shared host one
reading of a script moves by a quarter from one minute to the next (another process on the
other core is enough), and alternating puts every reading of a round in the same minute."""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import attrs

HERE = Path(__file__).resolve().parent
POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
FIGURE = re.compile(r"([0-9][0-9,]*) µs CPU a job")


@attrs.frozen
class Reading:
    """One script run of a round: its arguments past ``--db`` and ``--jobs``, and its target (µs
    of CPU a job; None for the floor)."""

    name: str
    script: str
    args: tuple[str, ...]
    sqlite: bool = False
    target: float | None = None


READINGS = (
    Reading("floor c=50", "floor_worker.py", ("--concurrency", "50")),
    Reading("worker c=50", "worker_cpu.py", ("--concurrency", "50"), target=45),
    Reading("worker c=10", "worker_cpu.py", ("--concurrency", "10"), target=50),
    Reading("worker SQLite c=10", "worker_cpu.py", ("--concurrency", "10"), True, 110),
    Reading("CLI c=50", "cli_worker_cpu.py", ("--concurrency", "50"), target=50),
    Reading("CLI c=10", "cli_worker_cpu.py", ("--concurrency", "10"), target=50),
    Reading("CLI SQLite c=10", "cli_worker_cpu.py", ("--concurrency", "10"), True, 120),
)


def read(reading: Reading, db: str, jobs: int, extra: Sequence[str], folder: str) -> float:
    """Run ``reading``'s script once; its µs of CPU a job."""
    if reading.sqlite:
        # A fresh file each time: a file a run left behind holds its finished jobs.
        db = f"sqlite:///{tempfile.mkdtemp(dir=folder)}/targets.db"
    command = [
        sys.executable,
        str(HERE / reading.script),
        "--db",
        db,
        "--jobs",
        str(jobs),
        *reading.args,
    ]
    if reading.script == "cli_worker_cpu.py":
        command += extra
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = FIGURE.findall(done.stdout)
    if done.returncode != 0 or not found:
        sys.exit(
            f"{reading.name}: {' '.join(command)} exited {done.returncode} without its figure:\n"
            f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return float(found[-1].replace(",", ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="rounds, each reading once")
    parser.add_argument("--jobs", type=int, default=30000, help="jobs a reading")
    parser.add_argument("--db", default=POSTGRES, help="the PostgreSQL readings' database")
    parser.add_argument(
        "--due-in", default=None, help="passed to cli_worker_cpu.py (its jobs' wait to fall due)"
    )
    args = parser.parse_args()
    extra = ["--due-in", args.due_in] if args.due_in is not None else []
    found: dict[str, list[float]] = {reading.name: [] for reading in READINGS}
    with tempfile.TemporaryDirectory(prefix="bench_cpu_targets_") as folder:
        for rep in range(1, args.reps + 1):
            for reading in READINGS:
                found[reading.name].append(read(reading, args.db, args.jobs, extra, folder))
            print(
                f"round {rep}: "
                + ", ".join(f"{name} {values[-1]:.0f}" for name, values in found.items()),
                flush=True,
            )
    print(f"\n| µs of CPU a job, {args.jobs:,} jobs | readings | median | target |")
    print("|---|---|---:|---|")
    for reading in READINGS:
        values = found[reading.name]
        median = statistics.median(values)
        if reading.target is None:
            verdict = ""
        else:
            verdict = f"≤ {reading.target:.0f}, {'met' if median <= reading.target else 'missed'}"
        shown = " ".join(f"{v:.0f}" for v in values)
        print(f"| {reading.name} | {shown} | {median:.1f} | {verdict} |")
    ratios = [w / f for w, f in zip(found["worker c=50"], found["floor c=50"], strict=True)]
    print(
        "worker c=50 over the floor in the same round: "
        + " ".join(f"{r:.2f}" for r in ratios)
        + f" (median {statistics.median(ratios):.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
