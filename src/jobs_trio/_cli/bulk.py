# `jobs-trio retry`, `cancel`, `delete` and `run-now`: one job by its id, or every job a filter
# matches (queue, name, state, age), with --dry-run to see them first. Apart from cli.py because
# the bulk form is the operator's one write over many jobs, and its guard rails live together.
from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .._core import render as render
from .._core.errors import ConfigError, InvalidTransition, JobNotFound
from .._core.operator_transitions import BULKS, Bulk
from .._core.records import JobRecord, JobState
from ..drivers.contract import Driver
from .args import Command
from .prune import age

RunOnDriver = Callable[[Callable[[Driver, argparse.Namespace], Any]], Any]

# The most jobs one bulk command changes (--limit); run it again for the rest. A bound, so a
# filter wider than meant is a thousand jobs to put right, not a million.
DEFAULT_LIMIT = 1000


def add_bulk_commands(
    command: Command, run_on_driver: RunOnDriver, as_json: argparse.ArgumentParser
) -> None:
    """Register each of BULKS with cli.py's ``command`` helper and driver runner."""
    for bulk in BULKS:
        parser = command(bulk.verb, run_on_driver(_runner(bulk)), bulk.text, as_json)
        parser.add_argument("id", nargs="?", metavar="ID", help="one job; or use the filters")
        filters = parser.add_argument_group("filters (every job matching all of them)")
        filters.add_argument("--queue", metavar="Q")
        filters.add_argument("--name", metavar="NAME", help="the job's whole name")
        filters.add_argument(
            "--state",
            action="append",
            choices=sorted(s.value for s in bulk.states),
            metavar="S",
            help="repeatable: " + ", ".join(sorted(s.value for s in bulk.states)),
        )
        filters.add_argument(
            "--older-than",
            type=age,
            metavar="AGE",
            help="last changed more than AGE ago (90s, 15m, 12h, 7d)",
        )
        filters.add_argument(
            "--limit",
            type=int,
            default=DEFAULT_LIMIT,
            metavar="N",
            help=f"change at most N jobs, the newest first (default {DEFAULT_LIMIT})",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="list what would change; change nothing"
        )


def _runner(bulk: Bulk) -> Callable[[Driver, argparse.Namespace], Awaitable[None]]:
    async def run(driver: Driver, args: argparse.Namespace) -> None:
        filtered = any(
            getattr(args, f) is not None for f in ("queue", "name", "state", "older_than")
        )
        if args.id is not None:
            if filtered or args.dry_run:
                raise ConfigError(
                    f"`jobs-trio {bulk.verb}` was given an ID and filters (or --dry-run)",
                    fix=f"give one job's ID, or filters to {bulk.verb} every job they match",
                )
            await _one(bulk, driver, args)
            return
        if not filtered:
            raise ConfigError(
                f"`jobs-trio {bulk.verb}` needs a job's ID or at least one filter",
                fix=f"e.g. `jobs-trio {bulk.verb} ID`, or `jobs-trio {bulk.verb} --queue mail"
                " --dry-run` to see what a filter matches first",
            )
        if args.limit < 1:
            raise ConfigError(f"--limit {args.limit}", fix="give --limit 1 or more")
        await _many(bulk, driver, args)

    return run


async def _one(bulk: Bulk, driver: Driver, args: argparse.Namespace) -> None:
    record = await bulk.act(driver, args.id)
    if args.json:
        print(render.dumps(record.to_json()))
    else:
        print(f"{render.visible(record.id)}: {bulk.said(record)}")


async def matching(
    driver: Driver,
    states: Sequence[JobState],
    *,
    queue: str | None,
    name: str | None,
    older_than: float | None,
    limit: int,
) -> tuple[list[JobRecord], bool]:
    """The newest ``limit`` jobs in ``states`` that match, and whether more do."""
    before = None if older_than is None else driver.now() - older_than
    found: list[JobRecord] = []
    for state in states:
        # One more than wanted tells whether more match.
        found += await driver.list_jobs(
            state=state, queue=queue, name=name, changed_before=before, limit=limit + 1
        )
    found.sort(key=lambda r: (r.created_at, r.id), reverse=True)
    return found[:limit], len(found) > limit


async def _many(bulk: Bulk, driver: Driver, args: argparse.Namespace) -> None:
    states = tuple(JobState(s) for s in args.state) if args.state else bulk.default_states
    records, more = await matching(
        driver,
        states,
        queue=args.queue,
        name=args.name,
        older_than=args.older_than,
        limit=args.limit,
    )
    changed: list[str] = []
    skipped: list[str] = []
    if not args.dry_run:
        for record in records:
            try:
                await bulk.act(driver, record.id)
            except (InvalidTransition, JobNotFound):
                skipped.append(record.id)  # changed (or pruned) since it was listed
            else:
                changed.append(record.id)
    if args.json:
        print(
            render.dumps(
                {
                    "dry_run": args.dry_run,
                    "matched": [r.id for r in records],
                    bulk.done.replace(" ", "_"): changed,
                    "skipped": skipped,
                    "more": more,
                }
            )
        )
        return
    if args.dry_run:
        verb = f"would {bulk.verb}"
        print(f"{verb} {len(records)} job{'s' * (len(records) != 1)}; nothing was changed")
        if records:
            print(render.jobs_table(records, driver.now()))
    else:
        print(f"{bulk.done} {len(changed)} job{'s' * (len(changed) != 1)}")
        if skipped:
            print(f"skipped {len(skipped)}: changed since they were listed", file=sys.stderr)
    if more:
        print(
            f"(more jobs may match: at most --limit {args.limit} at a time; run it again)",
            file=sys.stderr,
        )
