# Structured log lines: one stable event name per line, then key=value fields (logfmt).
# Apart so every module logs the same shape, and tests can match on the event name.
from __future__ import annotations

import logging
from collections.abc import Mapping

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
    # Made here, not by logger.log(): that walks the stack for the caller's file and line, which
    # would name this function for every line anyway (a tenth of a line's cost, at one line per
    # finished attempt).
    record = logger.makeRecord(
        logger.name,
        level,
        __file__,
        0,
        _Line(event, fields),
        (),
        None,
        func="log_event",
        extra={"event": event, "fields": fields},
    )
    logger.handle(record)
