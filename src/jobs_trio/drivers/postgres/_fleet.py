# The PostgreSQL driver's fleet: workers' presence, paused queues and who has heard of a pause.
# Apart because it is what the workers tell each other, not what a job is.
from __future__ import annotations

import json
from collections.abc import Sequence

import trio

from ..._core.records import PauseHolder, PauseLook, QueuePause, WorkerPresence
from .._postgres_listener import PAUSES_CHANGED
from .._postgres_pool import Connection
from .._rules import FORGET_WORKERS_AFTER, decode_jobs, encode_jobs
from ._connection import DEAF_POLL, PostgresConnection


class PostgresFleet(PostgresConnection):
    """The fleet: workers' presence and the queues' pauses."""

    async def pause_queue(self, queue: str, *, by: str | None = None) -> QueuePause:
        self._check_open()
        now = self.now()
        sql = self._sql

        async def pause(conn: Connection) -> QueuePause:
            await conn.execute(sql["pause_lock"])
            row = await conn.fetchrow(
                sql["pause_queue"], queue, now, by, sql.channel, PAUSES_CHANGED
            )
            return QueuePause(*row)

        paused: QueuePause = await self.bridge.run(pause, what="pause", transaction=True)
        return paused

    async def resume_queue(self, queue: str) -> bool:
        self._check_open()
        sql = self._sql

        async def resume(conn: Connection) -> bool:
            row = await conn.fetchrow(sql["resume_queue"], queue, sql.channel, PAUSES_CHANGED)
            return bool(row["resumed"])

        resumed: bool = await self.bridge.run(resume, what="resume")
        return resumed

    async def queue_pauses(self) -> Sequence[QueuePause]:
        return [QueuePause(*row) for row in await self._fetch("paused_queues", what="queue pauses")]

    async def _pause_look(self) -> PauseLook:
        sql = self._sql

        async def read(conn: Connection) -> PauseLook:
            rows = await conn.fetch(sql["pause_look"])
            return PauseLook(
                rows[0]["epoch"],
                tuple(QueuePause(*row[1:]) for row in rows if row["queue"] is not None),
            )

        look: PauseLook = await self.bridge.run(read, what="queue pauses")
        return look

    async def wait_for_pauses(self, seen: int | None, timeout: float) -> PauseLook:
        self._check_open()
        with self._listener.waiting([PAUSES_CHANGED]) as woken:
            # LISTEN before the look, as wait_for_work does: a pause committed after the look
            # notifies this waiter, one committed before it is seen by it.
            await self._listener.listen()
            look = await self._pause_look()
            if look.epoch != seen:
                return look
            if not self._listener.connected:
                timeout = min(timeout, DEAF_POLL)  # deaf: poll until LISTEN is back
            with trio.move_on_after(timeout):
                await woken.wait()
        return await self._pause_look()

    async def pauses_heard(self, worker_id: str, epoch: int) -> None:
        now = self.now()
        await self._execute(
            "pauses_heard", worker_id, epoch, now, now - FORGET_WORKERS_AFTER, what="pauses heard"
        )

    async def pause_holders(self, queue: str) -> Sequence[PauseHolder]:
        rows = await self._fetch("pause_holders", queue, what="pause holders")
        return [PauseHolder(*row) for row in rows]

    async def worker_seen(self, presence: WorkerPresence) -> None:
        self._check_open()
        sql = self._sql
        forget_before = self.now() - FORGET_WORKERS_AFTER
        p = presence

        async def write(conn: Connection) -> None:
            await conn.execute(
                sql["worker_seen"],
                p.worker_id,
                p.host,
                p.pid,
                json.dumps(p.queues),
                p.concurrency,
                p.running,
                p.state,
                p.version,
                p.started_at,
                p.seen_at,
                p.every,
                forget_before,
                encode_jobs(p.jobs),
            )

        await self.bridge.run(write, what="worker_seen")

    async def worker_gone(self, worker_id: str) -> None:
        await self._execute("worker_gone", worker_id, what="worker_gone")

    async def workers(self) -> Sequence[WorkerPresence]:
        return [
            WorkerPresence(
                **{
                    **dict(row),
                    "queues": tuple(json.loads(row["queues"])),
                    "jobs": decode_jobs(row["jobs"]),
                }
            )
            for row in await self._fetch("workers", what="workers")
        ]
