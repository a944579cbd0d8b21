# `jobs-trio dashboard`: open the database (read-only unless actions are on) and serve the
# dashboard with hypercorn's Trio worker until SIGINT/SIGTERM. Apart from app.py, which an
# application mounts on a driver and a server of its own.
from __future__ import annotations

import contextlib
import functools
import logging
import signal
import sys
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import attrs
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from .._core.errors import cannot_listen
from .._core.logs import log_event
from .._jobs.registry import Registry
from ..drivers._open_driver import DriverKind, driver_kind, open_driver
from ..drivers.contract import Driver
from .app import REFRESH_SECONDS, dashboard_app
from .cross_site import LOOPBACK_HOSTS

# PostgreSQL's own guard: every transaction of the session starts READ ONLY, so even a bug in
# the dashboard cannot write. asyncpg passes unknown URL query parameters as session settings.
PG_READ_ONLY = "default_transaction_read_only"


@attrs.frozen
class DashboardOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    actions: bool = False
    allowed_hosts: tuple[str, ...] = ()
    refresh: float = REFRESH_SECONDS  # the overview and a job's page reload this often; 0: never


def read_only_url(url: str) -> str:
    """``url`` with PostgreSQL's read-only session setting; other URLs as they are (SQLite's
    read-only open is a driver option, memory:// has no other reader to protect)."""
    if driver_kind(url) is not DriverKind.POSTGRES:
        return url
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != PG_READ_ONLY]
    query.append((PG_READ_ONLY, "on"))
    return urlunsplit(parts._replace(query=urlencode(query)))


@contextlib.asynccontextmanager
async def open_dashboard_driver(
    url: str, options: Mapping[str, Any], *, actions: bool
) -> AsyncIterator[Driver]:
    """The driver the dashboard reads through: read-only (SQLite's read-only open, PostgreSQL's
    read-only session) unless actions are on."""
    opened = dict(options)
    if not actions:
        url = read_only_url(url)
        if driver_kind(url) is DriverKind.SQLITE:
            opened.update(read_only=True, create=False)
    async with open_driver(url, **opened) as driver:
        yield driver


def warn_if_exposed(host: str) -> None:
    """A dashboard bound to every address, or to one other machines reach, answers anyone who
    can reach it: it has no login of its own. Said at WARNING as it starts."""
    if host in LOOPBACK_HOSTS or host == "::1":
        return
    reach = "every address of this machine" if host in ("0.0.0.0", "::", "") else host
    log_event(
        "jobs.dashboard.exposed",
        logging.WARNING,
        host=host,
        why=f"the dashboard listens on {reach} and has no login: anyone who can reach it"
        " reads every job's payload, result and error",
        fix="keep the default 127.0.0.1 and put an authenticating reverse proxy in front"
        " (--allowed-host NAME for the name users type), or firewall the port",
    )


def hosts_answered(bind_host: str, extra: Iterable[str]) -> tuple[str, ...]:
    """The Host names the dashboard answers to: loopback names, the address it binds (unless
    that is a wildcard, which names no host) and those given with --allowed-host."""
    hosts = set(LOOPBACK_HOSTS) | set(extra)
    if bind_host not in ("0.0.0.0", "::", ""):
        hosts.add(bind_host)
    return tuple(sorted(hosts))


async def serve_dashboard(
    driver: Driver,
    options: DashboardOptions,
    *,
    shutdown: trio.Event | None = None,
    registry: Registry | None = None,
    announce: bool = True,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the dashboard on ``driver`` until ``shutdown`` is set (or the task is cancelled).
    ``task_status.started`` answers the URLs it listens on (port 0 picks a free one), which
    it logs (``jobs.dashboard.serving``) unless ``announce`` is False (the caller says them).
    ``registry``: the cron tasks' schedules and next fires (dashboard_app)."""
    warn_if_exposed(options.host)
    config = Config()
    host = f"[{options.host}]" if ":" in options.host else options.host
    config.bind = [f"{host}:{options.port}"]
    config.accesslog = None
    # A logger, not "-": hypercorn then adds no stream handler of its own, and its lines reach
    # whatever the application (or --log-format) configured, in that format.
    config.errorlog = logging.getLogger("hypercorn.error")
    # Hypercorn says where it listens too ("Running on ..."): the address is said once, here.
    config.errorlog.addFilter(_not_running_on)
    app = dashboard_app(
        driver,
        actions=options.actions,
        allowed_hosts=hosts_answered(options.host, options.allowed_hosts),
        refresh=options.refresh,
        registry=registry,
    )

    stop = trio.Event() if shutdown is None else shutdown

    async def stop_when_told() -> None:
        await stop.wait()

    async with trio.open_nursery() as nursery:
        # The server runs in this nursery until the shutdown trigger returns; its bound URLs
        # (the real port when 0 was asked for) come back through start().
        try:
            urls: list[str] = await nursery.start(
                functools.partial(serve, app, config, shutdown_trigger=stop_when_told)  # type: ignore[arg-type]
            )
        except* OSError as refused:
            # Hypercorn binds inside its own nurseries: a port in use, an address not ours.
            first = refused.exceptions[0]
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            assert isinstance(first, OSError)
            raise cannot_listen(
                "the dashboard", options.host, options.port, first, flag="--port"
            ) from None
        if announce:
            log_event("jobs.dashboard.serving", urls=" ".join(urls), actions=options.actions)
        task_status.started(urls)


def _not_running_on(record: logging.LogRecord) -> bool:
    """Hypercorn's own "Running on URL" line is left out: jobs_trio says where it serves."""
    return not str(record.msg).startswith("Running on")


async def run_dashboard(
    url: str,
    driver_options: Mapping[str, Any],
    options: DashboardOptions,
    banner: bool = True,
    registry: Registry | None = None,
) -> int:
    """The CLI command's body: serve until SIGINT or SIGTERM, then stop serving and exit 0.
    The URL is said once bound, once: printed (``banner``, for a person) or else logged, as
    ``jobs.dashboard.serving`` (for a pipeline); so ``--port 0`` tells which port it took."""
    shutdown = trio.Event()
    async with (
        open_dashboard_driver(url, driver_options, actions=options.actions) as driver,
        trio.open_nursery() as nursery,
    ):
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            urls = await nursery.start(
                functools.partial(
                    serve_dashboard,
                    driver,
                    options,
                    shutdown=shutdown,
                    registry=registry,
                    announce=not banner,
                )
            )
            if banner:
                mode = "actions on" if options.actions else "read-only"
                print(f"dashboard on {' '.join(urls)}/ ({mode}); Ctrl-C to stop", file=sys.stderr)
            async for _ in signals:
                shutdown.set()
                break
    return 0
