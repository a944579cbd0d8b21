# Structured log lines: one stable event name per line, then key=value fields.
# Apart so every module logs the same shape, and tests can match on the event name.
# Internal: not part of the public API (docs/reference.md lists the public modules).
from __future__ import annotations

import logging

logger = logging.getLogger("jobs_trio")


def log_event(event: str, level: int = logging.INFO, **fields: object) -> None:
    """Log ``event`` with ``fields`` as text and as ``record.event`` / ``record.fields``."""
    if not logger.isEnabledFor(level):
        return
    text = " ".join(f"{k}={v!r}" for k, v in fields.items())
    logger.log(level, f"{event} {text}".rstrip(), extra={"event": event, "fields": fields})
