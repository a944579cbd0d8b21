# How the PostgreSQL driver talks through PgBouncer (issue 20): the modes, and what each changes
# when a connection opens. Apart because it is the one place that knows a pooler may stand
# between the driver and the server.
"""Three ways to reach PostgreSQL, chosen by ``?pgbouncer=`` in the URL or ``pgbouncer=``:

* direct (the default): the session settings (statement and lock timeouts, planner settings)
  travel as startup parameters; statements are prepared once per connection; LISTEN wakes
  the workers.
* ``session`` — PgBouncer in session mode. PgBouncer refuses unknown startup parameters, so the
  settings are sent as one ``SET`` round trip when a pooled connection opens. Everything else is
  as direct (a session keeps its server connection: prepared statements and LISTEN work).
* ``transaction`` — PgBouncer in transaction mode: a server connection is ours only for one
  transaction. No session state survives it, so: no ``SET`` (put the timeouts on the worker's
  role: ``ALTER ROLE jobs SET statement_timeout = '30s'``), no prepared statements kept
  (asyncpg's cache off: every statement is parsed and planned each time), and LISTEN only on a
  direct connection to the server (``?listen_host=db&listen_port=5432``, or ``listen_url=``);
  without one the workers poll every second (``postgres.DEAF_POLL``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import attrs

from .._core.errors import ConfigError

DIRECT = "direct"
SESSION = "session"
TRANSACTION = "transaction"
MODES = (DIRECT, SESSION, TRANSACTION)

# Query parameters that are ours, not asyncpg's: asyncpg would send each as a startup parameter.
_OURS = ("pgbouncer", "listen_host", "listen_port")
# Ours too when a pooler stands in between: PgBouncer refuses them as startup parameters (the
# driver sends them another way, or not at all; see the modes above).
_SETTINGS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")


@attrs.frozen
class Pooler:
    mode: str  # one of MODES
    url: str  # what asyncpg connects to for the pool: our query parameters taken out
    listen_url: str | None  # where LISTEN goes; None: nowhere (the workers poll)

    @classmethod
    def of(cls, url: str, pgbouncer: str | None = None, listen_url: str | None = None) -> Pooler:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        given = dict(query)
        mode = pgbouncer if pgbouncer is not None else given.get("pgbouncer", DIRECT)
        if mode not in MODES:
            raise ConfigError(
                f"pgbouncer={mode!r} is not a mode the PostgreSQL driver knows",
                fix="give pgbouncer=session or pgbouncer=transaction (PgBouncer's pool_mode),"
                " or leave it out to connect directly",
            )
        dropped = _OURS + (_SETTINGS if mode != DIRECT else ())
        asyncpg_query = urlencode([(k, v) for k, v in query if k not in dropped])
        kept = urlunsplit(parts._replace(query=asyncpg_query))
        if listen_url is None and ("listen_host" in given or "listen_port" in given):
            # Same user, password and database; another host and/or port.
            host = given.get("listen_host") or parts.hostname or "localhost"
            port = given.get("listen_port") or str(parts.port or 5432)
            login = parts.netloc.rpartition("@")[0]
            netloc = f"{login}@{host}:{port}" if login else f"{host}:{port}"
            listen_url = urlunsplit(urlsplit(kept)._replace(netloc=netloc))
        if listen_url is None and mode != TRANSACTION:
            listen_url = kept  # a session keeps its LISTEN
        return cls(mode=mode, url=kept, listen_url=listen_url)

    @property
    def session_url(self) -> str | None:
        """Where a connection that keeps its session between statements goes (a session's
        advisory lock, a SET, an index built CONCURRENTLY): the pool's address, unless PgBouncer
        pools transactions, then the direct one LISTEN uses; None when there is none."""
        return self.listen_url if self.mode == TRANSACTION else self.url

    def connect_options(self, purpose: str, session: Mapping[str, str]) -> dict[str, Any]:
        """asyncpg.connect's options for a connection of ``purpose`` ("pool" or "listen")."""
        settings = dict(session) if purpose == "pool" and self.mode == DIRECT else {}
        options: dict[str, Any] = {"server_settings": settings}
        if self.mode == TRANSACTION and purpose == "pool":
            # A named prepared statement lives on one server connection, which the next
            # transaction may not get: "prepared statement does not exist".
            options["statement_cache_size"] = 0
        return options

    def session_sets(self, purpose: str, session: Mapping[str, str]) -> str | None:
        """What a pooled connection runs once it is open: the settings as one SET batch in
        session mode (PgBouncer refused them at startup); nothing otherwise."""
        if self.mode != SESSION or purpose != "pool" or not session:
            return None
        return "; ".join(f"SET {name} = '{value}'" for name, value in session.items())
