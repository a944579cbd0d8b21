# The fault matrix (issue 32): each cell runs real `jobs-trio worker` processes on a busy
# workload while one fault is injected, waits for every job to finish, and judges the run
# (ledger.py); the table of rows is printed, and written as JSON or markdown on request.
#
#   python -m tests.faults.matrix [--cells GLOB,...] [--jobs N] [--seconds S] [--small]
#                                 [--json PATH] [--markdown PATH] [--keep]
#
# PostgreSQL cells run on a private cluster made here (never the shared server): see
# postgres_cluster.py. Exit status 1 when any cell breached the promise or failed to run.
from __future__ import annotations

import argparse
import fnmatch
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from jobs_trio._core.errors import JobsError
from jobs_trio._core.records import JobRecord
from jobs_trio.drivers._open_driver import open_driver
from tests.apps.edges_app import timed
from tests.faults import injectors as inject
from tests.faults.fleet import open_fleet
from tests.faults.injectors import Fault, Scale, Scene
from tests.faults.ledger import Row, judge, read_runs
from tests.faults.postgres_cluster import Cluster, Unavailable, private_cluster
from tests.faults.stores import (
    Store,
    postgres_as_a_role,
    postgres_store,
    sqlite_on_a_tiny_disk,
    sqlite_store,
    through_pgbouncer,
)

CONCURRENCY = 8  # per worker
GRACE = 10.0  # each worker's drain budget (--grace)


@attrs.frozen
class Cell:
    name: str
    store: str  # a key of open_store's table
    fault: Fault
    what: str
    workers: int = 3
    blockers: int = 0  # bodies that block the event loop for 3.5 leases (time.sleep)
    # The fault cuts one worker off alone, which its peers cannot tell from a dead one: its
    # jobs run again once their leases lapse, and its late results are fenced and reported
    # (docs/model.md, "A worker cut off ALONE"). A job that ran twice so is the documented
    # at-least-once, not a breach, while no run overlapped another and no drop went unsaid.
    at_least_once: bool = False


# The faults both drivers meet: one cell on each (its store filled in by _on).
BOTH = (
    Cell("sigkill", "", inject.chaos(signal.SIGKILL), "SIGKILL chaos"),
    Cell("sigterm", "", inject.chaos(signal.SIGTERM), "SIGTERM chaos"),
    Cell(
        "sigterm-twice",
        "",
        inject.chaos(signal.SIGTERM, twice=True),
        "SIGTERM chaos, 2x 5 ms apart",
    ),
    Cell("blocked-loop", "", inject.nothing, "a body blocks the loop 3.5 leases", 2, blockers=1),
)


def _on(driver: str) -> tuple[Cell, ...]:
    return tuple(attrs.evolve(c, name=f"{driver}/{c.name}", store=driver) for c in BOTH)


CELLS = (
    Cell("sqlite/write-lock", "sqlite", inject.write_lock, "write lock held 2.5 leases"),
    Cell("sqlite/disk-full", "sqlite-tiny-disk", inject.disk_full, "disk full 2.5 leases"),
    *_on("sqlite"),
    Cell("postgres/restart-fast", "postgres", inject.restart("fast"), "pg_ctl restart -m fast"),
    Cell(
        "postgres/restart-immediate",
        "postgres",
        inject.restart("immediate"),
        "pg_ctl restart -m immediate",
    ),
    Cell("postgres/stop-start", "postgres", inject.stop_then_start, "server down 2.5 leases"),
    Cell(
        "postgres/terminate-backends",
        "postgres",
        inject.terminate_backends,
        "pg_terminate_backend every 2 s",
    ),
    Cell(
        "postgres/connection-limit",
        "postgres-role",
        inject.connection_limit,
        "role CONNECTION LIMIT workers+1, sessions ended",
        at_least_once=True,
    ),
    *_on("postgres"),
    Cell(
        "pgbouncer-session/restart",
        "pgbouncer-session",
        inject.restart("fast"),
        "server restarted behind PgBouncer (session)",
    ),
    Cell(
        "pgbouncer-transaction/restart",
        "pgbouncer-transaction",
        inject.restart("fast"),
        "server restarted behind PgBouncer (transaction)",
    ),
)


def needs_postgres(cell: Cell) -> bool:
    return not cell.store.startswith("sqlite")


@asynccontextmanager
async def open_store(kind: str, folder: Path, cluster: Cluster | None) -> AsyncIterator[Store]:
    if kind == "sqlite":
        opened = sqlite_store(folder)
    elif kind == "sqlite-tiny-disk":
        opened = sqlite_on_a_tiny_disk(folder)
    elif cluster is None:
        raise Unavailable("no private PostgreSQL cluster")
    elif kind == "postgres":
        opened = postgres_store(cluster)
    elif kind == "postgres-role":
        opened = postgres_as_a_role(cluster)
    else:
        opened = through_pgbouncer(cluster, folder, kind.removeprefix("pgbouncer-"))
    async with opened as store:
        yield store


def workload(cell: Cell, scale: Scale, rng: random.Random) -> dict[float, list[dict[str, Any]]]:
    """Payloads by delay: short bodies (0.05-0.5 s) and a tenth long ones (2 leases), falling
    due across the first four fifths of the run; the blockers a third of the way in."""
    due: dict[float, list[dict[str, Any]]] = {}
    for n in range(scale.jobs):
        seconds = 2 * scale.lease if n % 10 == 0 else round(rng.uniform(0.05, 0.5), 3)
        delay = round(rng.uniform(0, 0.8 * scale.seconds) * 2) / 2  # half-second batches
        due.setdefault(delay, []).append({"seconds": seconds})
    for _ in range(cell.blockers):
        delay = round(0.35 * scale.seconds, 1)
        due.setdefault(delay, []).append({"seconds": 3.5 * scale.lease, "block": True})
    return due


async def enqueue(url: str, due: dict[float, list[dict[str, Any]]]) -> int:
    async with open_driver(url) as driver:
        for delay, payloads in sorted(due.items()):
            await timed.enqueue_many(driver, payloads, delay=delay)
    return sum(map(len, due.values()))


async def finished_count(url: str) -> int | None:
    """Completed and dead jobs, or None while the store cannot answer (a server restarting)."""
    try:
        async with open_driver(url) as driver:
            stats = await driver.stats()
    except (JobsError, OSError):
        return None
    return sum(s.depth.get("completed", 0) + s.depth.get("dead", 0) for s in stats)


async def wait_finished(url: str, total: int, within: float) -> int:
    """Wait until every job is completed or dead, or ``within`` seconds; answers how many are
    not."""
    left = total
    with trio.move_on_after(within):
        while True:
            done = await finished_count(url)
            if done is not None:
                left = total - done
                if left == 0:
                    break
            await trio.sleep(0.5)
    return left


async def read_records(url: str, total: int) -> list[JobRecord]:
    async with open_driver(url) as driver:
        return list(await driver.list_jobs(limit=total + 100))


async def run_cell(
    cell: Cell, scale: Scale, folder: Path, cluster: Cluster | None, seed: int
) -> Row:
    began = time.monotonic()
    folder.mkdir(parents=True)
    runs = folder / "runs.txt"
    rng = random.Random(f"{seed}:{cell.name}")
    options = ["--lease", f"{scale.lease:g}", "--concurrency", str(CONCURRENCY)]
    options += ["--grace", f"{GRACE:g}"]
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(open_store(cell.store, folder, cluster))
        total = await enqueue(store.url, workload(cell, scale, rng))
        fleet = await stack.enter_async_context(
            open_fleet(folder, store.workers_url, options, {"EDGES_RUNS": str(runs)})
        )
        scene = Scene(fleet, store, scale, rng)
        await fleet.started(await fleet.add(cell.workers))
        zero = time.monotonic()
        await cell.fault(scene)
        fault_over = time.monotonic() - zero
        unfinished = await wait_finished(store.url, total, max(60.0, 4 * scale.seconds))
        waited = time.monotonic() - zero
        ended = f"{unfinished} unfinished at" if unfinished else "jobs done at"
        scene.note(f"fault over at {fault_over:.1f} s, {ended} {waited:.1f} s")
        await fleet.stop(within=GRACE + 15)
        if unfinished:
            # A clean worker, with the fault over: what it cannot finish either is lost.
            scene.note(f"{unfinished} unfinished: swept by a fresh worker")
            await fleet.add()
            await wait_finished(store.url, total, 3 * scale.lease + 30)
            await fleet.stop(within=GRACE + 15)
        records = await read_records(store.url, total)
    return judge(
        cell.name,
        records,
        read_runs(runs),
        fleet.members,
        unfinished=unfinished,
        seconds=time.monotonic() - began,
        notes=scene.notes,
        at_least_once=cell.at_least_once,
    )


async def run_matrix(cells: Sequence[Cell], scale: Scale, folder: Path, seed: int) -> list[Row]:
    """The rows of ``cells``, run one after another; a SIGTERM ends the run with the rows so
    far, after the same clean-up as a finished run (workers, PgBouncer, cluster, mount)."""
    rows: list[Row] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_end_on_sigterm, nursery.cancel_scope)
        await _run_cells(cells, scale, folder, seed, rows)
        nursery.cancel_scope.cancel()
    return rows


async def _end_on_sigterm(scope: trio.CancelScope) -> None:
    # Python's default for SIGTERM ends the process at once, leaving the private cluster
    # running and the tmpfs mounted; a cancel runs every clean-up on the way out.
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            print("SIGTERM: ending the matrix after clean-up", file=sys.stderr)
            scope.cancel()


async def _run_cells(
    cells: Sequence[Cell], scale: Scale, folder: Path, seed: int, rows: list[Row]
) -> None:
    async with AsyncExitStack() as stack:
        cluster: Cluster | None = None
        why_not = ""
        if any(map(needs_postgres, cells)):
            try:
                cluster = await stack.enter_async_context(private_cluster(folder / "postgres.log"))
            except Unavailable as exc:
                why_not = str(exc)
            except (OSError, subprocess.CalledProcessError) as exc:  # initdb or pg_ctl said no
                why_not = f"cannot start a private PostgreSQL cluster: {exc!r} {_stderr(exc)}"
        for n, cell in enumerate(cells):
            print(f"[{n + 1}/{len(cells)}] {cell.name}: {cell.what} ...", file=sys.stderr)
            if needs_postgres(cell) and cluster is None:
                rows.append(Row(cell.name, skipped=why_not))
                continue
            try:
                row = await run_cell(
                    cell, scale, folder / cell.name.replace("/", "-"), cluster, seed
                )
            except Exception as exc:  # one cell's harness failure is its row, not the matrix's
                row = failed_row(cell, exc)
            rows.append(row)
            print(f"    {row_line(row)}", file=sys.stderr)


def _stderr(exc: BaseException) -> str:
    stderr = getattr(exc, "stderr", None)
    return stderr.decode(errors="replace").strip() if isinstance(stderr, bytes) else ""


def failed_row(cell: Cell, exc: Exception) -> Row:
    """A cell that could not run: skipped where it lacks something (Unavailable, even inside
    a nursery's group), else a harness error that fails the matrix."""
    leaves: list[BaseException] = [exc]
    while any(isinstance(e, BaseExceptionGroup) for e in leaves):
        leaves = [
            x for e in leaves for x in (e.exceptions if isinstance(e, BaseExceptionGroup) else [e])
        ]
    if all(isinstance(e, Unavailable) for e in leaves):
        return Row(cell.name, skipped="; ".join(map(str, leaves)))
    traceback.print_exception(exc, file=sys.stderr)
    first = leaves[0]
    return Row(cell.name, error=f"{type(first).__name__}: {first} {_stderr(first)}".strip())


COLUMNS = (
    ("cell", 30),
    ("jobs", 5),
    ("done", 5),
    ("dead", 4),
    ("unfin", 5),
    ("LOST", 4),
    ("ran2x", 5),
    ("charged", 7),
    ("killcut", 7),
    ("overlap", 9),
    ("dropped", 7),
    ("unrep", 5),
    ("exits", 22),
    ("secs", 5),
    ("verdict", 0),
)


def verdict(row: Row) -> str:
    if row.skipped:
        return f"skipped: {row.skipped}"
    breaches = row.breaches()
    return "BREACH: " + ", ".join(breaches) if breaches else "ok"


def cells_of(row: Row) -> list[str]:
    if row.skipped:
        return [row.cell, *[""] * (len(COLUMNS) - 2), verdict(row)]
    overlap = f"{row.overlaps} ({row.overlap_max:g}s)" if row.overlaps else "0"
    exits = " ".join(f"{code}:{n}" for code, n in row.exits.items())
    return [
        row.cell,
        *map(str, (row.enqueued, row.completed, row.dead, row.unfinished, row.lost)),
        *map(str, (row.ran_twice, row.charged, row.kill_cut)),
        overlap,
        *map(str, (row.dropped, row.unreported)),
        exits,
        f"{row.seconds:.0f}",
        verdict(row),
    ]


def row_line(row: Row) -> str:
    return "  ".join(
        value.ljust(width) for value, (_, width) in zip(cells_of(row), COLUMNS, strict=True)
    ).rstrip()


def table(rows: Sequence[Row]) -> str:
    header = "  ".join(name.ljust(width) for name, width in COLUMNS).rstrip()
    lines = [header, "-" * len(header), *map(row_line, rows)]
    details = [
        f"{row.cell}: " + "; ".join([*row.notes, *(f"{e}={n}" for e, n in row.events.items())])
        for row in rows
        if row.notes or row.events
    ]
    return "\n".join(lines + (["", *details] if details else []))


def markdown(rows: Sequence[Row], command: str) -> str:
    names = [name for name, _ in COLUMNS]
    lines = [
        f"Fault matrix: `{command}`",
        "",
        "| " + " | ".join(names) + " |",
        "|" + "---|" * len(names),
    ]
    lines += ["| " + " | ".join(cells_of(row)) + " |" for row in rows]
    lines += ["", "Events (WARNING and up, from the workers' logs) and notes:", ""]
    lines += [
        f"- `{row.cell}`: "
        + "; ".join([*row.notes, *(f"`{e}` x{n}" for e, n in row.events.items())])
        for row in rows
        if row.notes or row.events
    ]
    return "\n".join(lines) + "\n"


def select(patterns: str | None) -> list[Cell]:
    if not patterns:
        return list(CELLS)
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    chosen = [c for c in CELLS if any(fnmatch.fnmatchcase(c.name, p) for p in wanted)]
    if not chosen:
        names = ", ".join(c.name for c in CELLS)
        raise SystemExit(f"no cell matches {patterns!r}; the cells: {names}")
    return chosen


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.faults.matrix",
        description="Run jobs-trio workers under faults; print one row per cell.",
    )
    parser.add_argument("--cells", help="comma-separated names or globs (default: all)")
    parser.add_argument("--jobs", type=int, help="jobs per cell (default 300; --small: 60)")
    parser.add_argument(
        "--seconds", type=float, help="run length per cell (default 12; --small: 5)"
    )
    parser.add_argument("--lease", type=float, default=2.0, help="the workers' --lease")
    parser.add_argument("--small", action="store_true", help="a quick run (the smoke test's)")
    parser.add_argument("--seed", type=int, default=32, help="for the workload and the chaos")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--markdown", type=Path, help="also write the table as markdown here")
    parser.add_argument("--list", action="store_true", help="list the cells and exit")
    parser.add_argument("--keep", action="store_true", help="keep every cell's logs")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.list:
        for cell in CELLS:
            print(f"{cell.name:32} {cell.what}")
        return 0
    cells = select(args.cells)
    scale = Scale(
        jobs=args.jobs or (60 if args.small else 300),
        seconds=args.seconds or (5.0 if args.small else 12.0),
        lease=args.lease,
    )
    folder = Path(tempfile.mkdtemp(prefix="jobs-trio-faults-"))
    rows = trio.run(run_matrix, cells, scale, folder, args.seed)
    command = "python -m tests.faults.matrix " + " ".join(sys.argv[1:] if argv is None else argv)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([r.as_json() for r in rows], indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(rows, command.strip()))
    if len(rows) < len(cells):
        print(f"interrupted: {len(cells) - len(rows)} cell(s) not run", file=sys.stderr)
    failed = [r for r in rows if r.error or (not r.skipped and r.breaches())]
    if failed or args.keep:
        print(f"\nlogs and bodies' records: {folder}", file=sys.stderr)
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if failed or len(rows) < len(cells) else 0


if __name__ == "__main__":
    sys.exit(main())
