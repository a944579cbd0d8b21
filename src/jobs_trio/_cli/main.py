# `jobs-trio`: parses a command, runs it against the database a URL names, and turns every
# error into one line, `error [CODE]: cause — fix: ...`, and exit status 2, never a traceback.
# Apart from _core/render.py (how things look) and _cli/find_registry.py (importing the user's
# code).
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NoReturn

import attrs
import trio

from .._core import render as render
from .._core.errors import ConfigError, JobsError, PayloadNotSerialisable
from .._core.logs import log_event
from .._core.metrics import checked_buckets, default_metrics
from .._core.operator_transitions import found
from .._core.records import Enqueued, JobState, NewJob
from .._core.redaction import redact_url
from .._core.version import VERSION as __version__
from .._jobs.registry import JobDefinition, Registry
from .._retention.pruner import Retention
from .._run.early_signals import EarlySignals, stopped_at_start
from .._run.lifecycle import Lifecycle, open_lifecycle
from .._run.worker import DEFAULT_HOLD_LIMIT, DEFAULT_LEASE, open_worker
from ..drivers._open_driver import DriverKind, driver_kind, migrate_database, open_driver
from ..drivers._sqlite_migrate import sqlite_path
from ..drivers.contract import Driver
from .args import (
    ENV_DB,
    ENV_SCHEMA,
    auto_or_count,
    count,
    database_url,
    delay,
    driver_options,
    positive_seconds,
    priority,
    seconds,
    whole,
)
from .bulk import add_bulk_commands
from .collector import tune_for_worker
from .cron import add_tasks_command
from .declared_jobs import resolve
from .find_registry import load_registry
from .logging_flags import add_logging_flags, configure_logging, structured
from .prune import add_prune_command
from .queue_control import add_queue_commands
from .relay import add_relay_command
from .retention_flags import add_retention_flags, retention_of

ENV_TRACEBACK = "JOBS_TRIO_TRACEBACK"  # set to 1: an unexpected error prints its traceback
USAGE_ERROR = 2  # argparse's own status for a bad command line; user mistakes share it
INTERRUPTED_BY_USER = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


def main(argv: Sequence[str] | None = None, *, early: EarlySignals | None = None) -> int:
    """The console script: ``jobs-trio COMMAND ...``. Answers the exit status (setuptools'
    wrapper passes it to ``sys.exit``); tests call it in-process with a list of arguments.
    ``early``: the signals console.py held while this module loaded (a long-running command)."""
    try:
        args = build_parser().parse_args(_text_only(sys.argv[1:] if argv is None else argv))
    except SystemExit as stop:  # --help or --version: printed, and not an error
        return stop.code if isinstance(stop.code, int) else USAGE_ERROR
    except JobsError as usage:  # a bad command line (see _Parser.error)
        return report(usage)
    args.early = early
    command: Callable[[argparse.Namespace], int] = args.run
    try:
        return command(args)
    except BrokenPipeError:
        # `jobs-trio list | head`: the reader has all it wanted. Point stdout at /dev/null so
        # the interpreter's final flush does not raise the same error again at exit.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        # Only reachable outside `worker`, whose lifecycle turns SIGINT into a drain.
        print("interrupted", file=sys.stderr)
        return INTERRUPTED_BY_USER
    except Exception as exc:
        error = user_error(exc)
        if error is None:
            if os.environ.get(ENV_TRACEBACK):
                raise  # asked for: the traceback is the report
            error = unexpected(exc)
        return report(error, args)


def report(error: JobsError, args: argparse.Namespace | None = None) -> int:
    """One line on stderr. Causes quote what a user typed or a database stored (an id, a
    name, a server's message), so they are made visible like any other output. A command
    logging for a pipeline (--log-format logfmt or json) logs it as a record instead: its
    stderr is parsed line by line, and the last line must parse too."""
    if args is not None and hasattr(args, "log_format") and _quietly(structured, args):
        log_event(
            "jobs.cli.failed", logging.ERROR, code=error.code, cause=error.cause, fix=error.fix
        )
        return USAGE_ERROR
    line = f"error [{error.code}]: {render.visible(error.cause)}"
    if error.fix:
        line += f" — fix: {render.visible(error.fix)}"
    print(line, file=sys.stderr)
    return USAGE_ERROR


def _quietly(check: Callable[[argparse.Namespace], bool], args: argparse.Namespace) -> bool:
    try:
        return check(args)
    except JobsError:  # the environment's format is itself the error being reported
        return False


def unexpected(exc: BaseException) -> JobsError:
    """An error nobody planned for, as one line that says how to see the rest."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]  # the nurseries a command opens add nothing to the story
    return JobsError(
        f"unexpected {type(exc).__name__}: {exc}",
        fix=f"this is a bug in jobs_trio or in the code it ran: rerun with {ENV_TRACEBACK}=1"
        " to print the traceback, and report it",
        code="X_UNEXPECTED",
    )


def _text_only(argv: Sequence[str]) -> list[str]:
    """Arguments as text every database can store. Bytes that are not UTF-8 reach Python as
    lone surrogates (PEP 383), which no driver can encode: refused here, naming the argument,
    rather than as a UnicodeEncodeError halfway through a write."""
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(
                f"the argument {arg!r} is not valid UTF-8 text",
                fix="pass names, keys and payloads as UTF-8 (check the terminal's and the"
                " script's encoding)",
            ) from exc
    return list(argv)


def user_error(exc: BaseException) -> JobsError | None:
    """The JobsError to report, also when it arrives wrapped by a nursery (the worker command
    opens several); None when anything but JobsErrors is in the group."""
    if isinstance(exc, JobsError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        leaves = [user_error(inner) for inner in exc.exceptions]
        if leaves and all(leaf is not None for leaf in leaves):
            return leaves[0]
    return None


# The command line.


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors raised as JobsErrors: reported in the one-line form of
    every other error (cause and fix) instead of a usage block and a bare message."""

    def error(self, message: str) -> NoReturn:
        raise JobsError(f"{self.prog}: {message}", fix=f"see `{self.prog} --help`", code="X_USAGE")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="jobs-trio",
        description="Durable background jobs for Trio: run workers, enqueue and inspect jobs.",
        epilog=f"Every command but demo takes --db URL, or reads it from ${ENV_DB}.",
    )
    parser.add_argument("--version", action="version", version=f"jobs-trio {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    db = _Parser(add_help=False)
    db.add_argument(
        "--db",
        metavar="URL",
        help=f"sqlite:///jobs.db, postgresql://user@host/db or memory:// (default: ${ENV_DB})",
    )
    db.add_argument(
        "--schema",
        metavar="S",
        help=f"PostgreSQL schema holding the jobs (default: ${ENV_SCHEMA}, else jobs_trio)",
    )
    as_json = _Parser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON instead of text")

    def command(
        name: str, run: Callable[[argparse.Namespace], int], text: str, *parents: Any
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=text, description=text, parents=[db, *parents])
        sub.set_defaults(run=run, command=name)
        return sub

    worker = command(
        "worker",
        _worker,
        "Run the jobs of a registry until SIGTERM/SIGINT, then drain: running jobs are"
        " interrupted (their attempts handed back) and the process exits 0.",
    )
    worker.add_argument("app", metavar="MODULE[:ATTR]", help="where the jobs_trio.Registry is")
    worker.add_argument(
        "--queue",
        action="append",
        metavar="Q",
        help="a queue to claim from (repeatable; default: every queue the registry declares)",
    )
    worker.add_argument("--concurrency", type=count, default=10, metavar="N", help="per queue")
    worker.add_argument(
        "--claim-ahead",
        type=auto_or_count,
        default="auto",
        metavar="N",
        help="per queue, jobs claimed ahead of a free slot: 'auto' (the default: sized from"
        " the jobs' pace), 0 for none, or a number (see docs/model.md)",
    )
    worker.add_argument(
        "--hold-limit",
        type=positive_seconds,
        default=DEFAULT_HOLD_LIMIT,
        metavar="S",
        help="how long a job claimed ahead waits for a slot before it is handed back "
        f"(default {DEFAULT_HOLD_LIMIT:g})",
    )
    worker.add_argument("--no-tasks", action="store_true", help="do not fire cron tasks here")
    worker.add_argument(
        "--python-gc",
        action="store_true",
        help="keep Python's garbage-collector settings (by default the worker collects young"
        " objects less often: docs/cli.md)",
    )
    worker.add_argument(
        "--grace", type=seconds, default=25.0, metavar="S", help="drain budget (default 25)"
    )
    worker.add_argument(
        "--lease",
        type=positive_seconds,
        default=DEFAULT_LEASE,
        metavar="S",
        help=f"how long a claim holds a job without renewal (default {DEFAULT_LEASE:g})",
    )

    add_retention_flags(worker)
    add_metrics_flags(worker)
    add_logging_flags(worker)

    enqueue = command("enqueue", _enqueue, "Enqueue one job and print its id.")
    enqueue.add_argument("name", metavar="NAME")
    enqueue.add_argument("--payload", metavar="JSON", help="the job's payload (default: null)")
    enqueue.add_argument("--delay", type=delay, metavar="S", help="run no sooner than S from now")
    enqueue.add_argument("--key", metavar="K", help="unique key: one live job per key")
    enqueue.add_argument(
        "--unique-for",
        type=positive_seconds,
        metavar="S",
        help="with --key: a job of the key created less than S ago holds it too, once finished"
        " in a state the window covers (completed unless --unique-states)",
    )
    enqueue.add_argument(
        "--unique-states",
        metavar="STATE,…",
        help="with --unique-for: the finished states the window covers (of completed, dead,"
        " cancelled; default completed)",
    )
    enqueue.add_argument("--priority", type=priority, metavar="P", help="lower runs sooner")
    enqueue.add_argument("--queue", metavar="Q", help='default: "default", or as --app declares')
    enqueue.add_argument("--attempts", type=count, metavar="N", help="default: 3, or as declared")
    enqueue.add_argument(
        "--app",
        metavar="MODULE[:ATTR]",
        help="check NAME against this registry and use its declared queue and attempts"
        " (default: against the names the workers seen in the last hour declare, and theirs)",
    )
    enqueue.add_argument(
        "--any-name",
        action="store_true",
        help="enqueue NAME unchecked: a job no worker declares yet (it waits, or is parked by a"
        " worker that does not know it)",
    )

    show = command(
        "show",
        on_driver(_show, read_only=True),
        "Show one job, its timings, its step records and its attempt history.",
        as_json,
    )
    show.add_argument("id", metavar="ID")

    listing = command("list", on_driver(_list, read_only=True), "List jobs, newest first.", as_json)
    listing.add_argument("--state", choices=render.STATE_ORDER, metavar="S")
    listing.add_argument("--queue", metavar="Q")
    listing.add_argument("--name", metavar="NAME", help="the job's whole name")
    listing.add_argument("--limit", type=count, default=100, metavar="N", help="default 100")

    add_bulk_commands(command, on_driver, as_json)
    add_queue_commands(command, on_driver, as_json)

    command(
        "stats",
        on_driver(_stats, read_only=True),
        "Per queue: jobs by state, due, oldest ready age, dead, paused.",
        as_json,
    )

    command(
        "outbox",
        on_driver(_outbox, read_only=True),
        "The outbox in the application's database (--db): rows pending, the relay's lag.",
        as_json,
    )

    migrate = command(
        "migrate",
        _migrate,
        "Bring the database's schema up to this release: PostgreSQL's migrations, one"
        " transaction each, never holding a lock the fleet waits on for long; a SQLite file"
        " created or upgraded. Says what it applied.",
    )
    migrate.add_argument(
        "--lock-timeout",
        type=positive_seconds,
        default=None,
        metavar="S",
        help="PostgreSQL: wait at most S seconds for each lock, then let the fleet's"
        " statements through and try again (default 0.5)",
    )
    migrate.add_argument(
        "--wait",
        type=positive_seconds,
        default=None,
        metavar="S",
        help="PostgreSQL: keep trying for S seconds in all before giving up, naming the"
        " sessions that held the locks (default 600)",
    )
    add_tasks_command(command, on_driver, as_json)
    add_prune_command(command, on_driver, as_json)
    add_relay_command(command)

    add_dashboard_command(command("dashboard", _dashboard, DASHBOARD_HELP))

    demo = commands.add_parser(
        "demo",
        help="A few seconds' tour on ./jobs-demo.db: retries, a dead letter, a drain.",
        description="Run a mixed batch through two in-process workers on a fresh demo database,"
        " then print every job's outcome. Ignores $" + ENV_DB + ": the demo deletes its file.",
    )
    demo.add_argument("--db", default="sqlite:///jobs-demo.db", metavar="URL")
    demo.add_argument("--verbose", action="store_true", help="also print the workers' log lines")
    demo.set_defaults(run=_demo)
    return parser


def _print_json(value: object) -> None:
    print(render.dumps(value))


# Commands. Each checks what it can before opening the database: a mistake writes nothing.


def _worker(args: argparse.Namespace) -> int:
    configure_logging(args)
    url = database_url(args, one_shot=False)
    registry = load_registry(args.app)
    retention = retention_of(args)
    if stopped_at_start(args.early, "worker"):
        return 0
    if args.early is not None:
        # Only as the console script (its own process, which `early` marks): called in-process,
        # as tests and embedding applications do, the process's collector is not the CLI's.
        tune_for_worker(args.python_gc)
    return trio.run(_run_worker, url, registry, retention, args)


async def _run_worker(
    url: str, registry: Registry, retention: Retention | None, args: argparse.Namespace
) -> int:
    # The driver outlives the lifecycle: the drain's settlements (interrupted attempts handed
    # back) are written before the connection closes. When a body ignores its cancellation past
    # the grace period, the lifecycle ends the process itself with ABANDONED_EXIT_CODE (70).
    async with open_driver(url, **driver_options(args, url)) as driver:
        lifecycle: Lifecycle | None = None
        try:
            # /metrics is bound before the worker claims: a --metrics-host or --metrics-port
            # it cannot listen on ends the command before any job's body has started.
            async with (
                open_lifecycle(grace=args.grace, early=args.early) as lifecycle,
                serving_metrics(args),
                open_worker(
                    driver,
                    registry,
                    queues=args.queue,
                    concurrency=args.concurrency,
                    claim_ahead=args.claim_ahead,
                    hold_limit=args.hold_limit,
                    lease=args.lease,
                    lifecycle=lifecycle,
                    schedule_tasks=not args.no_tasks,
                    retention=retention,
                    metrics=default_metrics(run_buckets=args.run_buckets),
                ),
            ):
                await trio.sleep_forever()  # ended by the lifecycle once the drain is done
        finally:
            if lifecycle is not None and lifecycle.shut_down:
                # Drained: only the driver's bounded close is left. The lifecycle handed the
                # signals back to their default action as it ended, and a second SIGTERM then
                # (a supervisor that sends two) killed the process: exit 143 after a clean
                # drain. Ignored from here to the process's end.
                for number in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(number, signal.SIG_IGN)
    return 0


def _enqueue(args: argparse.Namespace) -> int:
    url = database_url(args)
    if args.app is not None and args.any_name:
        raise ConfigError(
            "--app and --any-name were both given",
            fix="--app checks NAME against your registry: drop --any-name",
        )
    # Every check that needs no database first: the job as the CLI would write it.
    definition = _definition(args)
    job = definition.new_job(
        _payload(args.payload, args.name),
        delay=args.delay,
        priority=args.priority,
        key=args.key,
        **_window(args),
    )
    if args.app is not None or args.any_name:
        answer = trio.run(_write_one, url, driver_options(args, url), job)
    else:
        # Checked against the fleet: its database must exist already (a new one has no worker
        # to vouch for a name, and a mistyped path must not become a new file).
        options = driver_options(args, url, existing=True)
        answer = trio.run(_write_declared, url, options, args, job)
    print(answer.job_id)
    if not answer.created:
        holder = "a live job" if args.unique_for is None else "a job in its window"
        print(
            f"note: {holder} already holds key {args.key!r}; that job's id is printed",
            file=sys.stderr,
        )
    return 0


def _window(args: argparse.Namespace) -> dict[str, Any]:
    """``new_job``'s key window from ``--unique-for`` / ``--unique-states``, the flags checked
    as flags: the Registry's own errors name its keyword arguments, which a CLI user never
    wrote."""
    if args.unique_for is None:
        if args.unique_states is not None:
            raise ConfigError(
                "--unique-states was given without --unique-for",
                fix="give the window's length too, e.g. --unique-for 86400",
            )
        return {}
    if args.key is None:
        raise ConfigError(
            "--unique-for was given without --key: a window is a key's",
            fix="give the key too, e.g. --key welcome:42 --unique-for 86400",
        )
    if args.unique_states is None:
        return {"unique_for": args.unique_for}
    states = [state.strip() for state in args.unique_states.split(",") if state.strip()]
    if not states:
        raise ConfigError(
            f"--unique-states {args.unique_states!r} names no state",
            fix="name some of completed, dead, cancelled, separated by commas",
        )
    return {"unique_for": args.unique_for, "unique_states": states}


async def _write_one(url: str, options: dict[str, Any], job: NewJob) -> Enqueued:
    async with open_driver(url, **options) as driver:
        [answer] = await driver.enqueue([job])
        return answer


async def _write_declared(
    url: str, options: dict[str, Any], args: argparse.Namespace, job: NewJob
) -> Enqueued:
    """Enqueue ``job`` when the fleet's workers declare its name, with their queue and attempts
    unless given (issue 46: a typo was accepted, and its job waited in "default" for ever)."""
    async with open_driver(url, **options) as driver:
        queue, attempts = resolve(args.name, args.queue, args.attempts, await driver.workers())
        [answer] = await driver.enqueue([attrs.evolve(job, queue=queue, max_attempts=attempts)])
        return answer


def _definition(args: argparse.Namespace) -> JobDefinition:
    """The declared job with ``--app`` (its queue and attempts apply), else an ad-hoc one whose
    name, queue and attempts the Registry checks as it would a declaration."""
    if args.app is None:
        queue = "default" if args.queue is None else args.queue  # "" is refused, not defaulted
        attempts = 3 if args.attempts is None else args.attempts
        return _ad_hoc(args.name, queue, attempts)
    definition = load_registry(args.app).require(args.name)
    for flag, given, declared in (
        ("--queue", args.queue, definition.queue),
        ("--attempts", args.attempts, definition.attempts),
    ):
        if given is not None and given != declared:
            raise ConfigError(
                f"{flag} {given!r} differs from the {declared!r} job {args.name!r} is declared"
                f" with in {args.app}",
                fix=f"drop {flag}: with --app the declaration decides (workers claim its queue)",
            )
    return definition


def _ad_hoc(name: str, queue: str, attempts: int) -> JobDefinition:
    """A job the CLI enqueues but does not run, checked by the Registry as a declaration is."""
    definition: JobDefinition = Registry().job(name, queue=queue, attempts=attempts)(_never_run)
    return definition


def _never_run(ctx: object, payload: object) -> NoReturn:
    raise AssertionError("the CLI only enqueues; a worker runs the declared body")


def _payload(text: str | None, name: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text, object_pairs_hook=_one_value_a_key)
    except _RepeatedKey as exc:
        # {"a": 1, "a": 2} read as {"a": 2}: one of the two values dropped without a word.
        cause = f"the key {exc.key!r} is given twice in one object"
        fix = "give each key once: the job would get only the last of its values"
    except json.JSONDecodeError as exc:
        cause, fix = (
            f"not valid JSON: {exc}",
            """quote it for the shell, e.g. --payload '{"to": "a@b.c"}'""",
        )
    except RecursionError:
        # Python's JSON parser recurses once per level of nesting.
        cause = "nested deeper than the JSON parser can read"
        fix = "flatten the payload: a few levels of objects and arrays are plenty"
    except ValueError as exc:
        # Python refuses to read an integer of more than 4,300 digits (int_max_str_digits):
        # not JSONDecodeError, and it used to reach the user as X_UNEXPECTED, "a bug".
        cause = f"a value Python cannot read: {exc}"
        fix = "send a long number as a string; payloads take ints of up to 640 digits"
    raise PayloadNotSerialisable(job=name, field="--payload", cause=cause, fix=fix)


class _RepeatedKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _one_value_a_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object of ``--payload`` whose keys are each given once."""
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return value


DriverCommand = Callable[[Driver, argparse.Namespace], Awaitable[None]]


def on_driver(
    command: DriverCommand, *, read_only: bool = False
) -> Callable[[argparse.Namespace], int]:
    """A command on jobs that must already exist: it never creates a database (a mistyped
    path is "no database at PATH"), and a ``read_only`` one opens it read-only, never
    migrating or writing it. The URL is checked before Trio starts."""

    def run(args: argparse.Namespace) -> int:
        url = database_url(args)
        options = driver_options(args, url, existing=True, read_only=read_only)

        async def opened() -> None:
            async with open_driver(url, **options) as driver:
                await command(driver, args)

        trio.run(opened)
        return 0

    return run


async def _show(driver: Driver, args: argparse.Namespace) -> None:
    record = found(await driver.get(args.id), args.id)
    steps = await driver.load_steps(args.id)
    history = await driver.load_attempts(args.id)
    if args.json:
        _print_json(render.job_json(record, steps, history))
    else:
        print(render.job_text(record, steps, driver.now(), history))


async def _list(driver: Driver, args: argparse.Namespace) -> None:
    state = JobState(args.state) if args.state else None
    records = await driver.list_jobs(
        state=state, queue=args.queue, name=args.name, limit=args.limit
    )
    if args.json:
        _print_json([record.to_json() for record in records])
        return
    print(render.jobs_table(records, driver.now()) if records else "no jobs")
    if len(records) == args.limit:
        print(f"(the newest {args.limit}; --limit N for more)", file=sys.stderr)


async def _outbox(driver: Driver, args: argparse.Namespace) -> None:
    stats = await driver.outbox_stats()
    now = driver.now()
    if args.json:
        _print_json(
            {
                "pending": stats.pending,
                "oldest_age": stats.oldest_age,
                "held": [hold.to_json(now) for hold in stats.held],
            }
        )
        return
    if stats.oldest_age is None:
        print("outbox empty")
        return
    print(f"{stats.pending} pending; the oldest has waited {stats.oldest_age:.1f} s")
    for hold in stats.held:
        print(f"  {render.relay_hold(hold, now)}")


async def _stats(driver: Driver, args: argparse.Namespace) -> None:
    queues = await driver.stats()
    if args.json:
        _print_json(render.stats_json(queues))
    else:
        print(render.stats_table(queues) if queues else "no jobs")


def _migrate(args: argparse.Namespace) -> int:
    url = database_url(args)

    async def migrate() -> None:
        schema = driver_options(args, url).get("schema")
        applied = await migrate_database(
            url, schema=schema, lock_timeout=args.lock_timeout, wait=args.wait
        )
        if applied is None:
            print(f"nothing to migrate on {redact_url(url)}: a memory store has no schema")
            return
        done = ", ".join(map(str, applied))
        if driver_kind(url) is DriverKind.SQLITE:
            where = f"file {sqlite_path(url)!r}"
        else:
            where = f"schema {schema or 'jobs_trio'!r}"  # open_postgres_driver's default
        print(f"{where}: " + (f"applied {done}" if applied else "up to date"))

    trio.run(migrate)
    return 0


# The worker's /metrics endpoint (--metrics-port) and the dashboard command.


def add_metrics_flags(worker: argparse.ArgumentParser) -> None:
    worker.add_argument(
        "--metrics-port",
        type=_port,
        metavar="N",
        help="serve Prometheus metrics at http://HOST:N/metrics (0: a free port, logged)",
    )
    worker.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="H",
        help="address for --metrics-port (default 127.0.0.1; 0.0.0.0 for a remote scraper)",
    )

    worker.add_argument(
        "--run-buckets",
        type=_buckets,
        metavar="S,S,...",
        help="bounds in seconds of jobs_trio_run_seconds' buckets, such as 0.1,1,60,3600"
        " (default: 0.001 to 14400, from a millisecond to four hours)",
    )


def _port(text: str) -> int:
    return whole(text, 0, 65535)


def _buckets(text: str) -> tuple[float, ...]:
    try:
        return checked_buckets([float(part) for part in text.split(",")])
    except (ValueError, ConfigError) as exc:
        cause = exc.cause if isinstance(exc, ConfigError) else f"{text!r} is not a list of numbers"
        raise argparse.ArgumentTypeError(
            f"{cause}: give increasing seconds, such as 0.1,1,60"
        ) from None


@contextlib.asynccontextmanager
async def serving_metrics(args: argparse.Namespace) -> AsyncIterator[None]:
    """The worker's /metrics, when --metrics-port asks for it, served for as long as the
    block runs: in a Trio task of the worker's own process, not a thread."""
    if args.metrics_port is None:
        yield
        return
    from .._core.metrics_endpoint import serve_metrics

    async with trio.open_nursery() as nursery:
        await nursery.start(
            functools.partial(serve_metrics, args.metrics_port, host=args.metrics_host)
        )
        yield
        nursery.cancel_scope.cancel()


DASHBOARD_HELP = (
    "Serve a web dashboard on 127.0.0.1: queues, charts, workers, cron tasks, the outbox, jobs"
    " and each job's attempts and steps, reloading itself; read-only unless --actions is given."
)
DASHBOARD_EXTRA = "pip install 'jobs-trio[dashboard]'"


def add_dashboard_command(dashboard: argparse.ArgumentParser) -> None:
    dashboard.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)"
    )
    dashboard.add_argument("--port", type=_port, default=8000, metavar="N", help="default 8000")
    dashboard.add_argument(
        "--actions",
        action="store_true",
        help="allow retry and cancel (opens the database for writing; forms carry a"
        " cross-site token)",
    )
    dashboard.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name the dashboard answers to besides loopback (repeatable; behind a"
        " proxy, the name users type)",
    )
    dashboard.add_argument(
        "--refresh",
        type=seconds,
        default=5.0,
        metavar="S",
        help="the overview and job pages reload every S seconds, with no script (0: never;"
        " default 5)",
    )
    dashboard.add_argument(
        "--app",
        metavar="MODULE[:ATTR]",
        help="the registry your workers run: adds each cron task's schedule and next fire",
    )
    add_logging_flags(dashboard)


def _dashboard(args: argparse.Namespace) -> int:
    configure_logging(args)
    url = database_url(args)
    try:
        from .._dashboard.serve import DashboardOptions, run_dashboard
    except ImportError as exc:
        raise ConfigError(
            f"the dashboard needs packages that are not installed ({exc.name or exc})",
            fix=DASHBOARD_EXTRA,
        ) from exc
    options = DashboardOptions(
        host=args.host,
        port=args.port,
        actions=args.actions,
        allowed_hosts=tuple(args.allowed_host),
        refresh=args.refresh,
    )
    registry = None if args.app is None else load_registry(args.app)
    return trio.run(
        run_dashboard,
        url,
        driver_options(args, url, existing=True),
        options,
        not structured(args),
        registry,
    )


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return trio.run(run_demo, args.db, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
