# --log-level and --log-format for the commands that run until stopped (worker, dashboard, and
# any later one): stdlib logging on stderr, one formatter from log_format.py for every logger.
# Apart from cli.py so that each long-running command adds the same two flags with one call.
from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
import time
import weakref
from collections.abc import Mapping

from .._core.errors import ConfigError
from .._core.log_format import (
    FORMATS,
    LEVELS,
    TextFormatter,
    below_the_line,
    formatter,
    logfmt_pairs,
)
from .._core.logs import AttemptLine, record_clock, seconds_text
from .._core.logs import logger as _jobs_logger

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

    A worker's line per finished attempt (``jobs.attempt.*`` below warning) is held back and
    written with the lines after it, in one write: a write and a flush per line were a fifth of
    what a no-op job cost the worker (issue 35). Held at most until the worker's Trio loop next
    waits for I/O (``logs.FlushHeldLines``, which a worker installs), ``BATCH_SECONDS``, or
    ``_BATCH_LINES`` lines; every other line writes itself and whatever is held before it at
    once; an exit flushes (logging.shutdown)."""

    # What logs.flush_held_lines looks for: this handler holds lines back.
    holds_lines_back = True

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self._held: list[str] = []
        self._first_held = 0.0
        # A child forked with lines held has copies of the parent's lines, which the parent
        # writes; the child drops them as it starts (a getpid() a line to notice the fork was
        # a fiftieth of what a no-op job cost the worker). Held weakly: a handler replaced is
        # not kept alive by the hook, which os cannot take back.
        os.register_at_fork(after_in_child=functools.partial(_drop_held, weakref.ref(self)))

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass  # always the current sys.stderr

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._hold(self.format(record), record.levelno, getattr(record, "event", None))
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def takes_lines(self) -> bool:
        """Whether a jobs_trio line may come without its record (logs._line_handler, which
        asks again whenever this handler or its formatter changes): the text format's lines,
        made as ``format`` makes them of the record, for this handler and formatter as they
        are (a subclass or a method replaced on either may make its lines otherwise)."""
        formatter = self.formatter
        return (
            type(formatter) is TextFormatter
            and "format" not in vars(self)
            and "format" not in vars(formatter)
            and "formatTime" not in vars(formatter)
        )

    def take_line(
        self,
        level: int,
        event: str,
        fields: Mapping[str, object],
        created: float,
        msecs: float,
    ) -> bool:
        """A jobs_trio line without its record (logs.TakeLine); False for a line with a field
        shown below it."""
        if below_the_line(fields):
            return False
        try:
            message = f"{event} {logfmt_pairs(fields)}".rstrip()
        except Exception:
            return False  # the record's way: what cannot be rendered goes to handleError
        return self.take_text(level, event, message, created, msecs)

    def take_text(self, level: int, event: str, message: str, created: float, msecs: float) -> bool:
        """A jobs_trio line rendered already (take_line's): ``message`` is its record's."""
        formatter = self.formatter
        if type(formatter) is not TextFormatter:
            return False  # see take_attempt
        line = formatter.event_line(created, msecs, logging.getLevelName(level), _LOGGER, message)
        if line is None:
            return False
        self._hold_taken(line, level, event)
        return True

    def take_attempt(self, line: AttemptLine, job_id: str, attempt: int, seconds: float) -> bool:
        """An attempt's INFO line (logs.TakeAttempt): the line ``take_text`` writes for its
        message, made and held in this one call."""
        formatter = self.formatter
        if type(formatter) is not TextFormatter:
            # takes_lines() said it was when the route was decided, but another thread may
            # have set another since (the route decides again at the next line): this line
            # goes by its record, never an error into the worker that logs it.
            return False
        _, created, msecs = record_clock()
        text = (
            f"{formatter.info_head(created, msecs, _LOGGER)}{line.head}{job_id}{line.middle}"
            f"{attempt} seconds={seconds_text(seconds)}"
        )
        self._hold_taken(text, logging.INFO, line.event)
        return True

    def _hold_taken(self, line: str, level: int, event: str) -> None:
        """Hold a line taken without its record. The handler's own lock taken directly:
        acquire() and release() are two calls more around it, at a line per finished attempt
        (issue 44)."""
        with self.lock:  # type: ignore[union-attr]  # every Handler has one (createLock)
            try:
                self._hold(line, level, event)
            except RecursionError:
                raise
            except Exception:
                pass  # as handleError does by default: a log line never fails its caller

    def _hold(self, line: str, level: int, event: object) -> None:
        now = time.monotonic()
        if not self._held:
            self._first_held = now
        self._held.append(line)
        if (
            level >= logging.WARNING
            or not (type(event) is str and event.startswith(_BATCHED))
            or now - self._first_held >= BATCH_SECONDS
            or len(self._held) >= _BATCH_LINES
        ):
            self.flush()

    def flush_overdue(self) -> None:
        """``flush`` once the oldest line held has waited BATCH_SECONDS (logs.FlushHeldLines,
        in a pass of the worker's loop that does not wait for I/O)."""
        if self._held and time.monotonic() - self._first_held >= BATCH_SECONDS:
            self.flush()

    def flush(self) -> None:
        self.acquire()
        try:
            if not self._held:
                return
            text = self.terminator.join(self._held) + self.terminator
            self._held.clear()
            stream = sys.stderr
            stream.write(text)
            stream.flush()
        except Exception:
            pass  # a closed or broken stderr: nothing left to tell it with
        finally:
            self.release()

    def drop_held(self) -> None:
        self._held.clear()


def _drop_held(handler: weakref.ref[_Stderr]) -> None:
    held = handler()
    if held is not None:
        held.drop_held()


# The logger every jobs_trio line is logged on, by name (take_line's lines).
_LOGGER = _jobs_logger.name
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
