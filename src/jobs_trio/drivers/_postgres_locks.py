# Who held the locks a statement of ours waited for until its lock timeout, said so a reader can
# act on it (pid, application, how long its transaction has been open). Apart because the
# migrator's retries and the bridge's lock errors both name them, from one query.
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from ._postgres_pool import Connection


@attrs.frozen
class LockHolder:
    """A session holding (or queued for) a lock on a table of the schema, for longer than a
    statement of ours waited."""

    pid: int
    application: str
    user: str
    state: str  # pg_stat_activity's: active, idle in transaction, ...
    open_for: float | None  # seconds since its transaction began
    query: str  # its current or last statement, shortened
    locks: str  # "jobs AccessShareLock, steps AccessShareLock"
    waiting: bool  # queued for its locks, not holding them: a migration that waits without bound

    def described(self) -> str:
        opened = f"transaction open {self.open_for:.1f} s" if self.open_for is not None else ""
        parts = [
            f"application {self.application!r}" if self.application else "no application name",
            f"user {self.user!r}",
            opened,
            self.state,
            ("waiting for " if self.waiting else "holding ") + self.locks,
        ]
        said = ", ".join(p for p in parts if p)
        return f"pid {self.pid} ({said}; {self.query!r})"


async def lock_holders(conn: Connection, statement: str, *args: object) -> list[LockHolder]:
    """The sessions ``statement`` finds (postgres/_schema.sql: ``lock_holders``, those whose
    lock on a table of a schema is older than the wait that timed out; the migration lock's
    holder; what an index build waited for), oldest transaction first. Run on the asyncio
    side, in a transaction of its own or none (the failed one rolled back)."""
    rows: Sequence[Any] = await conn.fetch(statement, *args)
    return [
        LockHolder(
            pid=row["pid"],
            application=row["application_name"] or "",
            user=row["usename"] or "",
            state=row["state"] or "",
            open_for=row["open_for"],
            query=row["query"] or "",
            locks=row["locks"] or "",
            waiting=bool(row["waiting"]),
        )
        for row in rows
    ]


def described(holders: Sequence[LockHolder]) -> str:
    """One phrase for a message: who held it, or that nobody still does."""
    if not holders:
        return "no session holds it any more (it ended, or its transaction did, just after)"
    return "held by " + "; ".join(h.described() for h in holders)
