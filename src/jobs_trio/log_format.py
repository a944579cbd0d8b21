# The CLI's log formats, public for an application's own handlers: text, logfmt and JSON lines
# with the documented record schema (docs/logging.md).
from __future__ import annotations

from ._core.log_format import JsonFormatter, LogfmtFormatter, TextFormatter, formatter

__all__ = ["JsonFormatter", "LogfmtFormatter", "TextFormatter", "formatter"]
