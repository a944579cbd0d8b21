# Log records as text, logfmt and JSON (issue 36): logfmt values that stay one line and show
# what a terminal would act on, a JSON line per record with the documented schema whatever a
# field holds, the text format's traceback below its line, and the CLI's level and format.
from __future__ import annotations

import argparse
import json
import logging
import sys

import pytest

from jobs_trio._cli.logging_flags import configure_logging
from jobs_trio._core.errors import ConfigError
from jobs_trio._core.log_format import (
    JsonFormatter,
    LogfmtFormatter,
    TextFormatter,
    logfmt_value,
)
from jobs_trio._core.logs import log_event


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("plain", "plain"),
        ("vm:1:ab", "vm:1:ab"),
        ("two words", '"two words"'),
        ("", '""'),
        ('say "hi"', '"say \\"hi\\""'),
        ("a=b", '"a=b"'),
        ("back\\slash", '"back\\\\slash"'),
        ("line\nnext", '"line\\nnext"'),
        ("\x1b[31mred", '"\\x1b[31mred"'),
        ("rtl\u202eevil", '"rtl\\u202eevil"'),
        (None, ""),
        (True, "true"),
        (3, "3"),
        (-42, "-42"),
        ("café", "café"),  # printable beyond ASCII stays bare
        ("tab\tin", '"tab\\tin"'),
        ("~!#<>[]", "~!#<>[]"),
        (0.25, "0.25"),
        # A fast attempt's seconds: positional digits, never 8.1e-05.
        (8.1e-05, "0.000081"),
        (1e-9, "0.000000001"),
        (3.0, "3.0"),
        (("a", "b"), "a,b"),
    ],
)
def test_a_logfmt_value_is_one_line_and_shows_what_a_terminal_would_act_on(
    value: object, shown: str
) -> None:
    assert logfmt_value(value) == shown


def record_of(event: str, level: int = logging.INFO, **fields: object) -> logging.LogRecord:
    """The record log_event makes, caught on its way out."""
    caught: list[logging.LogRecord] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            caught.append(record)

    logger = logging.getLogger("jobs_trio")
    handler = Catch()
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        log_event(event, level, **fields)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    [record] = caught
    return record


TRACEBACK = 'Traceback (most recent call last):\n  File "app.py", line 3\nRuntimeError: "no"'


def test_the_message_is_logfmt_for_any_handler() -> None:
    record = record_of("jobs.attempt.failed", job="mail.send", error='it said "no"\nthen left')
    assert record.getMessage() == (
        'jobs.attempt.failed job=mail.send error="it said \\"no\\"\\nthen left"'
    )
    assert record.event == "jobs.attempt.failed"  # type: ignore[attr-defined]
    assert record.fields == {"job": "mail.send", "error": 'it said "no"\nthen left'}  # type: ignore[attr-defined]


def test_a_percent_sign_in_a_field_is_printed_as_it_is() -> None:
    record = record_of("jobs.attempt.failed", error="100% %s %(x)s")
    assert record.getMessage() == 'jobs.attempt.failed error="100% %s %(x)s"'


def test_json_is_one_object_a_line_with_the_documented_keys() -> None:
    record = record_of(
        "jobs.attempt.failed", job="mail.send", queues=("a", "b"), traceback=TRACEBACK
    )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    document = json.loads(line)
    assert set(document) == {"time", "level", "logger", "message", "event", "fields"}
    assert document["time"].endswith("Z") and document["level"] == "info"
    assert document["logger"] == "jobs_trio" and document["event"] == "jobs.attempt.failed"
    assert document["fields"] == {"job": "mail.send", "queues": ["a", "b"], "traceback": TRACEBACK}


def test_json_never_fails_on_what_a_field_holds() -> None:
    class Hostile:
        def __str__(self) -> str:
            raise RuntimeError("no str for you")

    record = record_of("jobs.odd", hostile=Hostile(), lone="\udcff", nul="a\x00b", big=10**50)
    fields = json.loads(JsonFormatter().format(record))["fields"]
    assert fields == {
        "hostile": "<Hostile that cannot be shown>",
        "lone": "\udcff",
        "nul": "a\x00b",
        "big": 10**50,
    }
    looped: list[object] = []
    looped.append(looped)
    record = record_of("jobs.odd", looped=looped, n=1)
    fields = json.loads(JsonFormatter().format(record))["fields"]
    assert fields == {"looped": "[[...]]", "n": "1"}  # the whole record as text, still a line


def test_another_librarys_record_has_a_message_and_no_event() -> None:
    record = logging.LogRecord(
        "hypercorn.error", logging.WARNING, __file__, 1, "bind %s", ("x",), None
    )
    document = json.loads(JsonFormatter().format(record))
    assert document["message"] == "bind x" and "event" not in document
    assert (
        LogfmtFormatter()
        .format(record)
        .endswith('level=warning logger=hypercorn.error msg="bind x"')
    )


def test_an_exception_is_a_field_of_its_one_line() -> None:
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        record = logging.LogRecord(
            "jobs_trio", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    for formatter in (JsonFormatter(), LogfmtFormatter()):
        line = formatter.format(record)
        assert "\n" not in line and "ValueError: bad" in line


def test_logfmt_puts_the_fields_after_the_event() -> None:
    record = record_of("jobs.attempt.completed", job="mail.send", attempt=1, seconds=0.5)
    line = LogfmtFormatter().format(record)
    assert line.startswith("time=") and line.endswith(
        " level=info logger=jobs_trio event=jobs.attempt.completed job=mail.send attempt=1"
        " seconds=0.5"
    )


def test_text_shows_a_traceback_below_its_line() -> None:
    record = record_of("jobs.attempt.failed", logging.WARNING, job="mail.send", traceback=TRACEBACK)
    text = TextFormatter().format(record)
    first, *rest = text.split("\n")
    assert first.endswith("WARNING jobs_trio: jobs.attempt.failed job=mail.send")
    assert rest == [
        "    traceback:",
        "      Traceback (most recent call last):",
        '        File "app.py", line 3',
        '      RuntimeError: "no"',
    ]


def test_the_cli_level_and_format_come_from_the_flags_else_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (tests/conftest.py gives the next test the root logger back as it was.)
    root = logging.getLogger()
    others = root.handlers[:]  # pytest's: left in place
    monkeypatch.setenv("JOBS_TRIO_LOG_LEVEL", "warning")
    monkeypatch.setenv("JOBS_TRIO_LOG_FORMAT", "json")
    configure_logging(argparse.Namespace(log_level=None, log_format=None))
    assert root.level == logging.WARNING
    [ours] = [h for h in root.handlers if h not in others]
    assert isinstance(ours.formatter, JsonFormatter)
    configure_logging(argparse.Namespace(log_level="debug", log_format="logfmt"))
    assert root.level == logging.DEBUG
    [ours] = [h for h in root.handlers if h not in others]  # replaced, not added to
    assert isinstance(ours.formatter, LogfmtFormatter)
    monkeypatch.setenv("JOBS_TRIO_LOG_FORMAT", "yaml")
    with pytest.raises(ConfigError, match=r"\$JOBS_TRIO_LOG_FORMAT is 'yaml'"):
        configure_logging(argparse.Namespace(log_level=None, log_format=None))


def test_an_applications_record_factory_makes_the_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = logging.getLogRecordFactory()

    def tagged(*args: object, **kwargs: object) -> logging.LogRecord:
        record = made(*args, **kwargs)
        record.tenant = "t-1"
        return record

    monkeypatch.setattr(logging, "_logRecordFactory", tagged)
    record = record_of("jobs.attempt.completed", job="mail.send")
    assert record.tenant == "t-1"  # type: ignore[attr-defined]
    assert record.event == "jobs.attempt.completed"  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", [8.1e-05, -1.5e-07, 1e16, 2.5e22, 1.2345678901234567e-300])
def test_a_small_or_large_float_is_shown_in_its_own_digits(value: float) -> None:
    from decimal import Decimal

    assert logfmt_value(value) == format(Decimal(repr(value)), "f")


def test_the_text_format_of_a_plain_line_is_logging_s_own() -> None:
    # The text formatter's short way for a line with nothing below it makes what
    # logging.Formatter makes with the same format.
    record = record_of("jobs.attempt.completed", job="mail.send", error="trailing ")
    general = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    fast = TextFormatter()
    assert fast.format(record) == general.format(record).rstrip()
    assert record.message == record.getMessage()


@pytest.mark.parametrize(
    ("created", "msecs", "level", "name"),
    [
        (1764669601.004, 4.0, "INFO", "jobs_trio"),  # the next second, the same millisecond
        (1764669600.005, 5.0, "INFO", "jobs_trio"),  # the next millisecond
        (1764669600.004, 4.0, "WARNING", "jobs_trio"),  # the same moment, another level
        (1764669600.004, 4.0, "INFO", "jobs_trio.other"),  # another logger
    ],
)
def test_each_line_of_the_text_format_has_its_own_moment_level_and_name(
    created: float, msecs: float, level: str, name: str
) -> None:
    # event_line keeps what comes before the message for the lines of one moment: a line of
    # another second, millisecond, level or logger has its own, as logging's format makes it.
    fast = TextFormatter()
    first = fast.event_line(1764669600.004, 4.0, "INFO", "jobs_trio", "jobs.attempt.completed")
    line = fast.event_line(created, msecs, level, name, "jobs.attempt.completed x=1")
    record = logging.LogRecord(name, logging.getLevelName(level), __file__, 0, "", (), None)
    record.created, record.msecs = created, msecs
    record.msg = "jobs.attempt.completed x=1"
    general = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    assert line == general.format(record)
    assert first is not None and line is not None and first.split(": ")[0] != line.split(": ")[0]


def cli_handler(
    monkeypatch: pytest.MonkeyPatch, log_format: str = "logfmt", *, alone: bool = False
) -> tuple[logging.Handler, list[str]]:
    """The CLI's stderr handler, its writes caught (tests/conftest.py restores the root);
    ``alone``: the root's only handler, as the CLI has it (pytest's own are set aside), so a
    jobs_trio line may go to it without its record (logs._line_taker)."""
    written: list[str] = []

    class Stream:
        def write(self, text: str) -> None:
            written.append(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stderr", Stream())
    root = logging.getLogger()
    others = root.handlers[:]
    configure_logging(argparse.Namespace(log_level="info", log_format=log_format))
    [ours] = [h for h in root.handlers if h not in others]
    if alone:
        monkeypatch.setattr(root, "handlers", [ours])
    return ours, written


def test_the_cli_writes_attempt_lines_in_batches_and_every_other_line_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobs_trio._core.logs import flush_held_lines

    handler, written = cli_handler(monkeypatch)
    for n in range(3):
        log_event("jobs.attempt.completed", job="mail.send", attempt=n)
    assert written == []  # held for the next write
    log_event("jobs.worker.started", worker="w")  # any other line writes them all, in order
    [text] = written
    assert [line.split("attempt=")[-1] for line in text.splitlines()[:3]] == ["0", "1", "2"]
    assert "event=jobs.worker.started" in text.splitlines()[3]
    log_event("jobs.attempt.completed", job="mail.send", attempt=7)
    log_event("jobs.attempt.failed", logging.WARNING, job="mail.send", attempt=8)
    assert "attempt=7" in written[1] and "attempt=8" in written[1]  # a warning at once
    log_event("jobs.attempt.completed", job="mail.send", attempt=9)
    assert len(written) == 2
    flush_held_lines()  # as a worker's loop does before it waits for I/O
    assert "attempt=9" in written[2]
    handler.flush()
    assert len(written) == 3  # nothing held, nothing written


def test_an_attempt_line_waits_at_most_the_batch_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs_trio._cli import logging_flags

    _, written = cli_handler(monkeypatch)
    now = [1000.0]
    monkeypatch.setattr(logging_flags.time, "monotonic", lambda: now[0])
    log_event("jobs.attempt.completed", attempt=1)
    now[0] += logging_flags.BATCH_SECONDS / 2
    log_event("jobs.attempt.completed", attempt=2)
    assert written == []
    now[0] += logging_flags.BATCH_SECONDS / 2
    log_event("jobs.attempt.completed", attempt=3)
    assert len(written) == 1 and written[0].count("\n") == 3


def test_a_record_whose_event_is_not_text_is_written_not_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An application's own record may carry an `event` of any kind (extra={"event": ...}):
    # the CLI's handler writes it like any line, it never fails the logging call.
    _, written = cli_handler(monkeypatch)
    app = logging.getLogger("app")
    for event in ({"kind": "signup"}, None, 42):
        app.info("user signed up", extra={"event": event})
    assert len(written) == 3


def test_a_patched_make_record_still_makes_jobs_trio_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A tracer adds its ids to every record by wrapping Logger.makeRecord in place: with the
    # CLI's handler alone (where a line may go past its record), a jobs_trio line still gets
    # its record made by it.
    _, written = cli_handler(monkeypatch, "text", alone=True)
    made = logging.Logger.makeRecord
    traced: list[str] = []

    def with_trace_id(self: logging.Logger, *args: object, **kwargs: object) -> logging.LogRecord:
        record = made(self, *args, **kwargs)  # type: ignore[arg-type]
        traced.append(record.getMessage())
        return record

    monkeypatch.setattr(logging.Logger, "makeRecord", with_trace_id)
    log_event("jobs.worker.started", worker="w")
    assert traced == ["jobs.worker.started worker=w"] and len(written) == 1


def test_a_forked_child_drops_the_lines_its_parent_held(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    _, written = cli_handler(monkeypatch)
    log_event("jobs.attempt.completed", job="mail.send", attempt=1)
    child = os.fork()
    if child == 0:  # pragma: no cover (the child's verdict is its exit code)
        # Its copy of the held line is its parent's to write.
        log_event("jobs.worker.forked-child", logging.ERROR, job_id="j")
        ok = len(written) == 1 and "attempt=1" not in written[0] and "forked-child" in written[0]
        os._exit(0 if ok else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not written  # the parent still holds its line
    log_event("jobs.worker.stopped", worker="w")
    [text] = written
    assert "attempt=1" in text and "stopped" in text


async def test_a_worker_loop_writes_held_lines_when_it_waits_for_io(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import trio

    from jobs_trio._core.logs import FlushHeldLines

    _, written = cli_handler(monkeypatch)
    instrument = FlushHeldLines()
    trio.lowlevel.add_instrument(instrument)
    try:
        log_event("jobs.attempt.completed", job="mail.send", attempt=1)
        assert written == []
        # A wait for a thread is a wait for I/O: nothing held survives it.
        await trio.to_thread.run_sync(lambda: None)
        assert len(written) == 1 and "attempt=1" in written[0]
    finally:
        trio.lowlevel.remove_instrument(instrument)


def test_a_busy_loop_writes_held_lines_when_it_waits_or_once_they_are_overdue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A pass of the loop with tasks still to run (timeout 0) writes nothing held, unless the
    # oldest held line has waited BATCH_SECONDS; a pass that waits writes all of it.
    import time

    from jobs_trio._cli.logging_flags import BATCH_SECONDS
    from jobs_trio._core.logs import FlushHeldLines

    _, written = cli_handler(monkeypatch)
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    instrument = FlushHeldLines()
    log_event("jobs.attempt.completed", job="mail.send", attempt=1)
    instrument.before_io_wait(0.0)
    assert written == []
    now[0] += BATCH_SECONDS / 2
    log_event("jobs.attempt.completed", job="mail.send", attempt=2)
    instrument.before_io_wait(0.0)
    assert written == []
    now[0] += BATCH_SECONDS / 2  # the first line's limit, though no new line came
    instrument.before_io_wait(0.0)
    assert len(written) == 1 and "attempt=1" in written[0] and "attempt=2" in written[0]
    log_event("jobs.attempt.completed", job="mail.send", attempt=3)
    instrument.before_io_wait(0.0)
    assert len(written) == 1
    instrument.before_io_wait(0.25)  # the loop waits: written at once
    assert len(written) == 2 and "attempt=3" in written[1]


@pytest.mark.parametrize(
    "fields",
    [
        {"job_id": "01j", "job": "mail.send", "queue": "q", "attempt": 3, "seconds": 8.1e-05},
        {"job": "two words", "error": 'say "hi"\tthere', "ok": True, "none": None},
        {"worker": "w", "queues": ("a", "b"), "rtl": "x\u202ey", "trailing": ""},
    ],
)
def test_the_cli_writes_a_line_without_its_record_as_it_writes_the_record(
    monkeypatch: pytest.MonkeyPatch, fields: dict[str, object]
) -> None:
    # The CLI's handler takes a jobs_trio line past the record when nothing else would see the
    # record (logs._line_taker): the text must be what the text format makes of the record.
    import time

    from jobs_trio._core import logs

    handler, written = cli_handler(monkeypatch, "text", alone=True)
    monkeypatch.setattr(time, "time", lambda: 1764669600.25)
    monkeypatch.setattr(time, "time_ns", lambda: 1764669600_250_000_000)
    emitted: list[logging.LogRecord] = []
    monkeypatch.setattr(handler, "emit", emitted.append)
    log_event("jobs.worker.started", **fields)
    assert emitted == []  # no record made: the line went straight to the handler
    record = logs._record(logging.INFO, "jobs.worker.started", fields)
    assert handler.formatter is not None
    assert written == [handler.formatter.format(record) + "\n"]


def test_a_line_goes_by_its_record_when_anything_else_would_see_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobs_trio._core import logs

    handler, _ = cli_handler(monkeypatch, "text", alone=True)
    assert logs._line_taker(logging.INFO) is not None
    seen: list[logging.LogRecord] = []
    handler.addFilter(lambda record: seen.append(record) or True)
    assert logs._line_taker(logging.INFO) is None
    log_event("jobs.worker.started", worker="w")
    assert [r.event for r in seen] == ["jobs.worker.started"]  # type: ignore[attr-defined]


def test_a_disabled_jobs_trio_logger_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # logging.config.dictConfig(disable_existing_loggers=True) disables the jobs_trio logger:
    # its records are dropped, and so are the lines that pass them by.
    handler, written = cli_handler(monkeypatch, "text", alone=True)
    monkeypatch.setattr(logging.getLogger("jobs_trio"), "disabled", True)
    log_event("jobs.worker.started", worker="w")
    handler.flush()
    assert written == []


@pytest.mark.parametrize("log_format", ["text", "logfmt"])
def test_attempt_lines_are_held_the_same_with_or_without_their_records(
    monkeypatch: pytest.MonkeyPatch, log_format: str
) -> None:
    from jobs_trio._core.logs import flush_held_lines

    _, written = cli_handler(monkeypatch, log_format, alone=True)
    for n in range(3):
        log_event("jobs.attempt.completed", job="mail.send", attempt=n)
    assert written == []
    log_event("jobs.attempt.failed", logging.WARNING, job="mail.send", attempt=3)
    [text] = written
    assert [line.split("attempt=")[-1] for line in text.splitlines()] == ["0", "1", "2", "3"]
    log_event("jobs.attempt.completed", job="mail.send", attempt=4)
    flush_held_lines()
    assert len(written) == 2 and "attempt=4" in written[1]


def test_code_that_wraps_logging_s_call_of_handlers_sees_every_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Sentry's logging integration wraps Logger.callHandlers to make breadcrumbs and events of
    # every record: a jobs_trio line must not go past it.
    _, written = cli_handler(monkeypatch, "text", alone=True)
    seen: list[str] = []
    call_handlers = logging.Logger.callHandlers

    def watched(self: logging.Logger, record: logging.LogRecord) -> None:
        seen.append(record.getMessage())
        call_handlers(self, record)

    monkeypatch.setattr(logging.Logger, "callHandlers", watched)
    log_event("jobs.lifecycle.abandoned", logging.ERROR, job_id="j")
    assert seen == ["jobs.lifecycle.abandoned job_id=j"] and len(written) == 1


def test_a_field_that_cannot_be_rendered_never_fails_the_caller(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Hostile(float):
        def __repr__(self) -> str:
            raise RuntimeError("no")

    cli_handler(monkeypatch, "text", alone=True)
    monkeypatch.setattr(logging, "raiseExceptions", False)  # handleError's quiet mode
    log_event("jobs.attempt.completed", seconds=Hostile(1.0))  # no raise: handleError's
