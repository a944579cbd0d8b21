# Structured log lines: one stable event name per line, then key=value fields (logfmt).
# Apart so every module logs the same shape, and tests can match on the event name.
from __future__ import annotations

import logging
import sys
import time
import types
from collections.abc import Callable, Mapping
from typing import Final

import trio

from .log_format import logfmt_pairs

logger = logging.getLogger("jobs_trio")


class _Line:
    """A record's message, ``event key=value ...``: rendered when a handler first asks for it
    (``record.getMessage()``), once. A worker logs a line per finished attempt, and the text
    formatter that shows it would otherwise render the same fields a second time."""

    __slots__ = ("_event", "_fields", "_text")

    def __init__(self, event: str, fields: Mapping[str, object]) -> None:
        self._event = event
        self._fields = fields
        self._text: str | None = None

    def __str__(self) -> str:
        if self._text is None:
            self._text = f"{self._event} {logfmt_pairs(self._fields)}".rstrip()
        return self._text


def log_event(event: str, level: int = logging.INFO, **fields: object) -> None:
    """Log ``event`` with ``fields``: the message is one logfmt line (``event key=value ...``)
    for any handler, and ``record.event`` / ``record.fields`` carry both as they were given
    (docs/logging.md, "Record schema"), for log_format's formatters and the application's."""
    if not logger.isEnabledFor(level):
        return
    take_line = _line_taker(level)
    if take_line is not None:
        _, created, msecs = _clock()
        if take_line(level, event, fields, created, msecs):
            return
    logger.handle(_record(level, event, fields))


# A handler that can take a jobs_trio line without a record (the CLI's) has a ``take_line`` of
# this shape: it writes the text its formatter would make of the record (level, event, fields,
# created, msecs), or answers False and gets the record.
TakeLine = Callable[[int, str, Mapping[str, object], float, float], bool]


def _line_taker(level: int) -> TakeLine | None:
    """The one handler a record of ``level`` would reach, when nothing else would see the
    record (no filter on the way, no other handler, logging's own record factory and
    makeRecord) and it takes lines without one: a record made, handled and formatted was two
    thirds of a line's cost, at a line per finished attempt (issue 35)."""
    root = logger.parent
    if (
        logger.handlers
        or logger.filters
        or not logger.propagate
        or root is None
        or root.parent is not None
        or root.filters
        or len(root.handlers) != 1
    ):
        return None
    handler = root.handlers[0]
    take_line: TakeLine | None = getattr(handler, "take_line", None)
    if (
        take_line is None
        or handler.filters
        or level < handler.level
        or logging.getLogRecordFactory() is not logging.LogRecord
        or not _passes_as_logging_has_it()
    ):
        return None
    return take_line


def _passes_as_logging_has_it() -> bool:
    """Whether a record would pass through logging's own code on its way to the handlers:
    Logger.makeRecord, handle and callHandlers neither overridden nor wrapped (Sentry's logging
    integration wraps callHandlers to see every record; a tracer wraps makeRecord)."""
    kind, own = type(logger), vars(logger)
    return all(
        _plain(getattr(kind, name)) and name not in own
        for name in ("makeRecord", "handle", "callHandlers")
    )


def _clock() -> tuple[float, float, float]:
    """The clock as LogRecord reads it now: its reading (ns from 3.13, logging's start time's
    unit), ``created`` and ``msecs``."""
    if _NANOSECONDS:
        ns = time.time_ns()
        created = ns / 1e9
        msecs = (ns % 1_000_000_000) // 1_000_000 + 0.0
        if msecs == 999.0 and int(created) != ns // 1_000_000_000:
            msecs = 0.0  # created rounded up into the next second: as 3.13's LogRecord has it
        return ns, created, msecs
    now = time.time()
    return now, now, int((now - int(now)) * 1000) + 0.0


def _record(level: int, event: str, fields: Mapping[str, object]) -> logging.LogRecord:
    """The record of one line. Made here, not by logger.log(): that walks the stack for the
    caller's file and line, which would name this function for every line anyway."""
    extra = {"event": event, "fields": fields}
    return logger.makeRecord(
        logger.name,
        level,
        __file__,
        0,
        _Line(event, fields),
        (),
        None,
        func="log_event",
        extra=extra,
    )


def _plain(make_record: object) -> bool:
    """Whether ``make_record`` is logging's own Logger.makeRecord: not a subclass's, and not
    wrapped or replaced in place (a tracer that adds its ids to every record patches it)."""
    return type(make_record) is types.FunctionType and make_record.__module__ == "logging"


_NANOSECONDS: Final = sys.version_info >= (3, 13)


def flush_held_lines() -> None:
    """Write what a handler that holds lines back (``holds_lines_back``, the CLI's) holds, for
    every handler a jobs_trio line reaches; an application's own handlers are left alone."""
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if getattr(handler, "holds_lines_back", False):
                handler.flush()
        current = current.parent if current.propagate else None


class FlushHeldLines(trio.abc.Instrument):
    """Installed by a worker for its run: each time its Trio loop is about to wait for I/O
    (the worker has nothing left to do in this pass: a round trip, a wake-up, a thread), the
    lines held back are written. A held line so waits a scheduling pass at most, unless a body
    blocks the loop; and a worker that is draining, or waiting for a sync body, writes its
    lines as it goes."""

    def before_io_wait(self, timeout: float) -> None:
        flush_held_lines()
