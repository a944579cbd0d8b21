# Where a worker's CPU a job goes, by component, for one tree or two side by side: py-spy samples
# of bench/worker_cpu.py's worker phase, each given to a component and scaled to the run's µs a job.
"""The worker's CPU a job by component (issue 44's table), for this tree and others.

    python bench/cpu_components.py [--jobs 30000] [--concurrency 50] [--rounds 3]
    python bench/cpu_components.py --tree before=/old/checkout --tree after=.   # alternated

Each round runs `bench/worker_cpu.py --spy FILE` once per tree (the trees alternated, each by
`PYTHONPATH=<tree>/src`): py-spy samples the worker from its open to its last job's start, on
CPU only, at `--rate` a second. A sample goes to the innermost frame that belongs to a
component (the standard library's frames and attrs' generated ones belong to the frame that
called them), and each component's share of the samples times the run's µs a job is its µs a
job; a cell is the median of the rounds. py-spy samples the thread holding the GIL (it reads
the lease lifeline's wait in `threading.Event.wait` as running), and samples of a thread
waiting in `threading` are dropped as well. PostgreSQL only: on SQLite the statements run on
the door's thread with the GIL let go, which the GIL's holder does not show, and sampling every
thread pauses the two threads' hand-off of the GIL (the rate fell from ~17,000 to 5,000 jobs/s
under it); `bench/sqlite_door.py` splits SQLite's CPU by thread instead. Needs py-spy (`pip
install py-spy`) and the right to attach to a process (root, or ptrace allowed)."""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# In the order the table prints them: the issue's own rows, with the design's fixed part (a
# task and a cancel scope per job) apart from the loop that schedules them.
TASK = "the job's task and its cancel scope (Trio)"
LOOP = "the Trio loop (scheduling, I/O, wake-ups, parking lots)"
LINE = "the INFO line"
KEEP = "per-job bookkeeping (worker, slots, drain, run scope, settler, claim loop)"
CLIENT = "claim/settle client side (driver, asyncpg, the bridge, SQLite's door)"
ATTEMPT = "judging the attempt (run_attempt, JobContext, outcome, payload)"
METRICS = "metrics"
BODY = "the no-op body itself"
OTHER = "other (start-up, the interpreter, unattributed)"
ORDER = [TASK, KEEP, CLIENT, ATTEMPT, LINE, LOOP, METRICS, BODY, OTHER]

# Trio's own code that a task and its cancel scope run (spawn, first step, exit; the scope's
# enter, deadline, close), against the scheduler's: file and qualified-name prefixes.
_TASK_CODE = (
    "CancelScope.",
    "CancelStatus.",
    "Deadlines.",
    "Nursery.start_soon",
    "Nursery._child_finished",
    "Nursery._add_exc",
    "Nursery._check_nursery_closed",
    "Runner.spawn_impl",
    "Runner.task_exited",
    "Task.",
    "coroutine_or_error",
    "_return_value_looks_like_wrong_library",
    "current_effective_deadline",
    "move_on_at",
    "fail_at",
    "_get_cancel_status",
)
# jobs_trio's files by component; a file not named here is bookkeeping (the worker's own).
_LINE_FILES = (
    "_core/log_format.py",
    "_core/logs.py",
    "_cli/logging_flags.py",
    "_cli/console.py",
    "log_format.py",
)
_ATTEMPT_FILES = (
    "_run/attempt.py",
    "_run/context.py",
    "_core/ending.py",
    "_core/run_context.py",
    "_core/tracing.py",
    "_core/boundary.py",
    "_core/render.py",
    "_run/steps.py",
)
_METRICS_FILES = ("_core/metrics.py", "_cli/collector.py", "metrics.py")
_CLIENT_PACKAGES = ("asyncpg/", "trio_asyncio/", "asyncio/", "sqlite3/")
_FRAME = re.compile(r"^(?P<name>.*) \((?P<path>[^()]*?)(?::\d+)?\)$")


def component(frame: str) -> str | None:
    """The component a py-spy raw frame (``name (path:line)``) belongs to; None for the
    standard library and generated code, which count as their caller's."""
    match = _FRAME.match(frame)
    if match is None:
        return None
    name, path = match["name"], match["path"]
    if path.startswith("jobs_trio/"):
        inner = path.removeprefix("jobs_trio/")
        if inner.startswith("drivers/"):
            return CLIENT
        if inner in _LINE_FILES:
            return LINE
        if inner in _METRICS_FILES:
            return METRICS
        if inner in _ATTEMPT_FILES:
            return ATTEMPT
        return KEEP
    if path.startswith(("trio/", "outcome/")):
        return TASK if name.startswith(_TASK_CODE) else LOOP
    if path.startswith(_CLIENT_PACKAGES):
        return CLIENT
    if path.startswith("logging/"):
        return LINE
    if path.startswith("prometheus_client/"):
        return METRICS
    if path.endswith("worker_cpu.py") and name.startswith("main.<locals>.noop"):
        return BODY
    return None


# A thread parked here is waiting, whatever py-spy says (it reads a futex wait as running).
_WAITING = re.compile(r"^(Condition\.wait|Event\.wait|Thread\.join|Queue\.get) \((threading|queue)")


def shares(raw: Path) -> dict[str, float]:
    """Each component's share of the samples in py-spy's raw output (``a;b;c count``)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or _WAITING.match(stack.rsplit(";", 1)[-1]):
            continue
        owner = next(
            (found for frame in reversed(stack.split(";")) if (found := component(frame))),
            OTHER,
        )
        counts[owner] += int(count)
    total = sum(counts.values()) or 1
    return {name: counts[name] / total for name in ORDER}


_US = re.compile(r"jobs/s, ([\d,.]+) µs CPU a job")


def one_run(tree: Path, args: argparse.Namespace) -> tuple[float, dict[str, float]]:
    """One worker_cpu.py run on ``tree``: its µs a job and its components' shares."""
    with tempfile.TemporaryDirectory() as scratch:
        raw = Path(scratch) / "spy.raw"
        env = dict(os.environ, PYTHONPATH=str(tree / "src"))
        command = [sys.executable, str(HERE / "worker_cpu.py"), "--jobs", str(args.jobs)]
        command += ["--concurrency", str(args.concurrency), "--spy", str(raw)]
        command += ["--spy-rate", str(args.rate), "--db", args.db]
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, check=False, timeout=600
        )
        found = _US.search(done.stdout)
        if done.returncode != 0 or found is None or not raw.exists():
            sys.exit(f"worker_cpu.py failed on {tree}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return float(found[1].replace(",", "")), shares(raw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=1000, help="py-spy's samples a second")
    parser.add_argument("--db", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="a checkout to measure (repeat; default: this one)",
    )
    args = parser.parse_args()
    if not args.db.startswith("postgres"):
        parser.error("PostgreSQL only (see the docstring); for SQLite: bench/sqlite_door.py")
    trees = [tuple(t.split("=", 1)) for t in args.tree] or [("this tree", str(HERE.parent))]
    totals: dict[str, list[float]] = {label: [] for label, _ in trees}
    parts: dict[str, dict[str, list[float]]] = {
        label: {name: [] for name in ORDER} for label, _ in trees
    }
    for round_ in range(1, args.rounds + 1):
        for label, path in trees:
            us, share = one_run(Path(path).resolve(), args)
            totals[label].append(us)
            for name in ORDER:
                parts[label][name].append(share[name] * us)
            print(f"round {round_}: {label} {us:.0f} µs a job", flush=True)
    labels = [label for label, _ in trees]
    print(
        f"\n| µs of CPU a job, c={args.concurrency}, {args.jobs:,} jobs | "
        + " | ".join(labels)
        + " |"
    )
    print("|---|" + "---:|" * len(labels))
    for name in ORDER:
        cells = [f"{statistics.median(parts[label][name]):.1f}" for label in labels]
        print(f"| {name} | " + " | ".join(cells) + " |")
    cells = []
    for label in labels:
        runs = " ".join(f"{us:.0f}" for us in totals[label])
        cells.append(f"**{statistics.median(totals[label]):.0f}** ({runs})")
    print("| total (runs) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
