# Instructions a worker executes a job, counted by valgrind's callgrind while bench/worker_cpu.py's
# worker runs. Apart from worker_cpu.py because its figure is a count, not a time: the same tree
# gives the same count within ~0.5% whatever else this shared host does (issue 44).
"""Instructions a job, counted by callgrind while the worker of bench/worker_cpu.py runs.

    python bench/worker_instructions.py [--jobs 6000] [--concurrency 50] [--db URL]
    python bench/worker_instructions.py --floor ...   # bench/floor_worker.py's loop instead
    PYTHONPATH=/old/tree/src python bench/worker_instructions.py ...   # another tree's

bench/worker_cpu.py's CPU a job drifts ±6 µs between runs of the same tree on this machine (a
host lent to others): more than most changes to a worker's per-job work. This runs the same
script under ``valgrind --tool=callgrind`` with instrumentation off until its worker opens and
dumped as its last job starts (a client request, compiled here from valgrind's callgrind.h:
gcc and valgrind needed), and prints that count a job: the same tree twice reads within
~0.5%. The worker's own start (connections, tasks) is in it: ~60M instructions, 10k a job at
6,000. Instructions are not time: memory stalls (the garbage collector's scans) count little
here, so GC is measured apart (gc.callbacks). ~50x slower than running it: 6,000 jobs take
about 30 s."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The client requests: instrumentation on (counts zeroed) as the worker opens, off and dumped
# once its last job has started.
REQUESTS = """#include <valgrind/callgrind.h>
void on(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void off(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT("worker"); }
"""

# Run inside valgrind: worker_cpu.py as its __main__, with jobs_trio.open_worker wrapped so the
# count covers exactly its worker (worker_cpu.py reads jobs_trio.open_worker when it opens one).
RUNNER = """import contextlib, ctypes, runpy, sys
import jobs_trio

requests = ctypes.CDLL(sys.argv[1])
opened = jobs_trio.open_worker


@contextlib.asynccontextmanager
async def counted(*args, **kwargs):
    requests.on()
    async with opened(*args, **kwargs) as worker:
        try:
            yield worker
        finally:
            requests.off()


jobs_trio.open_worker = counted
script = sys.argv[2]
sys.argv = sys.argv[2:]
sys.path.insert(0, str(__import__("pathlib").Path(script).parent))
if script.endswith("floor_worker.py"):
    # The floor's loop counted instead, as worker_ops.py --floor counts it: run as the module
    # imported here (its _floor wrapped), not a fresh __main__.
    import floor_worker

    inner = floor_worker._floor

    async def counted_floor(driver, options):
        requests.on()
        try:
            await inner(driver, options)
        finally:
            requests.off()

    floor_worker._floor = counted_floor
    floor_worker.run_from_command_line()
else:
    runpy.run_path(script, run_name="__main__")
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=6000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--db", default=None, help="as worker_cpu.py's (default: its own)")
    parser.add_argument("--floor", action="store_true", help="floor_worker.py's loop instead")
    args = parser.parse_args()
    missing = [tool for tool in ("valgrind", "gcc") if shutil.which(tool) is None]
    header = Path("/usr/include/valgrind/callgrind.h")
    if missing or not header.exists():
        print(
            "worker_instructions: needs valgrind, its headers and gcc"
            f" (missing: {', '.join(missing) or header}); nothing measured"
        )
        return 0
    with tempfile.TemporaryDirectory(prefix="bench_instructions_") as folder:
        work = Path(folder)
        (work / "requests.c").write_text(REQUESTS)
        library = work / "requests.so"
        subprocess.run(
            ["gcc", "-O2", "-shared", "-fPIC", "-o", library, work / "requests.c"], check=True
        )
        (work / "runner.py").write_text(RUNNER)
        script = "floor_worker.py" if args.floor else "worker_cpu.py"
        worker_cpu = [str(HERE / script), "--jobs", str(args.jobs)]
        worker_cpu += ["--concurrency", str(args.concurrency)]
        if args.db:
            worker_cpu += ["--db", args.db]
        run = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={work / 'out.%p'}",
                sys.executable,
                str(work / "runner.py"),
                str(library),
                *worker_cpu,
            ],
            capture_output=True,
            text=True,
        )
        dumps = [
            path.read_text() for path in work.glob("out.*") if "Client Request" in path.read_text()
        ]
        if run.returncode != 0 or len(dumps) != 1:
            print(run.stdout[-2000:], run.stderr[-4000:], file=sys.stderr)
            raise SystemExit(f"{script} under valgrind failed (exit {run.returncode})")
        found = re.search(r"^totals: (\d+)", dumps[0], re.MULTILINE)
        assert found, "callgrind's dump has no totals line"
        total = int(found.group(1))
        import jobs_trio  # the tree measured: where its PYTHONPATH found it

        print(
            f"{'floor ' if args.floor else ''}c={args.concurrency}"
            f" {total / args.jobs:,.0f} instructions a job"
            f" ({args.jobs:,} jobs, {total:,} in the worker; {jobs_trio.__file__})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
