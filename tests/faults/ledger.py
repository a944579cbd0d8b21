# The verdict of one cell: the bodies' own record of each run (tests/apps/edges_app.py's
# edge.timed writes it), the jobs as the database ended them, and what happened to each worker
# process, read together into one row. Apart because it is the matrix's only judge.
from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from jobs_trio._core.records import JobRecord, JobState
from tests.faults.fleet import Member

# Lines that report a finished body's ending as not written, naming the job.
REPORTS = (
    "jobs.worker.settle-abandoned",
    "jobs.worker.drain-abandoned",
    "jobs.settle.fenced",
    "jobs.worker.loop-wedged",
)
# An exit code that says "results were abandoned, see the log" (docs/shutdown.md).
ABANDONED_EXIT = 70
_LINE = re.compile(r"^\S+ \S+ (?P<level>[A-Z]+) [^:]+: (?P<event>jobs\.\S+)")


@attrs.frozen
class Run:
    """One body of one job: when it started and ended (None: never recorded), how it ended."""

    job_id: str
    run: str  # "<pid>:<attempt>:<random>", what the body returned
    pid: int
    start: float
    end: float | None
    how: str  # "return", "unwound", or "cut" (no end recorded: its process ended)


def read_runs(path: Path) -> list[Run]:
    if not path.exists():
        return []
    seen: dict[str, dict[str, float]] = defaultdict(dict)
    jobs: dict[str, str] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) != 4:
            continue  # a line torn by a kill mid-write
        job_id, what, run, at = parts
        seen[run][what] = float(at)
        jobs[run] = job_id
    runs = []
    for run, marks in seen.items():
        how = "return" if "return" in marks else "unwound" if "unwound" in marks else "cut"
        end = marks.get("return", marks.get("unwound"))
        start = marks.get("start", end if end is not None else 0.0)
        runs.append(Run(jobs[run], run, int(run.split(":")[0]), start, end, how))
    return runs


@attrs.frozen
class Row:
    cell: str
    enqueued: int = 0
    completed: int = 0
    dead: int = 0
    unfinished: int = 0  # neither completed nor dead when the cell's wait ended
    lost: int = 0  # still not finished after a clean worker swept for them
    ran_twice: int = 0  # jobs whose body returned more than once
    charged: int = 0  # attempts beyond 1 not explained by a SIGKILL of a worker running it
    kill_cut: int = 0  # bodies cut short by a SIGKILL of their worker (each costs an attempt)
    overlaps: int = 0  # jobs with two bodies running at once in different processes
    overlap_max: float = 0.0  # seconds, the longest such overlap
    dropped: int = 0  # bodies that returned but whose result is not the one stored
    unreported: int = 0  # of those, dropped with no line naming the job and no exit 70
    exits: Mapping[str, int] = attrs.Factory(dict)  # exit code ("hung" too) -> processes
    events: Mapping[str, int] = attrs.Factory(dict)  # WARNING/ERROR log events -> count
    seconds: float = 0.0
    skipped: str | None = None
    error: str | None = None  # the harness itself failed in this cell
    notes: Sequence[str] = ()
    at_least_once: bool = False  # the cell's documented at-least-once (matrix.Cell)

    def breaches(self) -> list[str]:
        """What broke the worker's promise in this cell (empty: it held)."""
        found = ["harness error"] if self.error else []
        expected = self.at_least_once and not (self.overlaps or self.unreported)
        for name in ("lost", "ran_twice", "charged", "overlaps", "unreported", "unfinished"):
            if getattr(self, name) and not (name == "ran_twice" and expected):
                found.append(name.replace("_", " "))
        if self.exits.get("hung"):
            found.append("hung")
        return found

    def as_json(self) -> dict[str, object]:
        return {**attrs.asdict(self), "breaches": self.breaches()}


def _events(log: str) -> Counter[str]:
    counted: Counter[str] = Counter()
    for line in log.splitlines():
        match = _LINE.match(line)
        if match and match["level"] in ("WARNING", "ERROR", "CRITICAL"):
            counted[match["event"]] += 1
        elif line.startswith("Traceback"):
            counted["Traceback"] += 1
    return counted


def _reported(job_id: str, member: Member | None) -> bool:
    if member is None:
        return False
    if member.code == ABANDONED_EXIT:
        return True
    return any(
        event in line and job_id in line for line in member.log().splitlines() for event in REPORTS
    )


def _interval(run: Run, member: Member | None) -> tuple[float, float]:
    """When the body ran; one that recorded no end ran until its process ended."""
    if run.end is not None:
        return run.start, run.end
    ended = member.ended_at if member and member.ended_at else float("inf")
    return run.start, ended


def judge(
    cell: str,
    records: Iterable[JobRecord],
    runs: Sequence[Run],
    members: Sequence[Member],
    *,
    unfinished: int,
    seconds: float,
    notes: Sequence[str] = (),
    at_least_once: bool = False,
) -> Row:
    by_pid = {m.pid: m for m in members}
    runs_of: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        runs_of[run.job_id].append(run)
    states: Counter[JobState] = Counter()
    ran_twice = charged = kill_cut = overlaps = dropped = unreported = 0
    overlap_max = 0.0
    enqueued = 0
    for record in records:
        enqueued += 1
        states[record.state] += 1
        mine = runs_of.get(record.id, [])
        if sum(run.how == "return" for run in mine) > 1:
            ran_twice += 1
        cut = 0
        for run in mine:
            member = by_pid.get(run.pid)
            killed = member.killed_at() if member else None
            if run.how == "cut" and killed is not None:
                cut += 1
        kill_cut += cut
        charged += max(record.attempts - 1 - cut, 0)
        stored = record.result
        for run in mine:
            if run.how != "return" or run.run == stored:
                continue
            dropped += 1
            member = by_pid.get(run.pid)
            killed = member.killed_at() if member else None
            # A process SIGKILLed after its body returned could not say a word: not counted.
            silenced = killed is not None and run.end is not None and killed >= run.end
            if not silenced and not _reported(record.id, member):
                unreported += 1
        longest = 0.0
        for i, a in enumerate(mine):
            for b in mine[i + 1 :]:
                a0, a1 = _interval(a, by_pid.get(a.pid))
                b0, b1 = _interval(b, by_pid.get(b.pid))
                longest = max(longest, min(a1, b1) - max(a0, b0))
        if longest > 0:
            overlaps += 1
            overlap_max = max(overlap_max, longest)
    finished = states[JobState.COMPLETED] + states[JobState.DEAD]
    exits: Counter[str] = Counter("hung" if m.hung else str(m.code) for m in members)
    events: Counter[str] = Counter()
    for member in members:
        events += _events(member.log())
    return Row(
        cell=cell,
        enqueued=enqueued,
        completed=states[JobState.COMPLETED],
        dead=states[JobState.DEAD],
        unfinished=unfinished,
        lost=enqueued - finished,
        ran_twice=ran_twice,
        charged=charged,
        kill_cut=kill_cut,
        overlaps=overlaps,
        overlap_max=round(overlap_max, 3),
        dropped=dropped,
        unreported=unreported,
        exits=dict(sorted(exits.items())),
        events=dict(sorted(events.items())),
        seconds=round(seconds, 1),
        notes=tuple(notes),
        at_least_once=at_least_once,
    )
