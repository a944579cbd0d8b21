# Cron tasks as declared: a job plus the schedule that enqueues it, its missed-run policy, and
# the plan of which scheduled times one look at the clock fires. Apart so the policy is a pure
# function of (schedule, record, now) that the scheduler, the CLI and the property tests share.
from __future__ import annotations

import enum
import itertools
import math
from typing import Any, Generic, Protocol, TypeVar

import attrs

from .._core.errors import ConfigError
from .._core.records import NewJob
from .schedule import CronSchedule, IntervalSchedule, Schedule, next_fire

# A scheduled time this late (seconds) is still "on time": under missed="skip" it fires. A
# scheduler wakes at each fire time, so a live fleet is late by its own latency, far less.
ON_TIME_WITHIN = 60.0

# Counting how many missed times a look skipped walks them one by one; past this many it stops
# counting (the plan is the same, the skipped counter then says "at least").
SKIPPED_COUNT_LIMIT = 100_000


class Missed(enum.StrEnum):
    """What a scheduler does with scheduled times that passed while no worker fired them
    (every worker down, a deploy across a fire time)."""

    SKIP = "skip"  # fire none of them; the schedule goes on at the next time
    LATEST = "latest"  # fire once, for the most recent missed time (the default)
    ALL = "all"  # fire each of them, the most recent `catch_up` at most


class TaskJob(Protocol):
    """What a task needs of its job: the row one fire enqueues. ``JobDefinition`` is one; named
    here so that tasks, below the registry that declares them, need not import it."""

    def new_job(self, payload: Any) -> NewJob: ...


# The job's own type, kept: ``registry.task`` answers a TaskDefinition[JobDefinition].
JobT = TypeVar("JobT", bound=TaskJob, covariant=True)


@attrs.frozen(eq=False)
class TaskDefinition(Generic[JobT]):
    """One declared task: ``job`` is the ordinary job each fire enqueues."""

    name: str
    job: JobT
    schedule: CronSchedule | IntervalSchedule
    missed: Missed = Missed.LATEST
    catch_up: int = 10  # missed="all": how many missed times at most

    def payload(self, scheduled: float, *, manual: bool = False) -> dict[str, Any]:
        """What the job receives: the scheduled time it stands for, as epoch seconds and as
        ISO 8601 in the task's time zone."""
        payload: dict[str, Any] = {
            "task": self.name,
            "scheduled_at": self.schedule.local(scheduled).isoformat(),
            "scheduled_ts": scheduled,
        }
        if manual:
            payload["manual"] = True
        return payload


def check_missed(missed: object, catch_up: object) -> Missed:
    try:
        policy = Missed(str(missed))
    except ValueError:
        raise ConfigError(
            f"missed={missed!r} is not a missed-run policy",
            fix="pass missed='latest' (default), 'skip' or 'all'",
        ) from None
    if isinstance(catch_up, bool) or not isinstance(catch_up, int) or catch_up < 1:
        raise ConfigError(f"catch_up={catch_up!r}", fix="give catch_up >= 1 (missed='all' only)")
    return policy


@attrs.frozen
class FirePlan:
    """What one look fires: ``fire`` ascending; every scheduled time up to ``advance_to`` is
    handled (fired or skipped) once the plan commits. ``advance_to`` None: nothing was due."""

    fire: tuple[float, ...] = ()
    skipped: int = 0
    advance_to: float | None = None


def plan_fires(task: TaskDefinition[TaskJob], handled_until: float | None, now: float) -> FirePlan:
    """The fires due at ``now`` for a task whose record says every scheduled time up to
    ``handled_until`` is done. A task never seen before (None) starts at its next time: a new
    task, or a new deploy of one, does not fire for times before it existed."""
    if handled_until is None:
        return FirePlan(advance_to=now)
    keep = 1 if task.missed is not Missed.ALL else task.catch_up
    schedule: Schedule = task.schedule
    latest = _latest_due(schedule, handled_until, now, keep)  # newest first
    if not latest:
        return FirePlan()
    fire = tuple(reversed(latest))
    if task.missed is Missed.SKIP and now - fire[-1] > ON_TIME_WITHIN:
        fire = ()
    elif task.missed is Missed.SKIP:
        fire = fire[-1:]
    skipped = _count_between(schedule, handled_until, latest[-1]) + len(latest) - len(fire)
    return FirePlan(fire=fire, skipped=skipped, advance_to=latest[0])


def next_fire_of(
    task: TaskDefinition[TaskJob], handled_until: float | None, now: float
) -> float | None:
    """When the fleet fires ``task`` next: its first scheduled time after its record (past, so
    overdue, when no worker fires it), or after ``now`` for a task never fired; None when its
    schedule has no time left. For `jobs-trio tasks` and the dashboard."""
    found = next_fire(task.schedule, now if handled_until is None else handled_until)
    return found if math.isfinite(found) else None


def _latest_due(schedule: Schedule, handled_until: float, now: float, keep: int) -> list[float]:
    """Up to ``keep`` scheduled times in (handled_until, now], newest first."""
    due = itertools.takewhile(lambda t: t > handled_until, schedule.before(now))
    return list(itertools.islice(due, keep))


def _count_between(schedule: Schedule, low: float, high: float) -> int:
    """How many scheduled times lie strictly between ``low`` and ``high`` (capped)."""
    between = itertools.takewhile(lambda t: t < high, schedule.after(low))
    return sum(1 for _ in itertools.islice(between, SKIPPED_COUNT_LIMIT))
