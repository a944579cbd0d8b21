# Structured log lines: one stable event name per line, then key=value fields (logfmt).
# Apart so every module logs the same shape, and tests can match on the event name.
from __future__ import annotations

import logging

from .log_format import logfmt_pairs

logger = logging.getLogger("jobs_trio")


def log_event(event: str, level: int = logging.INFO, **fields: object) -> None:
    """Log ``event`` with ``fields``: the message is one logfmt line (``event key=value ...``)
    for any handler, and ``record.event`` / ``record.fields`` carry both as they were given
    (docs/logging.md, "Record schema"), for log_format's formatters and the application's."""
    if not logger.isEnabledFor(level):
        return
    line = f"{event} {logfmt_pairs(fields)}".rstrip()
    logger.log(level, line, extra={"event": event, "fields": fields})
