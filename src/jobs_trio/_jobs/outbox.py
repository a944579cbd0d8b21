# The outbox write: `send.enqueue(outbox, ...)` stores the job in the APPLICATION's database,
# in its current transaction, for a relay to move into the job store once that commit happened.
# Apart because it is what an enqueue looks like when the job store is another database.
from __future__ import annotations

from collections.abc import Sequence

from .._core.errors import ConfigError
from .._core.records import Enqueued, NewJob
from ..drivers.contract import Driver


class Outbox:
    """The outbox of the database ``store`` is opened on (the application's own database,
    migrated by jobs_trio). Hand it to ``JobDefinition.enqueue`` instead of a driver.

    An outbox enqueue answers the id the job WILL have: the relay writes it under that id. A
    row carries all a direct enqueue's job does (delay, priority, key, fleet limits resolved
    from the payload now, the run's context). A unique key is decided once, when the relay
    moves the row (a key a live job holds then makes the row a no-op, recorded as such), so
    ``on_duplicate="raise"`` cannot tell here (docs/transactions.md)."""

    def __init__(self, store: Driver) -> None:
        self.store = store

    def now(self) -> float:
        return self.store.now()

    async def enqueue(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> Sequence[Enqueued]:
        if any(job.unique_for is not None for job in jobs):
            # The relay decides a key when it moves the row, with no window to look through:
            # refused rather than written as a plain key, which would hold it far less long.
            raise ConfigError(
                "an outbox enqueue cannot take unique_for: the relay decides a key's holder"
                " when it moves the row, by its live jobs only",
                fix="enqueue into the job store directly for a key with a window, or use a"
                " plain key= through the outbox",
            )
        await self.store.outbox_write(jobs, connection=connection)
        return [Enqueued(job.job_id, created=True) for job in jobs]
