# `jobs-trio pause` and `jobs-trio resume`: an operator's stop and start of whole queues, fleet-wide
# and durable (docs/model.md, "Pausing a queue"). Apart from bulk.py, which acts on jobs: a pause
# acts on a queue, including the jobs not enqueued yet.
from __future__ import annotations

import argparse
import getpass
import socket
from collections.abc import Callable
from typing import Any

from .._core import boundary
from .._core import render as render
from .._core.errors import ConfigError
from ..drivers.contract import Driver
from .args import Command

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
    answers = [(await driver.pause_queue(q, by=by), q in earlier) for q in queues]
    if args.json:
        print(render.dumps([{**p.to_json(), "already": already} for p, already in answers]))
        return
    for pause, already in answers:
        shown = render.visible(pause.queue)
        if already:
            who = f" by {render.visible(pause.by)}" if pause.by else ""
            print(f"{shown}: already paused since {render.iso(pause.paused_at)}{who}")
        else:
            print(
                f"{shown}: paused; its running jobs finish, nothing else of it starts until"
                f" `jobs-trio resume {shown}`"
            )


async def _resume(driver: Driver, args: argparse.Namespace) -> None:
    queues = _queues(args)
    answers = [(queue, await driver.resume_queue(queue)) for queue in queues]
    if args.json:
        print(render.dumps([{"queue": q, "resumed": resumed} for q, resumed in answers]))
        return
    for queue, resumed in answers:
        shown = render.visible(queue)
        print(f"{shown}: resumed" if resumed else f"{shown}: was not paused")
