# `jobs-trio worker`'s retention flags: what `open_worker(retention=Retention(...))` takes, on the
# command line (how long finished and dead jobs are kept, how often and in what batches the
# fleet prunes, or no pruning at all). Apart from cli.py so the worker command adds them in one
# call and the flags read the ages `jobs-trio prune` reads.
from __future__ import annotations

import argparse

import attrs

from .._core.errors import ConfigError
from .._retention.pruner import DEFAULT_RETENTION, Retention
from .prune import age

FOREVER = "forever"
_FLAG = {
    "keep_finished": "--keep-finished",
    "keep_dead": "--keep-dead",
    "every": "--prune-every",
    "batch": "--prune-batch",
}


def _age_or_forever(text: str) -> float | str:
    return FOREVER if text.strip().lower() == FOREVER else age(text)


def add_retention_flags(command: argparse.ArgumentParser) -> None:
    default = DEFAULT_RETENTION
    command.add_argument(
        "--keep-finished",
        type=age,
        metavar="AGE",
        help="delete completed and cancelled jobs this long after they ended, e.g. 12h (default"
        f" {default.keep_finished / 86400:g}d)",
    )
    command.add_argument(
        "--keep-dead",
        type=_age_or_forever,
        metavar="AGE",
        help=f"delete dead-lettered jobs this long after, or '{FOREVER}' (default"
        f" {(default.keep_dead or 0) / 86400:g}d)",
    )
    command.add_argument(
        "--prune-every",
        type=age,
        metavar="AGE",
        help=f"the fleet prunes once in this long, one worker a turn (default {default.every:g}s)",
    )
    command.add_argument(
        "--prune-batch",
        type=int,
        metavar="N",
        help=f"jobs deleted per transaction (default {default.batch})",
    )
    command.add_argument(
        "--no-retention",
        action="store_true",
        help="this worker prunes nothing: finished jobs are kept until deleted otherwise"
        " (another worker's retention, or `jobs-trio prune`)",
    )


def retention_of(args: argparse.Namespace) -> Retention | None:
    """The worker's ``retention=``: the defaults with each flag given in its place, or None
    with --no-retention. A flag given beside --no-retention is refused, not ignored: the
    operator asked for both pruning and none."""
    flags = {
        "keep_finished": args.keep_finished,
        "keep_dead": args.keep_dead,
        "every": args.prune_every,
        "batch": args.prune_batch,
    }
    # None: not given. "forever": dead jobs kept (Retention's keep_dead=None).
    given = {field: value for field, value in flags.items() if value is not None}
    if args.no_retention:
        if given:
            named = ", ".join(_FLAG[field] for field in given)
            raise ConfigError(
                f"--no-retention was given with {named}",
                fix="drop --no-retention to prune with those settings, or drop them to prune"
                " nothing",
            )
        return None
    if given.get("keep_dead") == FOREVER:
        given["keep_dead"] = None
    return attrs.evolve(DEFAULT_RETENTION, **given)
