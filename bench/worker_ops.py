# Python bytecode steps a job, by function, while bench/worker_cpu.py's worker runs (or the floor's
# loop). Apart from worker_instructions.py because it names WHICH function does the work: callgrind
# sees only the interpreter's C, and cProfile's own cost per call hides what a call costs.
"""Bytecode steps a job, by function, counted with sys.settrace while a worker runs.

    python bench/worker_ops.py [--jobs 3000] [--concurrency 50] [--top 40] [--db URL]
    python bench/worker_ops.py --floor ...    # bench/floor_worker.py's loop instead
    PYTHONPATH=/old/tree/src python bench/worker_ops.py ...   # another tree's

Every opcode the interpreter runs in a Python frame while the worker is open (worker_cpu.py's
worker, counted from its open to its last job's start) or while floor_worker.py's loop runs,
divided by the jobs: the same tree reads within a few per cent run to run (batch sizes follow
timing). Work in C (a dict lookup, a float's format, asyncpg's protocol) counts as the one
step that called it, so a step is not an instruction: decide a change on
worker_instructions.py, and find where to look with this. About 60x slower than running it."""

from __future__ import annotations

import argparse
import collections
import contextlib
import runpy
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

HERE = Path(__file__).resolve().parent


class _Count:
    """Opcodes by code object, while on."""

    def __init__(self) -> None:
        self.steps: collections.Counter[CodeType] = collections.Counter()

    def frame(self, frame: FrameType, event: str, arg: object) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        steps, code = self.steps, frame.f_code

        def step(frame: FrameType, event: str, arg: object) -> Any:
            if event == "opcode":
                steps[code] += 1
            return step

        return step


def _where(code: CodeType) -> str:
    path = code.co_filename
    if "/lib/python3" in path and "site-packages/" not in path:
        path = path.split("/lib/python3", 1)[1].split("/", 1)[1]  # the stdlib's
    for cut in ("/src/", "site-packages/", str(HERE.parent) + "/"):
        if cut in path:
            path = path.split(cut, 1)[1]
            break
    return f"{path}:{code.co_firstlineno} {code.co_name}"


def _group(code: CodeType) -> str:
    path = code.co_filename
    for name in ("jobs_trio", "trio", "asyncpg", "floor_worker", "worker_cpu"):
        if f"/{name}/" in path or path.endswith(f"/{name}.py"):
            return name
    return "other (stdlib, attrs' generated code)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--top", type=int, default=40, help="functions listed")
    parser.add_argument("--db", default=None, help="as worker_cpu.py's (default: its own)")
    parser.add_argument("--floor", action="store_true", help="floor_worker.py's loop instead")
    args = parser.parse_args()
    count = _Count()
    sys.path.insert(0, str(HERE))
    script = HERE / ("floor_worker.py" if args.floor else "worker_cpu.py")
    argv = [str(script), "--jobs", str(args.jobs), "--concurrency", str(args.concurrency)]
    if args.db:
        argv += ["--db", args.db]
    if args.floor:
        import floor_worker

        inner = floor_worker._floor

        async def counted_floor(driver: Any, options: argparse.Namespace) -> None:
            sys.settrace(count.frame)
            try:
                await inner(driver, options)
            finally:
                sys.settrace(None)

        floor_worker._floor = counted_floor  # type: ignore[assignment]
        # Run as the module imported here (its patched _floor), not a fresh __main__.
        sys.argv = argv
        floor_worker.run_from_command_line()
    else:
        import jobs_trio

        opened = jobs_trio.open_worker

        @contextlib.asynccontextmanager
        async def counted(*a: Any, **k: Any) -> AsyncIterator[Any]:
            sys.settrace(count.frame)
            try:
                async with opened(*a, **k) as worker:
                    yield worker
            finally:
                sys.settrace(None)

        jobs_trio.open_worker = counted  # type: ignore[assignment]
        sys.argv = argv
        runpy.run_path(str(script), run_name="__main__")
    steps = count.steps
    groups: collections.Counter[str] = collections.Counter()
    for code, n in steps.items():
        groups[_group(code)] += n
    what = "floor" if args.floor else "worker"
    print(f"{what} c={args.concurrency} {sum(steps.values()) / args.jobs:,.0f} steps a job")
    for name, n in groups.most_common():
        print(f"  {n / args.jobs:8.1f}  {name}")
    for code, n in steps.most_common(args.top):
        print(f"{n / args.jobs:8.1f}  {_where(code)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
