# The outbox write: `send.enqueue(outbox, ...)` stores the job in the APPLICATION's database,
# in its current transaction, for a relay to move into the job store once that commit happened.
# Apart because it is what an enqueue looks like when the job store is another database.
from __future__ import annotations

from collections.abc import Sequence

from .driver import Driver
from .errors import ConfigError
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
        limited = sorted({job.name for job in jobs if job.limits is not None})
        if limited:
            # Refused, not dropped: the outbox's rows do not carry limits, and a relayed job
            # would run unlimited while its declaration says otherwise.
            raise ConfigError(
                f"jobs {limited} declare fleet limits, which the outbox does not carry yet",
                fix="enqueue these jobs on the job store's driver (inside"
                " jobs_trio.transaction() when it is the application's database)",
            )
        await self.store.outbox_write(jobs, connection=connection)
        return [Enqueued(job.job_id, created=True) for job in jobs]
