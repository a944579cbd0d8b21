# --log-level and --log-format for the commands that run until stopped (worker, dashboard, and
# any later one): stdlib logging on stderr, one formatter from log_format.py for every logger.
# Apart from cli.py so that each long-running command adds the same two flags with one call.
from __future__ import annotations

import argparse
import logging
import os
import sys

from .._core.errors import ConfigError
from .._core.log_format import FORMATS, LEVELS, formatter

ENV_LOG_LEVEL = "JOBS_TRIO_LOG_LEVEL"
ENV_LOG_FORMAT = "JOBS_TRIO_LOG_FORMAT"


def add_logging_flags(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--log-level",
        choices=LEVELS,
        metavar="LEVEL",
        help=f"{', '.join(LEVELS)} (default: ${ENV_LOG_LEVEL}, else info: a line per finished"
        " attempt)",
    )
    command.add_argument(
        "--log-format",
        choices=FORMATS,
        metavar="FORMAT",
        help=f"text, logfmt or json: one line per record on stderr (default: ${ENV_LOG_FORMAT},"
        " else text; docs/logging.md)",
    )


def log_format(args: argparse.Namespace) -> str:
    """The format asked for: the flag, else the environment, else text."""
    return _chosen(getattr(args, "log_format", None), ENV_LOG_FORMAT, FORMATS, "text")


def configure_logging(args: argparse.Namespace) -> None:
    """One handler on the root logger, so every library's lines (hypercorn's, asyncio's, Python
    warnings) come out in the same format: a JSON pipeline meets no line it cannot parse. A
    handler an earlier call installed is replaced; any other is left as it is (a command run
    in-process by a test, beside pytest's own)."""
    level = _chosen(getattr(args, "log_level", None), ENV_LOG_LEVEL, LEVELS, "info")
    handler = _Stderr()
    handler.setFormatter(formatter(log_format(args)))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Stderr)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler on whatever ``sys.stderr`` is when a record is written, not when the
    handler was made: a stream swapped and closed since (a test's capture) is never written to."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass  # always the current sys.stderr


def structured(args: argparse.Namespace) -> bool:
    """Whether stderr is for a log pipeline (logfmt or json): then what a command would print
    there for a person (a banner, its final error) is logged as a record instead."""
    return log_format(args) != "text"


def _chosen(flag: str | None, variable: str, allowed: tuple[str, ...], default: str) -> str:
    if flag is not None:
        return flag
    value = os.environ.get(variable, "").strip().lower()
    if not value:
        return default
    if value not in allowed:
        raise ConfigError(
            f"${variable} is {value!r}, not one of {', '.join(allowed)}",
            fix=f"set {variable} to one of {', '.join(allowed)}, or unset it",
        )
    return value
