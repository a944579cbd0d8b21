# `jobs-trio tasks`: each declared cron task with its schedule, next and last fire, and a fire
# by hand. Apart from cli.py so the task commands stay in one place of their own.
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from .._core import render as render
from .._core.errors import UnknownJob
from .._core.records import TaskMark
from .._cron.scheduler import fire_now
from .._cron.tasks import TaskDefinition, TaskJob, next_fire_of
from ..drivers.contract import Driver
from .args import Command
from .find_registry import load_registry


def add_tasks_command(
    command: Command,
    run_on_driver: Callable[[Callable[[Driver, argparse.Namespace], Any]], Any],
    as_json: argparse.ArgumentParser,
) -> None:
    """Register ``tasks`` with cli.py's ``command`` helper and its driver runner."""
    tasks = command(
        "tasks",
        run_on_driver(_tasks),
        "List the cron tasks a registry declares: schedule, next fire, last fire. With --fire"
        " NAME, enqueue one fire of a task now (its schedule is left as it was).",
        as_json,
    )
    tasks.add_argument("app", metavar="MODULE[:ATTR]", help="where the jobs_trio.Registry is")
    tasks.add_argument("--fire", metavar="NAME", help="enqueue a fire of task NAME now")


async def _tasks(driver: Driver, args: argparse.Namespace) -> None:
    declared = {task.name: task for task in load_registry(args.app).tasks()}
    if args.fire is not None:
        task = declared.get(args.fire)
        if task is None:
            raise UnknownJob(
                f"no task named {args.fire!r} is declared (known: {', '.join(declared) or 'none'})",
                fix="check the name with `jobs-trio tasks MODULE`",
            )
        job_id = await fire_now(driver, task)
        print(render.dumps({"task": task.name, "job_id": job_id}) if args.json else job_id)
        return
    marks = {mark.task: mark for mark in await driver.task_marks()}
    now = driver.now()
    rows = [
        _row(declared.get(name), marks.get(name), name, now)
        for name in sorted(declared.keys() | marks.keys())
    ]
    if args.json:
        print(render.dumps(rows))
        return
    print(
        render.table(
            ["TASK", "SCHEDULE", "MISSED", "NEXT FIRE", "LAST FIRED FOR"],
            [
                [
                    row["task"],
                    row["schedule"] or "(not declared: no longer fires)",
                    row["missed"] or "-",
                    render.timed(row["next_fire"], now),
                    render.timed(row["last_fired"], now),
                ]
                for row in rows
            ],
        )
    )


def _row(
    task: TaskDefinition[TaskJob] | None, mark: TaskMark | None, name: str, now: float
) -> dict[str, Any]:
    """One task as JSON: a record without a declaration is a task a deploy removed."""
    next_at = None
    if task is not None:
        next_at = next_fire_of(task, None if mark is None else mark.handled_until, now)
    return {
        "task": name,
        "schedule": None if task is None else task.schedule.describe(),
        "missed": None if task is None else task.missed.value,
        "next_fire": next_at,
        "handled_until": None if mark is None else mark.handled_until,
        "last_fired": None if mark is None else mark.last_fired,
        "last_fired_at": None if mark is None else mark.last_fired_at,
        "last_job_id": None if mark is None else mark.last_job_id,
    }
