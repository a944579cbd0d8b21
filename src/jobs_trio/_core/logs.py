# Structured log lines: one stable event name per line, then key=value fields (logfmt).
# Apart so every module logs the same shape, and tests can match on the event name.
from __future__ import annotations

import contextlib
import logging
import sys
import time
import types
from collections.abc import Callable, Iterator, Mapping
from threading import get_ident
from typing import Final

import trio

from .log_format import is_bare_ascii, logfmt_pairs, logfmt_value

logger = logging.getLogger("jobs_trio")


class _Line:
    """A record's message, ``event key=value ...``: rendered when a handler first asks for it
    (``record.getMessage()``), once. A worker logs a line per finished attempt, and the text
    formatter that shows it would otherwise render the same fields a second time."""

    __slots__ = ("_event", "_fields", "_text", "_without_traceback")

    def __init__(
        self, event: str, fields: Mapping[str, object], without_traceback: bool = False
    ) -> None:
        self._event = event
        self._fields = fields
        self._text: str | None = None
        # A record that carries its exception (exc_info) has it shown by the formatter, from
        # the exception: the ``traceback`` field, the same text, is not repeated in the message
        # (a JSON line carried it twice, issue 46).
        self._without_traceback = without_traceback

    def __str__(self) -> str:
        if self._text is None:
            fields = self._fields
            if self._without_traceback and "traceback" in fields:
                fields = {k: v for k, v in fields.items() if k != "traceback"}
            self._text = f"{self._event} {logfmt_pairs(fields)}".rstrip()
        return self._text


def log_event(event: str, level: int = logging.INFO, **fields: object) -> None:
    """Log ``event`` with ``fields``: the message is one logfmt line (``event key=value ...``)
    for any handler, and ``record.event`` / ``record.fields`` carry both as they were given
    (docs/logging.md, "Record schema"), for log_format's formatters and the application's."""
    if not logger.isEnabledFor(level):
        return
    take_line = _ROUTE.taker(level)
    if take_line is not None:
        _, created, msecs = record_clock()
        if take_line(level, event, fields, created, msecs):
            return
    logger.handle(_record(level, event, fields))


def log_exception(event: str, level: int, exc_info: ExcInfo, **fields: object) -> None:
    """``log_event`` for a line about an exception: its record carries it (``exc_info``), so a
    handler that takes one (an error tracker's: Sentry's logging integration, a
    logger.exception-style handler) receives the exception itself, not its text alone."""
    if logger.isEnabledFor(level):
        logger.handle(_record(level, event, fields, exc_info))


# An exception as a record carries it: its type, itself, and the traceback to show.
ExcInfo = tuple[type[BaseException], BaseException, types.TracebackType | None]

# A handler that can take a jobs_trio line without a record (the CLI's) has a ``take_line`` of
# this shape: it writes the text its formatter would make of the record (level, event, fields,
# created, msecs), or answers False and gets the record.
TakeLine = Callable[[int, str, Mapping[str, object], float, float], bool]


class AttemptLine:
    """The INFO line of one kind of attempt's ending for one job of one queue
    (``jobs.attempt.completed job_id=... job=... queue=... attempt=1 seconds=0.0123``), its
    fixed fields rendered once: a worker logs one a finished attempt, and a line rendered
    field by field was a sixth of what a no-op job cost it (issue 44). The text and the record
    are the ones ``log_event`` makes of the same fields."""

    __slots__ = ("event", "head", "job", "middle", "queue")

    def __init__(self, event: str, job: str, queue: str) -> None:
        self.event, self.job, self.queue = event, job, queue
        # The line's message is head + job_id + middle + attempt + " seconds=" + seconds_text().
        self.head = f"{event} job_id="
        self.middle = f" {logfmt_pairs({'job': job, 'queue': queue})} attempt="

    def log(self, job_id: str, attempt: int, seconds: float) -> None:
        if not logger.isEnabledFor(logging.INFO):
            return
        take_attempt = _ROUTE.attempt_taker()
        # A bare id and an int attempt: the message is the fixed parts and these, as
        # logfmt_pairs would render the fields below (the handler makes it).
        if (
            take_attempt is not None
            and type(attempt) is int
            and is_bare_ascii(job_id)
            and take_attempt(self, job_id, attempt, seconds)
        ):
            return
        seconds = round(seconds, 6)
        fields = {
            "job_id": job_id,
            "job": self.job,
            "queue": self.queue,
            "attempt": attempt,
            "seconds": seconds,
        }
        logger.handle(_record(logging.INFO, self.event, fields))


def seconds_text(seconds: float) -> str:
    """A duration rounded to 6 decimals as ``logfmt_value`` shows it (``0.000081``, ``0.5``,
    ``12.0``), made with one format where it took a repr and a rewrite of its e-notation: below
    a billion seconds a value of 6 decimals or fewer has no shorter repr than its digits. The
    format rounds as ``round(seconds, 6)`` does (both from the exact binary value): a value
    rounded first shows the same text."""
    if -1e9 < seconds < 1e9:
        text = f"{seconds:.6f}".rstrip("0")
        return text + "0" if text[-1] == "." else text
    return logfmt_value(round(seconds, 6))


# A handler's way past the record for an attempt's INFO line (``AttemptLine``): its
# ``take_attempt`` makes the line from the line's fixed parts and its values, and holds it, in
# one call: the calls between rendering the message and holding its line were most of a line's
# cost, at a line per finished attempt (issue 44).
TakeAttempt = Callable[["AttemptLine", str, int, float], bool]


class _Route:
    """Where a jobs_trio line goes: to the one handler that takes lines without a record, or by
    its record. Decided once and kept while the logging setup it was decided on stands: a line
    looks at that setup's identity (``_setup``), a few attribute reads, where deciding anew
    walked it with a call per check (issue 44). A handler or filter added or removed, a
    handler's formatter set, a record factory, a logger method patched (Sentry's logging
    integration, a tracer), propagation turned off: each changes the identity, and the next
    look decides again. On the thread of a Trio loop a worker runs in (``lines_by_pass``) the
    look is once a pass of that loop, not once a line: at a line per finished attempt it was
    the twelfth part of a no-op job's instructions (issue 44). A cache, so module state: one
    per process, like logging's own."""

    __slots__ = ("_checked_in", "_handler", "_passes", "_setup", "_take_attempt", "_take_line")

    def __init__(self) -> None:
        self._setup: tuple[object, ...] | None = None
        self._handler: logging.Handler | None = None
        self._take_line: TakeLine | None = None
        self._take_attempt: TakeAttempt | None = None
        # Threads whose Trio run tells the route each pass (``lines_by_pass``): the run's token
        # and how many workers there asked for it. A look at the setup made by a task of that
        # run holds until the pass ends.
        self._passes: dict[int, tuple[trio.lowlevel.TrioToken, int]] = {}
        # The thread whose loop's current pass has looked at the setup (None: no pass has):
        # cleared as any watched loop's pass ends, so at worst a look is made again.
        self._checked_in: int | None = None

    def _handler_now(self) -> logging.Handler | None:
        thread = get_ident()
        if self._checked_in == thread:
            return self._handler
        setup = _setup()
        if setup != self._setup:
            self._setup = setup
            before = self._handler
            handler = self._handler = _line_handler()
            self._take_line = getattr(handler, "take_line", None)
            self._take_attempt = getattr(handler, "take_attempt", None)
            if before is not None and before is not handler:
                # What it holds goes first, and is not lost with it (a handler replaced or
                # removed is flushed by nothing else).
                _write_held(before)
        watched = self._passes.get(thread)
        if watched is not None and _in_run_of(watched[0]):
            self._checked_in = thread
        return self._handler

    def pass_ended(self) -> None:
        """A watched loop's pass ends: the next line there (or anywhere) looks again."""
        self._checked_in = None

    def watch_passes(self) -> None:
        """This thread's Trio run tells the route each pass (a worker's run begins)."""
        thread, run = get_ident(), trio.lowlevel.current_trio_token()
        watched = self._passes.get(thread)
        # One left by an earlier run on this thread (a guest run its host abandoned) counts
        # for nothing: only this run's passes end here now.
        workers = watched[1] if watched is not None and watched[0] is run else 0
        self._passes[thread] = (run, workers + 1)
        self._checked_in = None

    def unwatch_passes(self) -> None:
        """A worker's run ends: while none is left in this thread's run, lines look each time."""
        thread, run = get_ident(), trio.lowlevel.current_trio_token()
        watched = self._passes.get(thread)
        if watched is not None and watched[0] is run:
            if watched[1] > 1:
                self._passes[thread] = (run, watched[1] - 1)
            else:
                del self._passes[thread]
        # Whatever is left watching, the next line looks: this thread's loop may run on
        # without a worker telling the route its passes.
        self._checked_in = None

    @property
    def handler(self) -> logging.Handler | None:
        """The handler the last look sent lines to without their records (None: by records)."""
        return self._handler

    def taker(self, level: int) -> TakeLine | None:
        handler = self._handler_now()
        if handler is None or level < handler.level:
            return None
        return self._take_line

    def attempt_taker(self) -> TakeAttempt | None:
        """``take_attempt`` of the handler an INFO line goes to, if it takes one."""
        handler = self._handler_now()
        if handler is None or handler.level > logging.INFO:
            return None
        return self._take_attempt


_ROUTE: Final = _Route()


def _in_run_of(run: trio.lowlevel.TrioToken) -> bool:
    """Whether this is a task of the Trio run ``run`` is the token of: in guest mode the host's
    own code runs on the same thread between passes, and a later run may follow an abandoned
    one there; neither has its passes told to the route."""
    return trio.lowlevel.in_trio_task() and trio.lowlevel.current_trio_token() is run


def _setup() -> tuple[object, ...]:
    """What ``_line_handler`` reads, by identity and size: equal while the decision stands.
    Sizes read from ``__dict__`` (``vars`` is the same dict, by a call): read at every line,
    the calls were a fifth of a line's cost (issue 44)."""
    root = logger.parent
    kind = type(logger)
    own = logger.handlers
    head = (
        root,
        own,
        len(own),
        len(logger.filters),
        logger.propagate,
        len(logger.__dict__),
        kind.makeRecord,
        kind.handle,
        kind.callHandlers,
        logging.getLogRecordFactory(),
    )
    # Extended below by concatenation, not unpacking (*head): that cost this function a third more.
    if root is None:
        return head
    handlers = root.handlers
    if len(handlers) != 1:
        return head + (root.parent, handlers, len(handlers), len(root.filters))  # noqa: RUF005
    handler = handlers[0]
    formatter = handler.formatter
    return head + (  # noqa: RUF005
        root.parent,
        handlers,
        len(root.filters),
        handler,
        len(handler.filters),
        len(handler.__dict__),
        formatter,
        len(formatter.__dict__) if formatter is not None else 0,
    )


def _line_taker(level: int) -> TakeLine | None:
    """The one handler a record of ``level`` would reach and that takes its line without the
    record (``_line_handler``), else None."""
    return _ROUTE.taker(level)


def _line_handler() -> logging.Handler | None:
    """The one handler a record would reach, when nothing else would see the record (no filter
    on the way, no other handler, logging's own record factory and makeRecord) and it takes
    lines without one: a record made, handled and formatted was two thirds of a line's cost, at
    a line per finished attempt (issue 35)."""
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
    takes_lines = getattr(handler, "takes_lines", None)
    if (
        takes_lines is None
        or not takes_lines()
        or handler.filters
        or logging.getLogRecordFactory() is not logging.LogRecord
        or not _passes_as_logging_has_it()
    ):
        return None
    return handler


def _passes_as_logging_has_it() -> bool:
    """Whether a record would pass through logging's own code on its way to the handlers:
    Logger.makeRecord, handle and callHandlers neither overridden nor wrapped (Sentry's logging
    integration wraps callHandlers to see every record; a tracer wraps makeRecord)."""
    kind, own = type(logger), vars(logger)
    return all(
        _plain(getattr(kind, name)) and name not in own
        for name in ("makeRecord", "handle", "callHandlers")
    )


def record_clock() -> tuple[float, float, float]:
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


def _record(
    level: int, event: str, fields: Mapping[str, object], exc_info: ExcInfo | None = None
) -> logging.LogRecord:
    """The record of one line. Made here, not by logger.log(): that walks the stack for the
    caller's file and line, which would name this function for every line anyway."""
    extra = {"event": event, "fields": fields}
    return logger.makeRecord(
        logger.name,
        level,
        __file__,
        0,
        _Line(event, fields, exc_info is not None),
        (),
        exc_info,
        func="log_event",
        extra=extra,
    )


def _plain(make_record: object) -> bool:
    """Whether ``make_record`` is logging's own Logger.makeRecord: not a subclass's, and not
    wrapped or replaced in place (a tracer that adds its ids to every record patches it)."""
    return type(make_record) is types.FunctionType and make_record.__module__ == "logging"


_NANOSECONDS: Final = sys.version_info >= (3, 13)


def flush_held_lines(*, overdue_only: bool = False) -> None:
    """Write what a handler that holds lines back (``holds_lines_back``, the CLI's) holds, for
    every handler a jobs_trio line reaches; an application's own handlers are left alone.
    ``overdue_only``: only lines held as long as the handler holds any (its ``flush_overdue``;
    a handler without one writes all it holds)."""
    reached = False
    routed = _ROUTE.handler
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            reached = reached or handler is routed
            _write_held(handler, overdue_only=overdue_only)
        current = current.parent if current.propagate else None
    if routed is not None and not reached:
        # Removed since lines went to it without their records (until the next line looks
        # again, within a worker's pass, they still do): what it holds is written all the same.
        _write_held(routed)


def _write_held(handler: logging.Handler, *, overdue_only: bool = False) -> None:
    if getattr(handler, "holds_lines_back", False):
        overdue = getattr(handler, "flush_overdue", None) if overdue_only else None
        if overdue is not None:
            overdue()
        else:
            handler.flush()


class FlushHeldLines(trio.abc.Instrument):
    """Installed by a worker for its run: each time its Trio loop is about to wait for I/O
    (the worker has nothing left to do: a round trip, a wake-up, a thread), the lines held back
    are written. A held line so waits until the loop next waits, or its handler's limit on a
    held line's age (the CLI's BATCH_SECONDS) if the loop stays busy that long, unless a body
    blocks the loop; and a worker that is draining, or waiting for a sync body, writes its
    lines as it goes."""

    def before_io_wait(self, timeout: float) -> None:
        # A timeout of 0 is a pass with tasks still to run: the loop does not wait, and a write
        # at each such pass was ~2% of a no-op job's CPU at concurrency 10 (a pass ran ~10
        # jobs). Those lines wait for the next real wait, or their handler's own limit on a
        # held line's age, checked here too: a loop that never waits still writes them.
        try:
            flush_held_lines(overdue_only=timeout <= 0)
        finally:
            # A pass ends (whether or not the loop waits): the setup a line goes by is looked
            # at again (the route's once-a-pass look), even if a write above failed (Trio then
            # drops this instrument, and no pass of this run would end here again).
            _ROUTE.pass_ended()


@contextlib.contextmanager
@trio.lowlevel.enable_ki_protection  # no Ctrl-C between a registration and its undoing
def lines_by_pass() -> Iterator[None]:
    """A worker's run, on its Trio loop's thread: the lines held back written each time the
    loop waits (``FlushHeldLines``), and where a line goes decided once a pass of the loop
    rather than at each line (``_Route``). A change to the logging setup made while it runs
    is seen from the loop's next pass: a line logged later in the pass that made the change
    (by the task that made it, or another) goes where the setup sent lines as that pass
    looked. Lines from any other thread look at each line, as they do outside a worker."""
    flush_lines = FlushHeldLines()
    trio.lowlevel.add_instrument(flush_lines)
    _ROUTE.watch_passes()
    try:
        yield
    finally:
        _ROUTE.unwatch_passes()
        with contextlib.suppress(KeyError):  # dropped by Trio already: its hook raised
            trio.lowlevel.remove_instrument(flush_lines)
        flush_held_lines()
