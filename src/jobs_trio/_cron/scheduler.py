# The scheduler: a service of each worker that enqueues the declared tasks' due fires, once per
# fleet however many workers run it. Apart from the worker because its only tie to the worker
# is its lifetime; "once" is won in the driver's compare-and-set, never by a leader.
from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import trio

from .._core.errors import DriverError
from .._core.logs import log_event
from .._core.metrics import Metrics, default_metrics
from .._core.records import JobId, TaskAdvance, TaskFire
from ..drivers.contract import Driver
from .schedule import next_fire
from .tasks import FirePlan, TaskDefinition, TaskJob, plan_fires

# The longest a scheduler sleeps between looks: how soon it notices a record another worker
# moved (after a deploy that changed a schedule, say), and a bound on a look lost to a clock
# that jumped.
MAX_SLEEP = 60.0
# After a failed look (the database away), the next one is this far off.
RETRY_AFTER = 5.0
# After a lost compare-and-set, the next look (on a fresh read) is this far off: soon, but never
# a busy loop, even against a record the scheduler cannot move (a fire already on record).
RELOOK_AFTER_RACE = 0.1


class TaskScheduler:
    """Fires ``tasks`` on ``driver``. Start it with ``nursery.start(scheduler.run)``; cancel
    its scope to stop it (a write in flight then rolls back, or has committed whole)."""

    def __init__(
        self,
        driver: Driver,
        tasks: Sequence[TaskDefinition[TaskJob]],
        *,
        metrics: Metrics | None = None,
        max_sleep: float = MAX_SLEEP,
    ) -> None:
        self.driver = driver
        self.tasks = tuple(tasks)
        self._metrics = metrics or default_metrics()
        self._max_sleep = max_sleep

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if not self.tasks:
            return
        while True:
            try:
                wake_at = await self.look()
            except DriverError as exc:
                log_event("jobs.task.look-failed", logging.WARNING, error=str(exc))
                wake_at = self.driver.now() + RETRY_AFTER
            await trio.sleep(min(max(wake_at - self.driver.now(), 0.0), self._max_sleep))

    async def look(self) -> float:
        """Fire what is due for every task; answer when (driver clock) the next is due."""
        marks = {mark.task: mark.handled_until for mark in await self.driver.task_marks()}
        soonest = math.inf
        for task in self.tasks:
            handled = marks.get(task.name)
            plan = plan_fires(task, handled, self.driver.now())
            if plan.advance_to is not None:
                if not await self._advance(task, handled, plan):
                    # Another worker moved the record since we read it: look again soon, on
                    # a fresh read, rather than sleep on what may now be stale.
                    return self.driver.now() + RELOOK_AFTER_RACE
                handled = plan.advance_to
            assert handled is not None
            soonest = min(soonest, next_fire(task.schedule, handled))
        return soonest

    async def _advance(
        self, task: TaskDefinition[TaskJob], handled: float | None, plan: FirePlan
    ) -> bool:
        fires = tuple(TaskFire(t, task.job.new_job(task.payload(t))) for t in plan.fire)
        advance = TaskAdvance(task.name, handled, plan.advance_to or 0.0, fires)
        if not await self.driver.advance_task(advance):
            return False
        for fire in fires:
            self._metrics.task_fired(task.name)
            log_event(
                "jobs.task.fired",
                task=task.name,
                scheduled_at=task.schedule.local(fire.scheduled).isoformat(),
                job_id=fire.job.job_id,
            )
        if plan.skipped:
            self._metrics.task_skipped(task.name, plan.skipped)
            log_event(
                "jobs.task.missed-skipped",
                task=task.name,
                skipped=plan.skipped,
                policy=task.missed.value,
                through=task.schedule.local(plan.advance_to or 0.0).isoformat(),
            )
        return True


async def fire_now(driver: Driver, task: TaskDefinition[TaskJob]) -> JobId:
    """Enqueue one fire of ``task`` by hand, now: an ordinary job whose payload says
    ``manual: true``. The task's record is not touched, so its schedule goes on as before."""
    now = driver.now()
    [answer] = await driver.enqueue([task.job.new_job(task.payload(now, manual=True))])
    log_event("jobs.task.fired-by-hand", task=task.name, job_id=answer.job_id)
    return answer.job_id
