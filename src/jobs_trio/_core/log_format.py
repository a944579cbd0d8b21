# How a log record looks on a stream: `text` for people, `logfmt` and `json` for log pipelines,
# one line per record in both. Apart from logs.py (what a line says) so that an application can
# use these formatters for its own handlers, and the CLI picks one with --log-format.
from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Mapping
from typing import Any, Final, cast

from .render import visible

FORMATS: Final = ("text", "logfmt", "json")
LEVELS: Final = ("debug", "info", "warning", "error")

# A logfmt value that needs no quotes: no blank, quote, equals sign or backslash, and printable.
_BARE = re.compile(r'[^\s"=\\]+')
# The same for plain ASCII, in one match: printable, and none of blank, ", = or \. Most values
# (ids, names, numbers) are, and a worker logs a line per finished attempt.
_BARE_ASCII = re.compile(r"[!#-<>-\[\]-~]+")
# Whether a text is such a value (an id a worker logs on every attempt's line: logs.AttemptLine).
is_bare_ascii = _BARE_ASCII.fullmatch


def logfmt_value(value: object) -> str:
    """``value`` as a logfmt value: bare when it can be, else in double quotes with ``"``, ``\\``
    and every unprintable character escaped (``\\n``, ``\\x1b``), so a record stays one line
    and a terminal shows what was logged rather than acting on it. None is empty (``key=``);
    a list or tuple is its items joined by commas."""
    kind = type(value)
    if kind is str and _BARE_ASCII.fullmatch(cast(str, value)):
        return cast(str, value)
    if kind is int:  # not a bool (its own type), not an IntEnum (its own str)
        return str(value)
    if kind is float:  # digits, a point and a sign, or inf / nan: never quoted
        return _as_text(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple | set | frozenset):
        value = ",".join(_as_text(item) for item in value)
    text = _as_text(value)
    if _BARE.fullmatch(text) and text.isprintable():
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = escaped.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return f'"{visible(escaped)}"'


def logfmt_pairs(fields: Mapping[str, object]) -> str:
    # logfmt_value's first two cases inline: a worker renders a line per finished attempt,
    # most of whose values are plain ASCII text and ints, and a call per value was a third of
    # the rendering.
    bare, parts = _BARE_ASCII.fullmatch, []
    for key, value in fields.items():
        kind = type(value)
        if (kind is str and bare(cast(str, value))) or kind is int:
            parts.append(f"{key}={value}")
        else:
            parts.append(f"{key}={logfmt_value(value)}")
    return " ".join(parts)


def event_of(record: logging.LogRecord) -> str | None:
    """The event name a jobs_trio line carries (``jobs.attempt.completed``); None for a record
    of another library (hypercorn, trio-asyncio) that reaches the same handler."""
    event = getattr(record, "event", None)
    return event if isinstance(event, str) else None


def below_the_line(fields: Mapping[str, object]) -> bool:
    """Whether a field is shown below its line in the text format (a multi-line value)."""
    for value in fields.values():  # noqa: SIM110 (a loop: no generator made, once a line)
        if isinstance(value, str) and "\n" in value:
            return True
    return False


def fields_of(record: logging.LogRecord) -> Mapping[str, object]:
    fields = getattr(record, "fields", None)
    return fields if isinstance(fields, Mapping) else {}


# The most of an exception's rendered traceback a line shows, its end kept (where the error is):
# a message of 10 MB was a 10 MB line, in every format.
MAX_EXCEPTION_CHARS: Final = 16_000


class _Exceptions(logging.Formatter):
    """A formatter whose exceptions are cut to MAX_EXCEPTION_CHARS and written with NUL and
    lone surrogates as visible escapes: a lone surrogate's JSON escape is refused by JSON
    readers (jq), so a JSON log line with one in its exception was lost to the pipeline."""

    def formatException(self, ei: Any) -> str:
        text = super().formatException(ei)
        if len(text) > MAX_EXCEPTION_CHARS:
            text = (
                f"… [{len(text) - MAX_EXCEPTION_CHARS} characters cut] "
                + text[-MAX_EXCEPTION_CHARS:]
            )
        return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def _utc(record: logging.LogRecord) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{stamp}.{int(record.msecs):03d}Z"


class TextFormatter(_Exceptions):
    """``2026-12-02 10:00:00,123 INFO jobs_trio: jobs.attempt.completed job=mail.send ...``:
    the record's one-line message, then any multi-line field (a traceback) below it,
    indented, where a person reads it best."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._second: tuple[int, str] = (-1, "")
        self._head: tuple[tuple[int, float, str, str], str] = ((-1, 0.0, "", ""), "")
        self._info: tuple[int, float, str, str] = (-1, 0.0, "", "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        return self._time(record.created, record.msecs)

    def _time(self, created: float, msecs: float) -> str:
        # The same text for every line of a second, made once: strftime is a fifth of a short
        # line's cost, at a line per finished attempt.
        second = int(created)
        if self._second[0] != second:
            shown = time.strftime(self.default_time_format, self.converter(created))
            self._second = (second, shown)
        return f"{self._second[1]},{int(msecs):03d}"  # logging's default_msec_format

    def event_line(
        self, created: float, msecs: float, level: str, name: str, message: str
    ) -> str | None:
        """The line ``format`` makes of a jobs_trio record with these values and nothing below
        its line, made from them (``logs.log_event``'s way past the record); None when this
        formatter is a subclass's, which may make its lines otherwise."""
        if type(self) is not TextFormatter:
            return None
        # What comes before the message, made once for the lines of one millisecond (a batch
        # of finished attempts logs in one): the stamp and its format were a sixth of a line.
        key = (int(created), msecs, level, name)
        head = self._head
        if head[0] != key:
            head = self._head = (key, f"{self._time(created, msecs)} {level} {name}: ")
        return (head[1] + message).rstrip()

    def info_head(self, created: float, msecs: float, name: str) -> str:
        """What ``event_line`` puts before the message of an INFO line of logger ``name``, kept
        for the lines of one millisecond: a worker's line per finished attempt (its message
        never ends in a blank, which event_line strips). The level's name is read with the
        stamp (``logging.addLevelName`` may rename INFO)."""
        second = int(created)
        info = self._info
        if info[0] != second or info[1] != msecs or info[3] is not name:
            level = logging.getLevelName(logging.INFO)
            head = f"{self._time(created, msecs)} {level} {name}: "
            info = self._info = (second, msecs, head, name)
        return info[2]

    def format(self, record: logging.LogRecord) -> str:
        # A jobs_trio line with nothing below it (no traceback field, no exception), as a worker
        # logs one per finished attempt: the line logging.Formatter.format would make, made
        # without its general machinery (a third of a line's cost, issue 35).
        # Not for a subclass (its own formatMessage), nor a record with a traceback already
        # rendered (exc_text, as a SocketHandler delivers one).
        fields = getattr(record, "fields", None)
        if (
            type(self) is TextFormatter
            and type(getattr(record, "event", None)) is str
            and type(fields) is dict
            and not record.exc_info
            and not record.exc_text
            and not record.stack_info
            and not below_the_line(fields)
        ):
            record.message = record.getMessage()
            record.asctime = self.formatTime(record)
            return f"{record.asctime} {record.levelname} {record.name}: {record.message}".rstrip()
        if record.exc_info and event_of(record) is not None:
            # A jobs_trio line about an exception shows it once, below the line and indented
            # like a field: its traceback field when it has one (the same text), else the
            # exception. logging's own way appends it unindented, after the field.
            record.message = record.getMessage()
            if self.usesTime():
                record.asctime = self.formatTime(record, self.datefmt)
            text = self.formatMessage(record)
            if not _has_traceback(record):
                text += _below("exception", self.formatException(record.exc_info))
            return text
        return super().format(record)

    def formatMessage(self, record: logging.LogRecord) -> str:
        event = event_of(record)
        if event is None:
            return super().formatMessage(record)
        fields = fields_of(record)
        below = {k: v for k, v in fields.items() if isinstance(v, str) and "\n" in v}
        if not below:
            # One line: the message format() took from getMessage() is that line already.
            return super().formatMessage(record).rstrip()
        # record.message is each formatter's own (format() sets it from getMessage() first).
        inline = {k: v for k, v in fields.items() if k not in below}
        record.message = f"{event} {logfmt_pairs(inline)}"
        line = super().formatMessage(record).rstrip()
        for key, value in below.items():
            assert isinstance(value, str)
            line += _below(key, value)
        return line


def _below(key: str, value: str) -> str:
    """A multi-line value as the text format shows it under its line: its name indented 4,
    each of its lines 6, as they are (a traceback's own indents kept)."""
    shown = "\n".join(f"      {visible(part)}" for part in value.split("\n"))
    return f"\n    {key}:\n{shown}"


def _has_traceback(record: logging.LogRecord) -> bool:
    """Whether a jobs_trio record carries its exception's traceback as a field (the failure's
    line): the formatters show that one and not the exception's again."""
    return "traceback" in fields_of(record)


class LogfmtFormatter(_Exceptions):
    """``time=2026-12-02T10:00:00.123Z level=info logger=jobs_trio event=jobs.attempt.completed
    job=mail.send ...``: one line a record. A line of another library has ``msg=`` where a
    jobs_trio line has ``event=`` and its fields; an exception is ``exception="..."``."""

    def format(self, record: logging.LogRecord) -> str:
        head: dict[str, object] = {
            "time": _utc(record),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        event = event_of(record)
        if event is None:
            head["msg"] = record.getMessage()
        else:
            head["event"] = event
            head.update((k, v) for k, v in fields_of(record).items() if k not in head)
        if record.exc_info and not (event is not None and _has_traceback(record)):
            head["exception"] = self.formatException(record.exc_info)
        return logfmt_pairs(head)


class JsonFormatter(_Exceptions):
    """One JSON object a line (docs/logging.md, "Record schema"): ``time``, ``level``,
    ``logger``, ``message``; a jobs_trio line also ``event`` and ``fields`` (an object: the
    values as logged, a tuple as an array, anything JSON has no form for as its text); an
    exception ``exception``. Never raises for what a field holds: a log line must not be what
    fails a worker."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": _utc(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        event = event_of(record)
        if event is not None:
            document["event"] = event
            document["fields"] = dict(fields_of(record))
        if record.exc_info and not (event is not None and _has_traceback(record)):
            document["exception"] = self.formatException(record.exc_info)
        try:
            return json.dumps(document, default=_as_text)
        except (ValueError, RecursionError):  # a circular value, a nesting past the encoder's
            document["fields"] = {k: _as_text(v) for k, v in fields_of(record).items()}
            return json.dumps(document, default=_as_text)


def _as_text(value: object) -> str:
    """A value JSON has no form for, as its text; never raises (a hostile ``__str__``).
    A float is written out in positional digits: a duration of 81 µs read as ``8.1e-05``
    breaks every ``seconds=\\d+\\.\\d+`` pattern a pipeline greps a line with."""
    if isinstance(value, float) and math.isfinite(value):
        shown = repr(value)
        return _positional(shown) if "e" in shown else shown
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__name__} that cannot be shown>"


def formatter(name: str) -> logging.Formatter:
    """The formatter for ``--log-format NAME`` (one of FORMATS)."""
    chosen: type[logging.Formatter] = {
        "text": TextFormatter,
        "logfmt": LogfmtFormatter,
        "json": JsonFormatter,
    }[name]
    return chosen()


def _positional(shown: str) -> str:
    """A float's shortest repr in e-notation (``8.1e-05``) in positional digits (``0.000081``),
    the same digits: what ``format(Decimal(shown), "f")`` makes, at a fifth of its cost (a
    worker logs a duration per finished attempt, and most are below 0.0001 s)."""
    mantissa, _, exponent = shown.partition("e")
    sign = "-" if mantissa.startswith("-") else ""
    mantissa = mantissa.lstrip("-")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    point = len(whole) + int(exponent)
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"
