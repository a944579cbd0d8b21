# What the commands' arguments are checked against: whole numbers every driver stores, seconds,
# the database URL and its options. Apart so every command module shares them with main.py.
from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any, Literal

from .._core.errors import ConfigError
from ..drivers._open_driver import DriverKind, driver_kind

# How a command module adds its command: main.py's ``command(name, run, help)``.
Command = Callable[..., argparse.ArgumentParser]

ENV_DB = "JOBS_TRIO_DB"
ENV_SCHEMA = "JOBS_TRIO_SCHEMA"

# The whole numbers a command line may give (priority, attempts, limits): PostgreSQL's
# `integer`, the narrowest driver column, so that what the CLI accepts on SQLite is not refused
# on PostgreSQL (and 10**23, which no driver stores, is a usage error instead of an
# OverflowError from deep inside the SQLite module).
INT_RANGE = (-(2**31), 2**31 - 1)
# The longest --delay: a job due a century from now is a mistake (epoch seconds where a
# delay was meant), and `--delay 1e308` made a job whose run-at no calendar can show.
MAX_DELAY_DAYS = 36_525


def whole(text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:  # not a number, or more digits than int() reads
        value = low - 1
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from {low} to {high}")
    return value


def count(text: str) -> int:
    return whole(text, 1, INT_RANGE[1])


def count_or_zero(text: str) -> int:
    return whole(text, 0, INT_RANGE[1])


def auto_or_count(text: str) -> int | Literal["auto"]:
    """``auto`` or a whole number from 0 (``--claim-ahead``)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return count_or_zero(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither 'auto' nor a whole number from 0 to {INT_RANGE[1]}"
        ) from None


def priority(text: str) -> int:
    return whole(text, *INT_RANGE)


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def delay(text: str) -> float:
    value = seconds(text)
    if value > MAX_DELAY_DAYS * 86400:
        raise argparse.ArgumentTypeError(
            f"{text!r} is more than {MAX_DELAY_DAYS} days of seconds: a job that far off is a"
            " mistake (a timestamp where a delay was meant?)"
        )
    return value


def positive_seconds(text: str) -> float:
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return value


def database_url(args: argparse.Namespace, *, one_shot: bool = True) -> str:
    """The database to open. A ``one_shot`` command (all but the worker) refuses memory://:
    its store begins and ends with the command, so an enqueue there printed an id for a job
    that was already gone, and a list answered "no jobs" about nothing."""
    url: str | None = args.db or os.environ.get(ENV_DB)
    if not url:
        raise ConfigError(
            "no database URL was given",
            fix=f"pass --db URL or set {ENV_DB} (e.g. --db sqlite:///jobs.db)",
        )
    if one_shot and driver_kind(url) is DriverKind.MEMORY:
        raise ConfigError(
            f"memory:// lasts only as long as the process, and `jobs-trio {args.command}`"
            " ends when it is done: nothing it wrote or read would outlive it",
            fix="pass a database that outlives the command, e.g. --db sqlite:///jobs.db",
        )
    return url


def driver_options(
    args: argparse.Namespace, url: str, *, existing: bool = False, read_only: bool = False
) -> dict[str, Any]:
    """``--schema`` (or its variable) for a PostgreSQL URL; refused elsewhere rather than
    silently ignored, since it would point at jobs that are not there. On SQLite, ``existing``
    refuses to create a missing file and ``read_only`` also opens it without migrating or
    writing it (PostgreSQL creates nothing on open, and migrates only when asked)."""
    options: dict[str, Any] = {}
    kind = driver_kind(url)
    if kind is DriverKind.SQLITE:
        options = {"create": not existing, "read_only": read_only}
    schema: str | None = getattr(args, "schema", None) or os.environ.get(ENV_SCHEMA)
    if schema is None:
        return options
    if kind is not DriverKind.POSTGRES:
        raise ConfigError(
            f"--schema {schema!r} was given for {url.split(':', 1)[0]}: "
            "only PostgreSQL has schemas",
            fix=f"drop --schema (and unset {ENV_SCHEMA}) for this database",
        )
    return {**options, "schema": schema}
