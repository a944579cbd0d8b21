# Structured log lines: one stable event name per line, then key=value fields (logfmt).
# Apart so every module logs the same shape, and tests can match on the event name.
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Final

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
    logger.handle(_record(level, event, fields))


def _record(level: int, event: str, fields: Mapping[str, object]) -> logging.LogRecord:
    """The record of one line. Made here, not by logger.log(): that walks the stack for the
    caller's file and line, which would name this function for every line anyway. And where
    the application left logging's record factory and logger class as they are, made without
    LogRecord's constructor, which works out the same file name and module for every line
    (a quarter of a line's cost, at a line per finished attempt: issue 35); every attribute is
    set as the constructor sets it."""
    line = _Line(event, fields)
    if (
        logging.getLogRecordFactory() is not logging.LogRecord
        or type(logger).makeRecord is not logging.Logger.makeRecord
    ):
        extra = {"event": event, "fields": fields}
        return logger.makeRecord(
            logger.name, level, __file__, 0, line, (), None, func="log_event", extra=extra
        )
    now = time.time()
    record = logging.LogRecord.__new__(logging.LogRecord)
    values = record.__dict__
    values.update(_CONSTANT)
    values["msg"] = line
    values["levelname"] = logging.getLevelName(level)
    values["levelno"] = level
    values["created"] = now
    values["msecs"] = int((now - int(now)) * 1000) + 0.0
    values["relativeCreated"] = (now - _STARTED) * 1000
    if logging.logThreads:
        values["thread"] = threading.get_ident()
        values["threadName"] = threading.current_thread().name
    else:
        values["thread"] = values["threadName"] = None
    values["processName"] = _process_name()
    values["process"] = os.getpid() if logging.logProcesses else None
    values["event"] = event
    values["fields"] = fields
    return record


# What LogRecord sets the same for every line log_event makes (see _record).
_CONSTANT: Final[Mapping[str, object]] = {
    "name": logger.name,
    "args": (),
    "pathname": __file__,
    "filename": os.path.basename(__file__),
    "module": os.path.splitext(os.path.basename(__file__))[0],
    "exc_info": None,
    "exc_text": None,
    "stack_info": None,
    "lineno": 0,
    "funcName": "log_event",
    **({"taskName": None} if sys.version_info >= (3, 12) else {}),
}
# logging's own start time, which relativeCreated counts from.
_STARTED: Final[float] = getattr(logging, "_startTime", time.time())


def _process_name() -> str | None:
    """As LogRecord names the process."""
    if not logging.logMultiprocessing:
        return None
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None:
        return "MainProcess"
    try:
        return str(multiprocessing.current_process().name)
    except Exception:
        return "MainProcess"


def flush_log_handlers() -> None:
    """Flush every handler a jobs_trio line reaches: called by a worker as it waits for work,
    so that a handler writing lines in batches (the CLI's) shows a quiet worker's last lines."""
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            handler.flush()
        current = current.parent if current.propagate else None
