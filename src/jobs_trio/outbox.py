# The outbox write: `send.enqueue(outbox, ...)` stores the job in the APPLICATION's database,
# in its current transaction, for a relay to move into the job store once that commit happened.
# Apart because it is what an enqueue looks like when the job store is another database.
from __future__ import annotations

from collections.abc import Sequence

from .driver import Driver
from .records import Enqueued, NewJob


class Outbox:
    """The outbox of the database ``store`` is opened on (the application's own database,
    migrated by jobs_trio). Hand it to ``JobDefinition.enqueue`` instead of a driver.

    An outbox enqueue answers the id the job WILL have: the relay writes it under that id. A
    unique key is applied when the job reaches the job store (a key a live job holds there
    turns the relayed job into a no-op), so ``on_duplicate="raise"`` cannot tell here."""

    def __init__(self, store: Driver) -> None:
        self.store = store

    def now(self) -> float:
        return self.store.now()

    async def enqueue(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> Sequence[Enqueued]:
        await self.store.outbox_write(jobs, connection=connection)
        return [Enqueued(job.job_id, created=True) for job in jobs]
