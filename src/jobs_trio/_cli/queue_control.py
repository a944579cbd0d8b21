# `jobs-trio pause` and `jobs-trio resume`: an operator's stop and start of whole queues, fleet-wide
# and durable (docs/model.md, "Pausing a queue"). Apart from bulk.py, which acts on jobs: a pause
# acts on a queue, including the jobs not enqueued yet.
from __future__ import annotations

import argparse
import getpass
import socket
from collections.abc import Callable
from typing import Any

import trio

from .._core import boundary
from .._core import render as render
from .._core.errors import ConfigError, JobsError
from .._jobs.pausing import CONFIRM_WITHIN, PauseConfirmation, confirm_pause
from ..drivers.contract import Driver
from .args import Command, seconds

RunOnDriver = Callable[[Callable[[Driver, argparse.Namespace], Any]], Any]


def add_queue_commands(
    command: Command, run_on_driver: RunOnDriver, as_json: argparse.ArgumentParser
) -> None:
    """Register ``pause`` and ``resume`` with main.py's ``command`` helper and driver runner."""
    pause = command(
        "pause",
        run_on_driver(_pause),
        "Pause queues fleet-wide until resumed: their running jobs finish, nothing else of them"
        " starts on any worker (jobs held unstarted go back uncounted); enqueues still land."
        " Survives restarts; `stats` shows it.",
        as_json,
    )
    pause.add_argument("queues", nargs="+", metavar="QUEUE")
    pause.add_argument(
        "--by",
        metavar="WHO",
        help="who paused it, shown by stats and the dashboard (default: USER@HOST)",
    )
    pause.add_argument(
        "--wait",
        type=seconds,
        default=CONFIRM_WITHIN,
        metavar="S",
        help="how long to wait for each worker holding jobs of a queue to confirm it heard the"
        f" pause (default {CONFIRM_WITHIN:g}; exit 2 naming those that did not, the pause"
        " recorded all the same)",
    )
    resume = command(
        "resume",
        run_on_driver(_resume),
        "Resume paused queues: their jobs run again, in their usual order.",
        as_json,
    )
    resume.add_argument("queues", nargs="+", metavar="QUEUE")


def operator() -> str | None:
    """Who is at this terminal, as a pause records it: USER@HOST (None when the OS cannot
    say, as in a container without a user entry)."""
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (OSError, KeyError):
        return None


def _queues(args: argparse.Namespace) -> list[str]:
    return [boundary.check_name(q, argument="QUEUE") for q in dict.fromkeys(args.queues)]


async def _pause(driver: Driver, args: argparse.Namespace) -> None:
    queues = _queues(args)
    by = args.by if args.by is not None else operator()
    if by is not None and not by.strip():
        raise ConfigError("--by is empty", fix="say who pauses it, or leave --by out")
    earlier = {p.queue for p in await driver.queue_pauses()}
    # Every pause recorded first, then the confirmations waited for under one deadline: the
    # workers hear them all at once, and a second queue does not wait --wait again.
    pauses = [await driver.pause_queue(q, by=by) for q in queues]
    deadline = trio.current_time() + args.wait
    answers = [
        await confirm_pause(driver, pause, max(deadline - trio.current_time(), 0.0))
        for pause in pauses
    ]
    now = driver.now()
    if args.json:
        print(
            render.dumps([{**a.to_json(now), "already": a.pause.queue in earlier} for a in answers])
        )
    else:
        for answer in answers:
            print(_said(answer, answer.pause.queue in earlier, args.wait, now))
    unconfirmed = [a for a in answers if not a.confirmed]
    if unconfirmed:
        raise JobsError(
            f"{', '.join(render.visible(a.pause.queue) for a in unconfirmed)}: paused, but not"
            f" every worker holding jobs of it confirmed within {args.wait:g} s",
            fix="read what each one's silence means above; the pause stands (`jobs-trio stats`)"
            " and `jobs-trio pause` again waits again",
            code="X_PAUSE_UNCONFIRMED",
        )


def _said(answer: PauseConfirmation, already: bool, waited: float, now: float) -> str:
    pause = answer.pause
    shown = render.visible(pause.queue)
    if already:
        who = f" by {render.visible(pause.by)}" if pause.by else ""
        head = f"{shown}: already paused since {render.iso(pause.paused_at)}{who}"
    else:
        head = f"{shown}: paused"
    if answer.resumed:
        return f"{head}; resumed again before every worker confirmed it"
    holders = len(answer.heard) + len(answer.unconfirmed)
    resume = f"`jobs-trio resume {shown}`"
    if answer.confirmed and not holders:
        return f"{head}; none of its jobs is running: nothing of it starts until {resume}"
    if answer.confirmed:
        return (
            f"{head}; heard by the {holders} worker(s) holding its jobs: its running jobs"
            f" finish, nothing else of it starts until {resume}"
        )
    lines = [
        f"{head}; {len(answer.unconfirmed)} of the {holders} worker(s) holding its jobs did not"
        f" confirm within {waited:g} s:"
    ]
    for silent in answer.unconfirmed:
        seen = silent.presence
        where = f" ({render.visible(seen.host)} pid {seen.pid}, {seen.version})" if seen else ""
        lines.append(
            f"  {render.visible(silent.worker_id)}{where}: {render.visible(silent.why(now))}"
        )
    return "\n".join(lines)


async def _resume(driver: Driver, args: argparse.Namespace) -> None:
    queues = _queues(args)
    answers = [(queue, await driver.resume_queue(queue)) for queue in queues]
    if args.json:
        print(render.dumps([{"queue": q, "resumed": resumed} for q, resumed in answers]))
        return
    for queue, resumed in answers:
        shown = render.visible(queue)
        print(f"{shown}: resumed" if resumed else f"{shown}: was not paused")
