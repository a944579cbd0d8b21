# `jobs-trio relay APP_URL JOBS_URL`: a relay as a process of its own, moving the outbox of the
# application's database into the job store until SIGTERM/SIGINT, then stopping as a worker
# drains. Apart from cli.py so each command group has its place (and cli.py one line for it).
from __future__ import annotations

import argparse
import signal
from typing import Any

import trio

from .._core.errors import ConfigError
from .._outbox.relay import open_relay
from .._run.early_signals import stopped_at_start
from .._run.lifecycle import Lifecycle, open_lifecycle
from ..drivers._open_driver import DriverKind, driver_kind, open_driver
from .args import Command, count, database_url, driver_options, positive_seconds, seconds
from .logging_flags import add_logging_flags, configure_logging

HELP = (
    "Move the outbox of the application's database (APP_URL) into the job store (JOBS_URL, else"
    " --db) until SIGTERM/SIGINT, then stop: the pass in flight finishes within --grace and the"
    " process exits 0. One database for both (the same URL) moves each batch in one transaction."
)


def add_relay_command(command: Command) -> None:
    """Register ``relay`` with cli.py's ``command`` helper."""
    # Imported here: cli.py imports this module, and its argument types are its own.

    relay = command("relay", _relay, HELP)
    relay.add_argument("app_url", metavar="APP_URL", help="the database the application writes")
    relay.add_argument(
        "jobs_url", metavar="JOBS_URL", nargs="?", help="the job store (default: --db)"
    )
    relay.add_argument(
        "--app-schema",
        metavar="S",
        help="PostgreSQL schema of APP_URL's outbox (default jobs_trio); --schema is JOBS_URL's",
    )
    relay.add_argument("--batch", type=count, default=100, metavar="N", help="rows per pass")
    relay.add_argument(
        "--poll", type=positive_seconds, default=1.0, metavar="S", help="idle wait (default 1)"
    )
    relay.add_argument(
        "--lease",
        type=positive_seconds,
        default=60.0,
        metavar="S",
        help="how long a pass holds its rows from other relays (default 60)",
    )
    relay.add_argument(
        "--grace", type=seconds, default=25.0, metavar="S", help="stop budget (default 25)"
    )
    add_logging_flags(relay)


def _relay(args: argparse.Namespace) -> int:
    if args.jobs_url and args.db and args.jobs_url != args.db:
        raise ConfigError(
            "two job stores were given: JOBS_URL and --db",
            fix="give the job store once, as JOBS_URL or as --db",
        )
    jobs_url = args.jobs_url or database_url(args, one_shot=False)
    for url in (args.app_url, jobs_url):
        if driver_kind(url) is DriverKind.MEMORY:
            raise ConfigError(
                "memory:// lives in one process: no other process writes its outbox or reads"
                " its jobs",
                fix="give the SQLite or PostgreSQL databases the application and its workers use",
            )
    app_options = _app_options(args.app_url, args.app_schema)
    store_options = driver_options(args, jobs_url)
    configure_logging(args)
    if stopped_at_start(args.early, "relay"):
        return 0
    return trio.run(_run_relay, args, args.app_url, app_options, jobs_url, store_options)


def _app_options(url: str, schema: str | None) -> dict[str, Any]:
    kind = driver_kind(url)
    if schema is not None and kind is not DriverKind.POSTGRES:
        raise ConfigError(
            f"--app-schema {schema!r} was given for {url.split(':', 1)[0]}: only PostgreSQL has"
            " schemas",
            fix="drop --app-schema for this database",
        )
    if kind is DriverKind.SQLITE:
        # The application's file must be there: a mistyped path would relay an empty outbox
        # forever instead of failing.
        return {"create": False}
    return {} if schema is None else {"schema": schema}


async def _run_relay(
    args: argparse.Namespace,
    app_url: str,
    app_options: dict[str, Any],
    jobs_url: str,
    store_options: dict[str, Any],
) -> int:
    # The drivers outlive the lifecycle: the pass in flight writes before they close.
    async with (
        open_driver(app_url, **app_options) as app_db,
        open_driver(jobs_url, **store_options) as store,
    ):
        lifecycle: Lifecycle | None = None
        try:
            async with (
                open_lifecycle(grace=args.grace, early=args.early) as lifecycle,
                open_relay(
                    app_db,
                    store,
                    lifecycle=lifecycle,
                    batch=args.batch,
                    poll_interval=args.poll,
                    lease=args.lease,
                ),
            ):
                await trio.sleep_forever()  # ended by the lifecycle once the relay stopped
        finally:
            if lifecycle is not None and lifecycle.shut_down:
                # As the worker command does: a second signal during the drivers' close would
                # kill a process that stopped cleanly (exit 143 after a clean stop).
                for number in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(number, signal.SIG_IGN)
    return 0
