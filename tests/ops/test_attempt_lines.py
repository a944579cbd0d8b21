# The lines a worker logs about its attempts (issues 44 and 46): a dead letter and a parked job
# at WARNING or above, every failure's record carrying its exception (exc_info) with a traceback
# from the application's frame, `queue` on every attempt line, one traceback a line in every
# format, its lines as Python indents them; and the fast way of a completion's line writes what
# its record would, and gives way to the record whenever the logging setup changes.
from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from jobs_trio import Backoff, Registry
from jobs_trio._cli.logging_flags import configure_logging
from jobs_trio._core import logs
from jobs_trio._core.log_format import JsonFormatter, LogfmtFormatter, TextFormatter
from jobs_trio._core.records import NewJob, new_job_id
from jobs_trio.testing import run_until_idle
from tests.helpers.worker_helpers import trio_driver, worker


class Caught(logging.Handler):
    """What an error tracker's handler sees: every record, its exc_info included."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def event(self, name: str) -> list[logging.LogRecord]:
        return [r for r in self.records if getattr(r, "event", None) == name]


@pytest.fixture
def caught() -> Iterator[Caught]:
    handler = Caught()
    jobs_logger = logging.getLogger("jobs_trio")
    level = jobs_logger.level
    jobs_logger.addHandler(handler)
    jobs_logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        jobs_logger.removeHandler(handler)
        jobs_logger.setLevel(level)


NO_WAIT = Backoff(base=0.0, jitter=0.0)


def failing_registry(*, sync: bool = False) -> Registry:
    registry = Registry()

    def deep() -> None:
        raise ValueError("no such account\non two lines")

    if sync:

        @registry.job("billing.charge", queue="billing", attempts=2, backoff=NO_WAIT)
        def charge_sync(ctx: object, payload: None) -> None:
            deep()

    else:

        @registry.job("billing.charge", queue="billing", attempts=2, backoff=NO_WAIT)
        async def charge(ctx: object, payload: None) -> None:
            deep()

    return registry


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_a_failure_is_logged_with_its_exception_from_the_applications_frame(
    caught: Caught, sync: bool
) -> None:
    registry = failing_registry(sync=sync)
    driver = trio_driver()
    await registry.require("billing.charge").enqueue(driver, None)
    w = worker(driver, registry, stats_interval=None)
    await run_until_idle(w, wait=False)  # attempt 1: retried
    await run_until_idle(w, wait=False)  # attempt 2: dead-lettered
    failed = caught.event("jobs.attempt.failed")
    assert [r.levelno for r in failed] == [logging.WARNING, logging.WARNING]
    for record in failed:
        assert record.fields["queue"] == "billing"  # type: ignore[attr-defined]
        assert record.exc_info is not None
        kind, error, tb = record.exc_info
        assert kind is ValueError and str(error) == "no such account\non two lines"
        # The traceback starts at the body's frame: the worker's frames are not the story.
        frames = traceback.extract_tb(tb)
        assert frames[0].name.startswith("charge"), frames
        assert not [f for f in frames if "/jobs_trio/" in f.filename], frames
        shown = record.fields["traceback"]  # type: ignore[attr-defined]
        assert shown.startswith("Traceback (most recent call last):\n  File ")
        assert "_run" not in shown and "in deep" in shown
    [retried] = caught.event("jobs.attempt.retried")
    assert retried.levelno == logging.INFO and retried.exc_info is None
    # A dead letter needs a look: ERROR, with its exception (Sentry's logging integration makes
    # an event of a record at ERROR with exc_info).
    [dead] = caught.event("jobs.attempt.dead-lettered")
    assert dead.levelno == logging.ERROR and dead.exc_info is not None
    assert dead.exc_info[0] is ValueError
    assert dead.fields["queue"] == "billing"  # type: ignore[attr-defined]


async def test_a_parked_job_is_logged_at_warning(caught: Caught) -> None:
    registry = Registry()

    @registry.job("known", queue="default")
    async def known(ctx: object, payload: None) -> None: ...

    driver = trio_driver()
    await driver.enqueue([NewJob(new_job_id(), "ghost", "default", "null", 3)])
    await run_until_idle(worker(driver, registry, stats_interval=None), wait=False)
    [parked] = caught.event("jobs.attempt.parked")
    assert parked.levelno == logging.WARNING
    assert parked.fields["queue"] == "default"  # type: ignore[attr-defined]


async def failure_records(caught: Caught) -> tuple[logging.LogRecord, logging.LogRecord]:
    registry = failing_registry()
    driver = trio_driver()
    await registry.require("billing.charge").enqueue(driver, None)
    w = worker(driver, registry, stats_interval=None)
    await run_until_idle(w, wait=False)
    await run_until_idle(w, wait=False)
    return caught.event("jobs.attempt.failed")[-1], caught.event("jobs.attempt.dead-lettered")[0]


async def test_each_format_shows_a_lines_traceback_once(caught: Caught) -> None:
    failed, dead = await failure_records(caught)
    for record in (failed, dead):
        document = json.loads(JsonFormatter().format(record))
        line = json.dumps(document)
        assert line.count("Traceback (most recent call last)") == 1, document
        assert "Traceback" not in document["message"]
        logfmt = LogfmtFormatter().format(record)
        assert logfmt.count("Traceback (most recent call last)") == 1, logfmt
        text = TextFormatter().format(record)
        assert text.count("Traceback (most recent call last)") == 1, text
    # The failure's line keeps its field; the dead letter's carries the exception.
    assert "traceback" in json.loads(JsonFormatter().format(failed))["fields"]
    assert "exception" in json.loads(JsonFormatter().format(dead))


async def test_the_text_format_indents_a_traceback_as_python_does(caught: Caught) -> None:
    failed, dead = await failure_records(caught)
    for record, heading in ((failed, "    traceback:"), (dead, "    exception:")):
        first, *below = TextFormatter().format(record).split("\n")
        assert "jobs.attempt." in first and heading in below, below
        shown = below[below.index(heading) + 1 :]
        assert shown[0] == "      Traceback (most recent call last):"
        assert all(line.startswith("      ") for line in shown), shown
        files = [line for line in shown if line.lstrip().startswith("File ")]
        assert files and all(line.startswith('        File "') for line in files), shown
        assert shown[-2:] == ["      ValueError: no such account", "      on two lines"]


def lines_to(monkeypatch: pytest.MonkeyPatch) -> tuple[logging.Handler, list[str]]:
    """The CLI's handler on the root alone (as `jobs-trio worker` has it), its writes kept."""
    written: list[str] = []

    class Stream:
        def write(self, text: str) -> None:
            written.extend(text.splitlines())

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stderr", Stream())
    root = logging.getLogger()
    others = root.handlers[:]
    configure_logging(argparse.Namespace(log_level="info", log_format="text"))
    [ours] = [h for h in root.handlers if h not in others]
    monkeypatch.setattr(root, "handlers", [ours])
    return ours, written


FIELDS: dict[str, Any] = {
    "job_id": "0194c2e1a7b4d0a6f3e2b9c81d0",
    "job": "mail.send",
    "queue": "mail",
    "attempt": 2,
    "seconds": 8.1e-05,
}


@pytest.mark.parametrize(
    ("job", "queue", "seconds"),
    [
        ("mail.send", "mail", 8.1e-05),
        ("two words", 'q"x', 12.0),
        ("é", "\x1b[31m", 0.5),
        ("nul\x00name", "lone\ud800", 1e-07),
    ],
)
def test_an_attempt_line_is_what_its_record_would_be(
    monkeypatch: pytest.MonkeyPatch, job: str, queue: str, seconds: float
) -> None:
    import time

    handler, written = lines_to(monkeypatch)
    monkeypatch.setattr(time, "time", lambda: 1764669600.25)
    monkeypatch.setattr(time, "time_ns", lambda: 1764669600_250_000_000)
    emitted: list[logging.LogRecord] = []
    monkeypatch.setattr(handler, "emit", emitted.append)
    # The record's seconds as the record's own path has them: rounded to 6 decimals.
    fields = {**FIELDS, "job": job, "queue": queue, "seconds": round(seconds, 6)}
    logs.AttemptLine("jobs.attempt.completed", job, queue).log(
        fields["job_id"], fields["attempt"], seconds
    )
    handler.flush()
    assert emitted == []  # no record made: the line went straight to the handler
    record = logs._record(logging.INFO, "jobs.attempt.completed", fields)
    assert handler.formatter is not None
    assert written == [handler.formatter.format(record)]


def test_a_line_taken_after_another_thread_set_another_formatter_goes_by_its_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The route decided on the CLI's text formatter; a formatter set since, between that
    decision and the take (another thread), makes the take decline (the line then goes by its
    record), never raise into the worker that logs it."""
    handler, written = lines_to(monkeypatch)
    line = logs.AttemptLine("jobs.attempt.completed", "mail.send", "mail")
    take_attempt, take_text = handler.take_attempt, handler.take_text  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter("%(message)s"))
    assert take_attempt(line, "a1", 1, 0.5) is False
    assert take_text(logging.INFO, "jobs.x", "jobs.x a=1", 1764669600.25, 250.0) is False
    handler.setFormatter(type("Own", (TextFormatter,), {})())  # a subclass makes its own lines
    assert take_attempt(line, "a2", 1, 0.5) is False
    handler.flush()
    assert written == []
    line.log("a3", 1, 0.5)  # decided again: by its record, through the formatter now set
    handler.flush()
    [shown] = written
    assert shown.endswith(
        " jobs.attempt.completed job_id=a3 job=mail.send queue=mail attempt=1 seconds=0.5"
    )


def test_an_attempt_line_goes_by_its_record_once_the_setup_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, written = lines_to(monkeypatch)
    line = logs.AttemptLine("jobs.attempt.completed", "mail.send", "mail")
    line.log("a1", 1, 0.5)  # decided: past the record
    tracker = Caught()
    jobs_logger = logging.getLogger("jobs_trio")
    monkeypatch.setattr(jobs_logger, "handlers", [tracker])
    line.log("a2", 1, 0.5)
    assert [r.fields["job_id"] for r in tracker.records] == ["a2"]  # type: ignore[attr-defined]
    monkeypatch.setattr(jobs_logger, "handlers", [])
    seen: list[str] = []
    call_handlers = logging.Logger.callHandlers

    def watched(self: logging.Logger, record: logging.LogRecord) -> None:
        seen.append(record.getMessage())
        call_handlers(self, record)

    monkeypatch.setattr(logging.Logger, "callHandlers", watched)
    line.log("a3", 1, 0.5)
    assert seen == [
        "jobs.attempt.completed job_id=a3 job=mail.send queue=mail attempt=1 seconds=0.5"
    ]
    logging.getLogger().handlers[0].flush()
    # Every line written once, whichever way it went (a2 and a3 by their records).
    assert [w.split("job_id=")[1].split()[0] for w in written] == ["a1", "a2", "a3"]


async def test_a_worker_logs_each_completion_once_with_its_fields(caught: Caught) -> None:
    registry = Registry()

    @registry.job("mail.send", queue="mail")
    async def send(ctx: object, payload: None) -> None:
        await trio.sleep(0)

    driver = trio_driver()
    ids = await send.enqueue_many(driver, [None, None])
    await run_until_idle(worker(driver, registry, stats_interval=None), wait=False)
    done = caught.event("jobs.attempt.completed")
    assert sorted(r.fields["job_id"] for r in done) == sorted(ids)  # type: ignore[attr-defined]
    for record in done:
        assert set(record.fields) == {"job_id", "job", "queue", "attempt", "seconds"}  # type: ignore[attr-defined]
        assert record.levelno == logging.INFO


def test_an_attempt_line_shows_infos_name_as_its_record_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The line made past the record names its level as logging names it now: an application
    that renamed INFO (``logging.addLevelName``) sees the same name on every line."""
    handler, written = lines_to(monkeypatch)
    monkeypatch.setitem(logging._levelToName, logging.INFO, "NOTE")  # type: ignore[attr-defined]
    monkeypatch.setitem(logging._nameToLevel, "NOTE", logging.INFO)  # type: ignore[attr-defined]
    logs.AttemptLine("jobs.attempt.completed", "mail.send", "mail").log("a1", 1, 0.5)
    handler.flush()
    record = logs._record(
        logging.INFO,
        "jobs.attempt.completed",
        {**FIELDS, "job_id": "a1", "attempt": 1, "seconds": 0.5},
    )
    assert [line.split(" ", 3)[2] for line in written] == ["NOTE"]
    assert handler.formatter is not None
    assert written[0].split(" ", 2)[2] == handler.formatter.format(record).split(" ", 2)[2]


# Inside a worker's run (logs.lines_by_pass) the route looks at the logging setup once a pass of
# its loop, not once a line (issue 44): a change is seen from the loop's next pass, a line from
# any other thread still looks at each line, and after the worker every line looks again.


def _ids(records: list[logging.LogRecord]) -> list[str]:
    return [r.fields["job_id"] for r in records]  # type: ignore[attr-defined]


def _written_ids(written: list[str]) -> list[str]:
    return [w.split("job_id=")[1].split()[0] for w in written]


def _mail_line() -> logs.AttemptLine:
    return logs.AttemptLine("jobs.attempt.completed", "mail.send", "mail")


async def test_in_a_workers_loop_a_setup_change_is_seen_from_the_next_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handler, written = lines_to(monkeypatch)
    line = _mail_line()
    tracker = Caught()
    with logs.lines_by_pass():
        line.log("a1", 1, 0.5)  # this pass looked: past the record
        monkeypatch.setattr(logging.getLogger("jobs_trio"), "handlers", [tracker])
        line.log("a2", 1, 0.5)  # the same pass: where its look sent lines (documented)
        await trio.sleep(0)  # the pass ends
        line.log("a3", 1, 0.5)
    assert _ids(tracker.records) == ["a3"]
    handler.flush()
    # Every line written once, whichever way it went (a3 by its record).
    assert _written_ids(written) == ["a1", "a2", "a3"]


async def test_a_line_from_another_thread_looks_at_the_setup_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    lines_to(monkeypatch)
    line = _mail_line()
    tracker = Caught()

    def elsewhere() -> None:
        logging.getLogger("jobs_trio").handlers = [tracker]
        line.log("t1", 1, 0.5)

    monkeypatch.setattr(logging.getLogger("jobs_trio"), "handlers", [])
    with logs.lines_by_pass():
        line.log("a1", 1, 0.5)  # this pass looked, on the loop's thread
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()  # within the same pass: no checkpoint
    assert _ids(tracker.records) == ["t1"]


async def test_after_a_worker_each_line_looks_at_the_setup_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines_to(monkeypatch)
    line = _mail_line()
    tracker = Caught()
    with logs.lines_by_pass():
        with logs.lines_by_pass():  # two workers on one loop
            line.log("a1", 1, 0.5)
        line.log("a2", 1, 0.5)  # the other still runs: this pass looked
        monkeypatch.setattr(logging.getLogger("jobs_trio"), "handlers", [tracker])
        line.log("a3", 1, 0.5)
    line.log("a4", 1, 0.5)  # no worker now, and no checkpoint since the change
    assert _ids(tracker.records) == ["a4"]


async def test_a_worker_whose_job_adds_a_filter_sends_the_next_jobs_lines_through_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As an application would do it: a job of a worker run under the CLI's handler adds a
    filter to it; the lines of the jobs that end after it reach the filter, through the
    record."""
    import jobs_trio

    handler, written = lines_to(monkeypatch)
    seen: list[str] = []

    def watch(record: logging.LogRecord) -> bool:
        if getattr(record, "event", None) == "jobs.attempt.completed":
            seen.append(record.fields["job_id"])  # type: ignore[attr-defined]
        return True

    registry = Registry()
    ran: list[str] = []

    @registry.job("mail.send", queue="mail")
    async def send(ctx: jobs_trio.JobContext, payload: dict[str, int]) -> None:
        ran.append(ctx.job_id)
        if payload["n"] == 0:
            handler.addFilter(watch)
        await trio.sleep(0)

    driver = trio_driver()
    ids = await send.enqueue_many(driver, [{"n": n} for n in range(4)])
    async with jobs_trio.open_worker(
        driver, registry, concurrency=1, drain_on_shutdown=False, stats_interval=None
    ):
        with trio.fail_after(30):
            while len([w for w in written if "jobs.attempt.completed" in w]) < 4:
                handler.flush()
                await trio.sleep(0.01)
    # The one that added it (its line logged after its checkpoint, a pass later) and each
    # job after it.
    assert sorted(ran) == sorted(ids)
    assert seen == ran[ran.index(ids[0]) :]


def test_in_guest_mode_the_hosts_own_lines_look_at_the_setup_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Trio's guest mode runs the host's code on the loop's thread between passes: a line the
    host logs there looks at the setup each time, and caches nothing for the next pass."""
    import queue
    import threading

    lines_to(monkeypatch)
    line = _mail_line()
    tracker = Caught()
    callbacks: queue.SimpleQueue[Any] = queue.SimpleQueue()
    finished = threading.Event()
    outcomes: list[Any] = []
    waiting = threading.Event()  # the guest waits for the host, its pass over
    shared: dict[str, Any] = {}

    async def guest() -> None:
        with logs.lines_by_pass():
            line.log("t0", 1, 0.5)
            shared["token"] = trio.lowlevel.current_trio_token()
            shared["host_done"] = host_done = trio.Event()
            waiting.set()
            await host_done.wait()
            line.log("t1", 1, 0.5)

    def done(outcome: Any) -> None:
        outcomes.append(outcome)
        finished.set()

    trio.lowlevel.start_guest_run(
        guest,
        run_sync_soon_threadsafe=callbacks.put,
        done_callback=done,
        host_uses_signal_set_wakeup_fd=False,
    )
    acted = False
    while not finished.is_set():
        callbacks.get(timeout=30)()
        if waiting.is_set() and not acted:
            acted = True  # the host's own code, between the guest's passes
            line.log("h1", 1, 0.5)
            logging.getLogger("jobs_trio").handlers.append(tracker)
            line.log("h2", 1, 0.5)
            shared["token"].run_sync_soon(shared["host_done"].set)
    logging.getLogger("jobs_trio").handlers.remove(tracker)
    outcomes[0].unwrap()
    assert _ids(tracker.records) == ["h2", "t1"]


def test_a_registration_an_earlier_run_left_caches_nothing_in_a_later_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines_to(monkeypatch)
    monkeypatch.setattr(logs._ROUTE, "_passes", {})
    monkeypatch.setattr(logs._ROUTE, "_checked_in", None)
    line = _mail_line()
    tracker = Caught()

    async def abandoned() -> None:
        logs._ROUTE.watch_passes()  # as a guest run its host never finished leaves it

    async def later() -> None:
        line.log("a1", 1, 0.5)
        monkeypatch.setattr(logging.getLogger("jobs_trio"), "handlers", [tracker])
        line.log("a2", 1, 0.5)

    trio.run(abandoned)
    trio.run(later)
    assert _ids(tracker.records) == ["a2"]


async def test_lines_held_by_a_handler_replaced_within_a_pass_are_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CLI's handler replaced (configure_logging again) while it holds lines, and a line
    logged in the same pass after it, which the pass's look still sends to the old one: both
    written, in order, though nothing installed holds them now."""
    _, written = lines_to(monkeypatch)
    line = _mail_line()
    with logs.lines_by_pass():
        line.log("a1", 1, 0.5)
        configure_logging(argparse.Namespace(log_level="info", log_format="text"))
        line.log("a2", 1, 0.5)
        await trio.sleep(0)  # the pass ends: what the old handler holds is written
        assert _written_ids(written) == ["a1", "a2"]
        line.log("a3", 1, 0.5)
    logs.flush_held_lines()
    assert _written_ids(written) == ["a1", "a2", "a3"]


async def test_a_pass_ends_for_the_route_even_when_writing_held_lines_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Trio drops an instrument whose hook raised: the pass the hook was ending still ends for
    the route, and the worker's end does not fail on the instrument gone."""
    handler, _ = lines_to(monkeypatch)
    line = _mail_line()
    tracker = Caught()

    failing = True
    flush = handler.flush

    def broken() -> None:
        if failing:
            raise OSError("the disk is full")
        flush()

    monkeypatch.setattr(handler, "flush", broken)
    monkeypatch.setattr(handler, "flush_overdue", broken)
    with logs.lines_by_pass():
        line.log("a1", 1, 0.5)
        monkeypatch.setattr(logging.getLogger("jobs_trio"), "handlers", [tracker])
        await trio.sleep(0)  # the hook raises; Trio drops the instrument
        failing = False
        line.log("a2", 1, 0.5)
        await trio.sleep(0)  # no instrument now: nothing ends the pass for the route
        monkeypatch.setattr(logging.getLogger("jobs_trio"), "handlers", [])
        line.log("a3", 1, 0.5)
    assert _ids(tracker.records) == ["a2"]


def test_lines_a_replaced_handler_holds_go_before_the_next_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outside a worker: the next line looks, finds another handler, and writes what the one it
    replaces holds first (nothing else would: it is no longer installed)."""
    _, written = lines_to(monkeypatch)
    line = _mail_line()
    line.log("a1", 1, 0.5)  # held by the CLI's handler
    configure_logging(argparse.Namespace(log_level="info", log_format="text"))
    line.log("a2", 1, 0.5)
    logs.flush_held_lines()
    assert _written_ids(written) == ["a1", "a2"]


async def test_a_dead_letters_exception_is_cut_and_stays_json_a_reader_takes(
    caught: Caught,
) -> None:
    """Its line rendered the exception whole: a message of 10 MB was a 10 MB line, and a lone
    surrogate in it became an escape jq refuses ("Invalid \\uXXXX\\uXXXX surrogate pair
    escape"), losing the line to a log pipeline."""
    registry = Registry()

    @registry.job("poison", attempts=1)
    async def poison(ctx: object, payload: None) -> None:
        raise ValueError("bad \ud800 and \x00 " + "x" * 100_000)

    driver = trio_driver()
    await poison.enqueue(driver, None)
    # Kept from pytest's own capture, whose report (its exception rendered whole, the
    # surrogate in it) xdist cannot send between processes.
    jobs_logger = logging.getLogger("jobs_trio")
    jobs_logger.propagate = False
    try:
        await run_until_idle(worker(driver, registry, stats_interval=None), wait=False)
    finally:
        jobs_logger.propagate = True
    [dead] = caught.event("jobs.attempt.dead-lettered")
    for formatter in (JsonFormatter(), LogfmtFormatter(), TextFormatter()):
        line = formatter.format(dead)
        assert len(line) < 40_000, (type(formatter).__name__, len(line))
        assert "\ud800" not in line and "\x00" not in line
        assert "\\ud800" not in line.replace("\\\\ud800", "")  # only as shown text, escaped
    exception = json.loads(JsonFormatter().format(dead))["exception"]
    assert exception.endswith("x" * 100) and "characters cut]" in exception
