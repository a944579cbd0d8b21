# `jobs-trio prune --older-than AGE`: the operator's retention, the same bounded batches and the
# same fleet turn as the workers' pruner. Apart from cli.py so each command group has its place.
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import trio

from .._core import render as render
from .._core.errors import JobsError
from .._core.instance_id import instance_id
from .._retention.pruner import TURN_HOLD, Retention, prune_all
from ..drivers.contract import Driver
from .args import Command

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
# A prune asked for while a worker's pruner holds the turn waits out one hold, then says so.
TURN_WAIT = TURN_HOLD + 5.0


def age(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h``, ``7d``, ``2w``: an age in seconds."""
    found = _AGE.match(text)
    if found is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an age: write a number with s, m, h, d or w (e.g. 7d, 12h)"
        )
    return float(found.group(1)) * _UNITS[found.group(2) or "s"]


def add_prune_command(
    command: Command,
    run_on_driver: Callable[[Callable[[Driver, argparse.Namespace], Any]], Any],
    as_json: argparse.ArgumentParser,
) -> None:
    """Register ``prune`` with cli.py's ``command`` helper and its driver runner."""
    prune = command(
        "prune",
        run_on_driver(_prune),
        "Delete completed and cancelled jobs last changed more than --older-than ago (and dead"
        " ones past --dead-older-than, if given), with their step records, in batches. Live"
        " jobs are never deleted. Workers do this on their own (open_worker(retention=...)).",
        as_json,
    )
    prune.add_argument("--older-than", type=age, required=True, metavar="AGE", help="e.g. 7d")
    prune.add_argument(
        "--dead-older-than",
        type=age,
        metavar="AGE",
        help="also delete dead-lettered jobs this old (default: dead jobs are kept)",
    )
    prune.add_argument("--batch", type=int, default=1000, metavar="N", help="jobs per transaction")


async def _prune(driver: Driver, args: argparse.Namespace) -> None:
    retention = Retention(
        keep_finished=args.older_than, keep_dead=args.dead_older_than, batch=args.batch
    )
    turn = retention.turn(f"cli:{instance_id()}", every=0.0)
    progress = _Progress(quiet=args.json)
    deleted = None
    with trio.move_on_after(TURN_WAIT):
        while (deleted := await prune_all(driver, turn, on_batch=progress)) is None:
            # A worker's pruner holds the fleet's turn: it is doing this very work.
            progress.waiting()
            await trio.sleep(1.0)
    if deleted is None:
        raise_turn_held()
    summary = {"deleted": deleted, "older_than": args.older_than}
    summary["dead_older_than"] = args.dead_older_than
    if args.json:
        print(render.dumps(summary))
    else:
        kept = "dead jobs kept" if args.dead_older_than is None else "dead jobs included"
        print(f"deleted {deleted} finished jobs ({kept})")


def raise_turn_held() -> NoReturn:
    raise JobsError(
        f"another pruner held the fleet's prune turn for over {TURN_WAIT:.0f} s",
        fix="a worker is pruning now (its log says jobs.prune.deleted); try again later",
        code="X_BUSY",
    )


class _Progress:
    """A line on stderr every 10,000 jobs: a prune of millions takes minutes, and a silent
    terminal looks hung."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet
        self.total = 0
        self._said_waiting = False

    def __call__(self, deleted: int) -> None:
        before, self.total = self.total, self.total + deleted
        if not self.quiet and before // 10_000 != self.total // 10_000:
            print(f"... {self.total} deleted", file=sys.stderr, flush=True)

    def waiting(self) -> None:
        if not self._said_waiting and not self.quiet:
            print("... a worker holds the prune turn; waiting", file=sys.stderr, flush=True)
        self._said_waiting = True
