# What a producer's caller sees when PostgreSQL refuses or fails a write, for psycopg and asyncpg
# alike (both carry the server's SQLSTATE): the driver's words for the same cases, read from the
# same SQLSTATE lists. Apart so that the two clients' errors become one set of jobs_trio errors.
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .._core.errors import ConfigError, DriverError, JobsError, RowLocked, ValueRefused
from ..drivers._postgres_errors import REFUSED_CLASSES, REFUSED_STATES, ROW_LOCK_STATES

# The schema (3F000) or its tables (42P01) are not there: never migrated, or another schema=.
_NOT_MIGRATED = ("3F000", "42P01")
# in_failed_sql_transaction: the caller's transaction was aborted by an earlier statement of
# its own; every statement is refused until it rolls back, so a retry as it is fails again.
_ABORTED = "25P02"


def postgres_failure(exc: BaseException, *, where: str, schema: str) -> JobsError | None:
    """The jobs_trio error for ``exc`` raised by a producer's write to ``where`` (a redacted
    URL, or "the caller's connection"); None when it is not a database error."""
    module = type(exc).__module__
    if not module.startswith(("psycopg", "asyncpg")) and not isinstance(exc, OSError):
        return None
    sqlstate = getattr(exc, "sqlstate", None) or ""
    if sqlstate in _NOT_MIGRATED:
        return ConfigError(
            f"schema {schema!r} at {where} has no jobs_trio tables: {exc}",
            fix=f"run `jobs-trio migrate --db URL` (schema {schema!r}), or give the producer"
            " the schema= the workers use",
        )
    if sqlstate[:2] in REFUSED_CLASSES or sqlstate in REFUSED_STATES:
        return ValueRefused(
            f"PostgreSQL refused a value of the producer's write at {where}: [{sqlstate}] {exc}",
            fix="change the value: the database refuses it as it is; retrying fails the same"
            " way (in your transaction only this write was undone: a savepoint)",
        )
    if sqlstate == _ABORTED:
        return ConfigError(
            f"the transaction on {where} was already aborted by an earlier error of its own: {exc}",
            fix="roll it back (or back to your savepoint) first, then enqueue; nothing was written",
        )
    if sqlstate in _TRANSACTION_CONFLICTS:
        return DriverError(
            f"PostgreSQL ended the transaction of the producer's write at {where} in a conflict"
            f" with another one: [{sqlstate}] {exc}",
            fix="roll your transaction back and run it again from its start (in it, this write"
            " fails the same way); in a transaction of the producer's own, retry the call",
        )
    if sqlstate in ROW_LOCK_STATES:
        return RowLocked(
            f"the producer's write at {where} waited on a lock held elsewhere: {exc}",
            fix="retry the call; a unique key's holder being written by another transaction"
            " is the usual cause",
        )
    if sqlstate:
        return DriverError(
            f"PostgreSQL failed the producer's write at {where}: [{sqlstate}] {exc}",
            fix="check the server's log; the call can be retried",
        )
    return DriverError(
        f"the producer could not reach PostgreSQL at {where}: {type(exc).__name__}: {exc}",
        fix="check that the server is up and the URL right; the call can be retried (nothing"
        " was committed unless the failure came while committing: a key makes a retry safe)",
    )


# A serialization failure (REPEATABLE READ, SERIALIZABLE): the transaction it ended must run
# again from its start. "The call can be retried" failed the same way, inside it.
_TRANSACTION_CONFLICTS = frozenset({"40001"})


@contextlib.contextmanager
def postgres_failures(*, where: str, schema: str) -> Iterator[None]:
    """Raise the database's errors met in the block (a write, a schema check) as
    ``postgres_failure`` words them; any other error passes as it is."""
    try:
        yield
    except Exception as exc:
        mapped = postgres_failure(exc, where=where, schema=schema)
        if mapped is None:
            raise
        raise mapped from exc
