# --log-level and --log-format for the commands that run until stopped (worker, dashboard, and
# any later one): stdlib logging on stderr, one formatter from log_format.py for every logger.
# Apart from cli.py so that each long-running command adds the same two flags with one call.
from __future__ import annotations

import argparse
import logging
import os
import sys
import time

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
    handler was made: a stream swapped and closed since (a test's capture) is never written to.

    A worker's line per finished attempt (``jobs.attempt.*`` below warning) is written with
    the lines after it, in one write, within ``BATCH_SECONDS`` or when the worker next waits
    for work (``jobs_trio._core.logs.flush_log_handlers``): a write and a flush per line were a
    fifth of what a no-op job cost the worker (issue 35). Every other line writes itself and
    whatever waits before it at once; an exit flushes (logging.shutdown)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self._waiting: list[str] = []
        self._first_waiting = 0.0

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass  # always the current sys.stderr

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)
            return
        now = time.monotonic()
        if not self._waiting:
            self._first_waiting = now
        self._waiting.append(line)
        if (
            record.levelno >= logging.WARNING
            or not getattr(record, "event", "").startswith(_BATCHED)
            or now - self._first_waiting >= BATCH_SECONDS
            or len(self._waiting) >= _BATCH_LINES
        ):
            self.flush()

    def flush(self) -> None:
        self.acquire()
        try:
            if not self._waiting:
                return
            text = self.terminator.join(self._waiting) + self.terminator
            self._waiting.clear()
            stream = sys.stderr
            stream.write(text)
            stream.flush()
        except Exception:
            pass  # a closed or broken stderr: nothing left to tell it with
        finally:
            self.release()


# How long an attempt's line may wait to be written with the ones after it, and how many.
BATCH_SECONDS = 0.2
_BATCH_LINES = 256
_BATCHED = "jobs.attempt."


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
