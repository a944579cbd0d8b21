# What PostgreSQL's errors mean to the drivers: a value refused, a lock another session holds, a
# server gone, a URL wrong. Apart from the bridge, which runs operations; the producers read it.
from __future__ import annotations

from .._core.errors import ConfigError, DriverError, JobsError, RowLocked, ValueRefused
from .._core.redaction import redact_url

# SQLSTATE classes in which the server refuses the statement for the values it carries: data
# exceptions (22: a NUL or invalid byte, a number out of range), integrity (23: a constraint),
# program limits (54: a value too large) and RAISE from a trigger (P0001). Sent again, the same
# write fails the same way, so it is isolated rather than retried.
REFUSED_CLASSES = ("22", "23", "54")
REFUSED_STATES = ("P0001",)
# Refused at login for a setting the URL's query passed: unknown (42704), or a bad value (22023).
URL_SETTING_STATES = ("42704", "22023")
# A lock another session holds: lock_not_available (the lock_timeout ran out) and
# deadlock_detected. The write can succeed later; when a row's lock, only the writes touching
# that row wait.
ROW_LOCK_STATES = ("55P03", "40P01")
LOCK_TIMEOUT_STATE = "55P03"


def lock_error(exc: Exception, sqlstate: str, what: str) -> RowLocked:
    """A lock another session held past the wait allowed for it. A row's lock says which row
    (PostgreSQL's context names the tuple); a table's says nothing more, and is the one a
    migration or a long reader's transaction takes."""
    context = getattr(exc, "context", None) or ""
    if sqlstate != LOCK_TIMEOUT_STATE:
        kind = "a lock"  # a deadlock: PostgreSQL chose this statement to cancel
    elif "tuple" in context:
        kind = "a row"
    else:
        kind = "a table"
    said = f"{kind} that {what} needs is locked by another session: [{sqlstate}] {exc}"
    return RowLocked(
        said + (f" ({context})" if context else ""),
        fix="end or wait out the transaction that holds it (pg_stat_activity names it:"
        " SELECT pg_terminate_backend(pid) ends it); nothing of this call was written, and it"
        " can be retried (a worker retries its own writes)",
    )


def sqlstate_of(exc: BaseException | None) -> str:
    return getattr(exc, "sqlstate", None) or ""


def translate(exc: Exception, what: str, *, url: str, where: str) -> JobsError:
    """What an error of asyncpg's is, as the error jobs_trio raises: a refusal (ConfigError,
    ValueRefused, RowLocked) or a failure that may pass (DriverError). ``where`` is the
    server's ``host:port``, ``url`` the URL (redacted wherever it is said)."""
    import asyncpg
    from asyncpg.exceptions._base import DataError as ArgumentError

    # Refusals first: each fails the same way however often it is tried, so none may say
    # "retry" (nor "run jobs-trio migrate", which cannot create a database).
    if isinstance(exc, asyncpg.exceptions.InvalidCatalogNameError):
        return ConfigError(
            f"PostgreSQL at {where} has no such database: {exc}",
            fix="create it (CREATE DATABASE, or `createdb`), then run `jobs-trio migrate"
            " --db URL` once; or correct the database name in the URL",
        )
    if isinstance(exc, asyncpg.exceptions.InvalidAuthorizationSpecificationError):
        return ConfigError(  # 28000 (no such role, pg_hba.conf) and 28P01 (password)
            f"PostgreSQL at {where} refused the login: {exc}",
            fix="check the user and password in the URL, and the server's pg_hba.conf"
            " entry for this host",
        )
    if "unsupported startup parameter" in str(exc):
        # PgBouncer's answer to the session settings sent at startup (a direct connect).
        return ConfigError(
            f"a connection pooler at {where} refused a startup parameter: {exc}",
            fix="add ?pgbouncer=session (or ?pgbouncer=transaction) to the URL: the driver"
            " then sends its settings another way (docs/drivers.md, 'PgBouncer')",
        )
    sqlstate = getattr(exc, "sqlstate", None) or ""
    if what.startswith("connecting") and sqlstate in URL_SETTING_STATES:
        return _url_setting_refused(exc, where)
    if isinstance(exc, asyncpg.exceptions.TooManyConnectionsError):
        # 53300: max_connections (or a role's or database's CONNECTION LIMIT) is used up.
        # Retryable (slots free up), and the callers retry at their own pace (a failed
        # claim waits poll_interval): the fix is capacity, which no retry brings.
        return DriverError(
            f"PostgreSQL at {where} has no connection slot left: {exc}",
            fix="a worker holds up to pool_size + 1 connections (docs/drivers.md,"
            " 'Connections'): lower pool_size, raise max_connections, or put PgBouncer"
            " in front of the server",
        )
    if isinstance(exc, ArgumentError | UnicodeError | OverflowError):
        # Refused on this side, while encoding the arguments (a lone surrogate, an int
        # past int8): nothing reached the server and the connection is fine.
        return ValueRefused(
            f"PostgreSQL driver could not send {what}: {type(exc).__name__}: {exc}",
            fix="change the value: it cannot be stored as it is; retrying fails the same way",
        )
    if isinstance(exc, asyncpg.PostgresError) and (
        sqlstate[:2] in REFUSED_CLASSES or sqlstate in REFUSED_STATES
    ):
        return ValueRefused(
            f"PostgreSQL refused a value during {what}: [{sqlstate}] {exc}",
            fix="change the value: the database refuses it as it is (a constraint or"
            " trigger, a value too large; PostgreSQL stores no NUL character in text, and"
            " integers only from -2147483648 to 2147483647); retrying fails the same way",
        )
    if isinstance(exc, asyncpg.exceptions.ClientConfigurationError):
        return ConfigError(
            f"asyncpg cannot use the URL {redact_url(url)!r}: {exc}",
            fix="correct the URL's options (see asyncpg.connect's dsn parameter)",
        )
    if isinstance(exc, asyncpg.exceptions.QueryCanceledError):
        return DriverError(
            f"PostgreSQL cancelled {what} at {where}: {exc}",
            fix="check statement_timeout and whether an operator ran pg_cancel_backend; "
            "the operation can be retried",
        )
    lost = (
        asyncpg.PostgresConnectionError,  # class 08, "closed in the middle of operation"
        asyncpg.exceptions.OperatorInterventionError,  # pg_terminate_backend, shutdown
        asyncpg.exceptions.CannotConnectNowError,
    )
    closed = isinstance(exc, asyncpg.InterfaceError) and "closed" in str(exc)
    if isinstance(exc, lost) or closed:
        return DriverError(
            f"lost the connection to PostgreSQL at {where} during {what}: {exc}",
            fix="retry the operation: the pool replaces dead connections on its own; if it "
            "keeps failing, check that the server is up and reachable",
        )
    if isinstance(exc, asyncpg.InternalClientError):
        # asyncpg's protocol is stuck in a state it cannot leave. Seen when the server kills
        # an IDLE pooled connection: asyncpg reads the "terminating connection" error before
        # the close, so the pool still sees it open, and the next statement on it fails with
        # "cannot switch to state 12; another operation (2) is in progress". A DriverError
        # makes run() drop the connection and the caller retry, as for any lost connection.
        return DriverError(
            f"the connection to PostgreSQL at {where} became unusable during {what}: "
            f"{type(exc).__name__}: {exc}",
            fix="retry the operation: the pool replaces the connection on its own; if it "
            "keeps failing, check that the server is up and the connections are not being "
            "killed",
        )
    if isinstance(exc, asyncpg.InterfaceError):
        return DriverError(
            f"asyncpg refused {what}: {exc}",
            fix="if you passed connection=, pass an open asyncpg connection that no other "
            "task is using at the same moment",
        )
    if isinstance(exc, OSError):  # refused, unreachable, timed out (TimeoutError included)
        return DriverError(
            f"cannot reach PostgreSQL at {where} during {what}: {type(exc).__name__}: {exc}",
            fix="check that the server is running and the URL's host and port are right; "
            "the operation can be retried once it answers",
        )
    if isinstance(exc, asyncpg.PostgresError) and sqlstate in ROW_LOCK_STATES:
        return lock_error(exc, sqlstate, what)
    if isinstance(exc, asyncpg.PostgresError):
        return DriverError(
            f"PostgreSQL refused {what}: [{exc.sqlstate}] {exc}",
            fix="retry the operation; if it fails the same way, the database may have been "
            "changed by hand: run `jobs-trio migrate` and check the server's log",
        )
    # Anything else asyncpg raised leaves its connection in a state nobody planned for: a
    # DriverError makes run() drop that connection instead of handing it to the next call.
    return DriverError(
        f"unexpected error from PostgreSQL at {where} during {what}: {type(exc).__name__}: {exc}",
        fix="retry the operation; if it keeps failing, report it with the server's log",
    )


def _url_setting_refused(exc: Exception, where: str) -> ConfigError:
    """The server refused a setting at login: asyncpg sends each query parameter of the URL
    it does not read itself as a session setting, so a typo (``?bogus=1``) or libpq's own
    option (``?connect_timeout=10``) fails every connection the same way. Said as the URL
    mistake it is: retrying or migrating (the generic fix) cannot help."""
    return ConfigError(
        f"PostgreSQL at {where} refused a setting the URL passes: {exc}",
        fix="remove or correct that ?NAME=VALUE in the URL: a parameter asyncpg does not"
        " read (sslmode, sslrootcert, target_session_attrs, ... ; jobs_trio reads"
        " statement_timeout, lock_timeout, idle_in_transaction_session_timeout, pgbouncer,"
        " listen_host, listen_port) is sent to"
        " the server as a setting, and must be one it knows with a value it takes"
        " (connect_timeout is libpq's, not asyncpg's: leave it out)",
    )
