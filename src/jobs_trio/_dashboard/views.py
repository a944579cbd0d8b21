# What each dashboard page shows, read from a Driver: the overview (queues, charts, job names,
# workers, cron tasks, the outbox), a filtered and paged job list, one job with its attempts and
# steps, and the jobs a bulk action takes. Apart from the web app so the pages are plain values a
# test can check without HTTP.
from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

from .._core.errors import InvalidArgument
from .._core.operator_transitions import (
    CANCELLABLE_STATES,
    DELETABLE_STATES,
    RETRYABLE_STATES,
    Bulk,
)
from .._core.records import (
    AttemptRecord,
    JobRecord,
    JobState,
    NameStats,
    OutboxStats,
    QueuePause,
    QueueStats,
    StepRecord,
    WorkerPresence,
)
from .._core.render import visible
from .._cron.tasks import next_fire_of
from .._jobs.pausing import Unconfirmed, unheard
from .._jobs.registry import Registry
from ..drivers.contract import Driver

READY, RUNNING, SUSPENDED = JobState.READY, JobState.RUNNING, JobState.SUSPENDED
PAGE_SIZE = 50
# The job list pages by reading the newest N jobs through `Driver.list_jobs` (which has no
# offset and no prefix filter) and slicing here: the deepest page and a name filter see only
# this many of the newest jobs. The page says so rather than pretending the list is complete.
SCAN_LIMIT = 5_000
# The queues page lists at most this many queues, the busiest first, and says how many it left
# out (a filter by name finds the rest): with one row per queue, 10,000 queues made it 16.9 MB
# and 11.5 s (a throughput read per queue).
MAX_QUEUE_ROWS = 100
# The charts: attempts ended per minute over the last hour, from the attempt history (one read,
# Driver.outcome_counts, whatever the number of queues).
CHART_MINUTES = 60
FAILED_OUTCOMES = ("retried", "dead-lettered")
# Job names on the overview, from the same hour of attempts: the most failing first, then the
# busiest; a fleet of thousands of names shows these many.
MAX_NAME_ROWS = 50
# The paused queues whose workers' confirmations the overview reads (one read each): pauses are
# an operator's few, and past this many the rest are listed without.
MAX_PAUSES_CHECKED = 20
# The most jobs one bulk action takes from a filter (the CLI's bound: run it again for more).
BULK_LIMIT = 1000

# Text a filter may hold: no control or format characters (an ESC, a NUL, a bidi override), so
# what a filter box shows back is exactly what was typed and can be typed again.
_FILTER_FIELDS = ("queue", "name")


@attrs.frozen
class Chart:
    """Attempts ended per minute, oldest minute first; the last is the current minute."""

    per_minute: tuple[int, ...]
    start: float  # when the first minute began (driver clock)

    @property
    def peak(self) -> int:
        return max(self.per_minute, default=0)

    @property
    def total(self) -> int:
        return sum(self.per_minute)


@attrs.frozen
class QueueRow:
    """One queue's counts, with "ready" split the way an operator reads it: due now (its run-at
    has come: waiting for a worker) and delayed (waiting for its delay, a retry's backoff or a
    fleet limit). "ready 5 / due 0" read as five stuck jobs; they were delayed."""

    queue: str
    counts: Mapping[str, int]
    due: int
    oldest_due_age: float | None
    paused: bool = False  # an operator paused it: nothing of it starts until it is resumed

    @classmethod
    def of(cls, stats: QueueStats) -> QueueRow:
        return cls(stats.queue, dict(stats.depth), stats.due, stats.oldest_ready_age, stats.paused)

    def count(self, state: str) -> int:
        return self.counts.get(state, 0)

    @property
    def delayed(self) -> int:
        return max(self.count(JobState.READY.value) - self.due, 0)

    @property
    def live(self) -> int:
        """Jobs still to run or running: how the busiest queues are found."""
        return sum(self.count(s.value) for s in (READY, RUNNING, SUSPENDED))


@attrs.frozen
class TaskRow:
    task: str
    schedule: str | None  # None: not declared by the registry the dashboard was given
    next_fire: float | None
    last_fired: float | None  # the scheduled time the last fire stood for
    last_fired_at: float | None
    last_job_id: str | None


@attrs.frozen
class Overview:
    queues: tuple[QueueRow, ...]  # the busiest MAX_QUEUE_ROWS of those matching the filter
    matching: int  # queues matching the filter (all of them without one)
    total: QueueRow  # every queue summed
    completed: Chart
    failed: Chart
    workers: tuple[WorkerPresence, ...]  # seen within two of their intervals
    silent: int  # recorded but not seen lately (killed without a goodbye, or cut off)
    tasks: tuple[TaskRow, ...]
    tasks_declared: bool  # a registry was given: schedules and next fires are known
    outbox: OutboxStats
    # Each job name's last hour of attempts (the most failing first), and how many names there
    # were in all.
    names: tuple[NameStats, ...] = ()
    name_count: int = 0

    # Every paused queue, whatever the filter: a pause must not hide off the page. Each with
    # the workers holding jobs of it that have not confirmed it yet (the first
    # MAX_PAUSES_CHECKED paused queues: one read each).
    pauses: tuple[PausedRow, ...] = ()


@attrs.frozen
class PausedRow:
    pause: QueuePause
    # Holding jobs of it and not heard from: they may start those they hold for a slot.
    unheard: tuple[Unconfirmed, ...] = ()


async def overview(
    driver: Driver,
    now: float,
    *,
    queue_prefix: str | None = None,
    registry: Registry | None = None,
) -> Overview:
    """Everything the queues page shows, in eight reads whatever the number of queues."""
    stats = [QueueRow.of(q) for q in await driver.stats()]
    total = QueueRow(
        "all queues",
        {s.value: sum(q.count(s.value) for q in stats) for s in JobState},
        sum(q.due for q in stats),
        max((q.oldest_due_age for q in stats if q.oldest_due_age is not None), default=None),
    )
    matching = [q for q in stats if queue_prefix is None or q.queue.startswith(queue_prefix)]
    matching.sort(key=lambda q: (-q.live, q.queue))
    completed, failed = await charts(driver, now)
    presences = await driver.workers()
    live = tuple(w for w in presences if w.live(now))
    names = await driver.name_stats(completed.start)
    return Overview(
        queues=tuple(matching[:MAX_QUEUE_ROWS]),
        matching=len(matching),
        total=total,
        completed=completed,
        failed=failed,
        workers=live,
        silent=len(presences) - len(live),
        tasks=tuple(await task_rows(driver, now, registry)),
        tasks_declared=registry is not None,
        outbox=await driver.outbox_stats(),
        names=tuple(sorted(names, key=_most_failing)[:MAX_NAME_ROWS]),
        name_count=len(names),
        pauses=tuple(
            [
                PausedRow(pause, await unheard(driver, pause) if i < MAX_PAUSES_CHECKED else ())
                for i, pause in enumerate(await driver.queue_pauses())
            ]
        ),
    )


def _most_failing(stats: NameStats) -> tuple[float, int, str]:
    """The overview's order of job names: the most failed attempts first, then the busiest."""
    failed = sum(stats.outcomes.get(o, 0) for o in FAILED_OUTCOMES)
    return (-failed, -sum(stats.outcomes.values()), stats.name)


async def charts(driver: Driver, now: float) -> tuple[Chart, Chart]:
    """Completed and failed (retried or dead-lettered) attempts per minute, the last hour."""
    start = (math.floor(now / 60) - CHART_MINUTES + 1) * 60
    done = [0] * CHART_MINUTES
    failed = [0] * CHART_MINUTES
    for count in await driver.outcome_counts(start, 60):
        index = math.floor((count.start - start) / 60)
        if not 0 <= index < CHART_MINUTES:
            continue
        if count.outcome == "completed":
            done[index] += count.count
        elif count.outcome in FAILED_OUTCOMES:
            failed[index] += count.count
    return Chart(tuple(done), start), Chart(tuple(failed), start)


async def task_rows(driver: Driver, now: float, registry: Registry | None) -> list[TaskRow]:
    """Each task on record, and each the registry declares: a record with no declaration is a
    task a deploy removed; a declaration with no record has not fired yet."""
    marks = {mark.task: mark for mark in await driver.task_marks()}
    declared = {task.name: task for task in registry.tasks()} if registry is not None else {}
    rows = []
    for name in sorted(declared.keys() | marks.keys()):
        task, mark = declared.get(name), marks.get(name)
        rows.append(
            TaskRow(
                task=name,
                schedule=None if task is None else task.schedule.describe(),
                next_fire=None
                if task is None
                else next_fire_of(task, None if mark is None else mark.handled_until, now),
                last_fired=None if mark is None else mark.last_fired,
                last_fired_at=None if mark is None else mark.last_fired_at,
                last_job_id=None if mark is None else mark.last_job_id,
            )
        )
    return rows


def check_filter_text(query: Mapping[str, str]) -> None:
    """Refuse a filter holding a character a person cannot see or type back (a control or
    format character, a lone surrogate): reflected into the filter box, it was there raw."""
    for field in _FILTER_FIELDS:
        value = query.get(field) or ""
        if not value.isprintable():
            bad = next(ch for ch in value if not ch.isprintable())
            raise InvalidArgument(
                field,
                f"the filter holds the character {visible(bad)}, which cannot be shown",
                fix="type the filter as text: letters, digits, punctuation and spaces",
            )


@attrs.frozen
class JobFilter:
    state: JobState | None = None
    queue: str | None = None
    name: str | None = None  # a prefix of the job's name
    page: int = 1

    @classmethod
    def parse(cls, query: dict[str, str]) -> JobFilter:
        """The filter a query string asks for; a bad value is an InvalidArgument naming it,
        never a silently empty list."""
        check_filter_text(query)
        state_text = query.get("state") or None
        state = None
        if state_text is not None:
            try:
                state = JobState(state_text)
            except ValueError:
                raise InvalidArgument(
                    "state",
                    f"{state_text!r} is not a job state",
                    fix="use one of " + ", ".join(s.value for s in JobState),
                ) from None
        page_text = query.get("page") or "1"
        page = int(page_text) if page_text.isdecimal() and len(page_text) < 7 else 0
        if page < 1:
            raise InvalidArgument("page", f"{page_text!r} is not a page number", fix="use 1, 2, …")
        return cls(state, query.get("queue") or None, query.get("name") or None, page)


@attrs.frozen
class JobPage:
    jobs: tuple[JobRecord, ...]
    has_next: bool
    truncated: bool  # the read stopped at SCAN_LIMIT jobs: older ones were not looked at


async def job_page(driver: Driver, wanted: JobFilter) -> JobPage:
    first = (wanted.page - 1) * PAGE_SIZE
    # One more than the page needs tells whether a next page exists.
    limit = min(SCAN_LIMIT, first + PAGE_SIZE + 1)
    if wanted.name is not None:
        limit = SCAN_LIMIT  # the name is matched here, so every scanned job may be a match
    records = await driver.list_jobs(state=wanted.state, queue=wanted.queue, limit=limit)
    truncated = limit == SCAN_LIMIT and len(records) >= SCAN_LIMIT
    if wanted.name is not None:
        records = [r for r in records if r.name.startswith(wanted.name)]
    shown = tuple(records[first : first + PAGE_SIZE])
    return JobPage(shown, len(records) > first + PAGE_SIZE, truncated)


@attrs.frozen
class JobDetail:
    job: JobRecord
    steps: tuple[StepRecord, ...]
    attempts: tuple[AttemptRecord, ...]  # newest first, as a person reads a history
    can_retry: bool
    can_cancel: bool
    can_delete: bool
    can_run_now: bool  # ready, its run-at still ahead (scheduled, backing off, put off)


async def job_detail(driver: Driver, job_id: str) -> JobDetail | None:
    record = await driver.get(job_id)
    if record is None:
        return None
    steps = tuple(await driver.load_steps(job_id))
    attempts = tuple(reversed(await driver.load_attempts(job_id)))
    return JobDetail(
        record,
        steps,
        attempts,
        can_retry=record.state in RETRYABLE_STATES,
        can_cancel=record.state in CANCELLABLE_STATES
        or (record.state is JobState.RUNNING and not record.cancel_requested),
        can_delete=record.state in DELETABLE_STATES,
        can_run_now=record.state is JobState.READY and record.run_at > driver.now(),
    )


async def bulk_targets(driver: Driver, wanted: JobFilter, bulk: Bulk) -> list[JobRecord]:
    """The jobs a bulk action from the list takes with "every job the filter matches": those
    of the filter's state (else the action's default states) in its queue and name, newest
    first, at most BULK_LIMIT. A state the action cannot take is refused, naming the ones it
    can, rather than silently acting on none."""
    if wanted.state is not None and wanted.state not in bulk.states:
        raise InvalidArgument(
            "state",
            f"{bulk.verb} takes no {wanted.state.value} job",
            fix="filter by one of " + ", ".join(sorted(s.value for s in bulk.states)),
        )
    states = [wanted.state] if wanted.state is not None else list(bulk.default_states)
    found: list[JobRecord] = []
    for state in states:
        listed = await driver.list_jobs(state=state, queue=wanted.queue, limit=SCAN_LIMIT)
        found += [r for r in listed if wanted.name is None or r.name.startswith(wanted.name)]
    found.sort(key=lambda r: (r.created_at, r.id), reverse=True)
    return found[:BULK_LIMIT]
