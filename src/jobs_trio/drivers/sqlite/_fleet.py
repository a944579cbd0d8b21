# The SQLite driver's fleet: workers' presence, paused queues and who has heard of a pause.
# Apart because it is what the workers tell each other, not what a job is.
from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any, Final

import attrs
import trio

from ..._core.records import PauseHolder, PauseLook, QueuePause, WorkerPresence
from .._rules import FORGET_WORKERS_AFTER, decode_jobs, encode_jobs
from ._connection import SqliteConnection, data_version

_WORKER_FIELDS: Final = tuple(field.name for field in attrs.fields(WorkerPresence))


_WORKER_COLUMNS: Final = ", ".join(_WORKER_FIELDS)


def _presence(row: Sequence[Any]) -> WorkerPresence:
    fields = dict(zip(_WORKER_FIELDS, row, strict=True))
    fields["queues"] = tuple(json.loads(fields["queues"]))
    fields["jobs"] = decode_jobs(fields["jobs"])
    return WorkerPresence(**fields)


def _pauses(conn: sqlite3.Connection) -> list[QueuePause]:
    rows = conn.execute(
        "SELECT queue, paused_at, paused_by, coalesce(epoch, 0) FROM queue_pauses ORDER BY queue"
    )
    return [QueuePause(*row) for row in rows]


def _next_pause_epoch(conn: sqlite3.Connection) -> int:
    """One more change of the pauses, in the caller's write transaction (one at a time)."""
    (epoch,) = conn.execute(
        "UPDATE pause_epoch SET epoch = epoch + 1 WHERE id = 1 RETURNING epoch"
    ).fetchone()
    return int(epoch)


class SqliteFleet(SqliteConnection):
    """The fleet: workers' presence and the queues' pauses."""

    async def pause_queue(self, queue: str, *, by: str | None = None) -> QueuePause:
        def work(conn: sqlite3.Connection, now: float) -> QueuePause:
            row = conn.execute(
                "SELECT queue, paused_at, paused_by, coalesce(epoch, 0) FROM queue_pauses"
                " WHERE queue = ?",
                (queue,),
            ).fetchone()
            if row is not None:
                return QueuePause(*row)
            pause = QueuePause(queue, now, by, _next_pause_epoch(conn))
            conn.execute(
                "INSERT INTO queue_pauses (queue, paused_at, paused_by, epoch) VALUES (?, ?, ?, ?)",
                (queue, now, by, pause.epoch),
            )
            return pause

        pause = await self._transact(work)
        self._pause_changed()
        return pause

    async def resume_queue(self, queue: str) -> bool:
        def work(conn: sqlite3.Connection, now: float) -> bool:
            gone = conn.execute(
                "DELETE FROM queue_pauses WHERE queue = ? RETURNING queue", (queue,)
            ).fetchone()
            if gone is not None:
                _next_pause_epoch(conn)
            return gone is not None

        resumed = await self._transact(work)
        self._pause_changed()
        self._wake()  # its jobs are work again
        return resumed

    async def queue_pauses(self) -> Sequence[QueuePause]:
        def work(conn: sqlite3.Connection, now: float) -> list[QueuePause]:
            return _pauses(conn)

        return await self._transact(work, mode="read")

    async def _pause_look(self) -> tuple[PauseLook, int]:
        """The look, and the file's data version as it read it (_await_wake_up)."""

        def work(conn: sqlite3.Connection, now: float) -> tuple[PauseLook, int]:
            # One read transaction: the epoch and the pauses of one state of the file.
            (epoch,) = conn.execute("SELECT epoch FROM pause_epoch WHERE id = 1").fetchone()
            return PauseLook(epoch, tuple(_pauses(conn))), data_version(conn)

        return await self._transact(work, mode="read")

    async def wait_for_pauses(self, seen: int | None, timeout: float) -> PauseLook:
        """Another process's pause is seen once the file's data version moves (within
        CHANGE_LOOK), as its enqueues are (wait_for_work), and at the latest at the next look,
        every ``poll_interval``; this driver's own wake this process's waiters at once."""
        deadline = trio.current_time() + timeout
        while True:
            changes = self._pause_changes
            look, version = await self._pause_look()
            now = trio.current_time()
            if look.epoch != seen or now >= deadline:
                return look
            if self._pause_changes != changes:
                continue  # a pause of this driver's landed during the look: look again
            with trio.move_on_at(min(deadline, now + self._poll_interval)):
                await self._await_wake_up(self._pause_lot, version)

    async def pauses_heard(self, worker_id: str, epoch: int) -> None:
        def work(conn: sqlite3.Connection, now: float) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO pauses_heard (worker_id, epoch, heard_at) VALUES (?, ?, ?)",
                (worker_id, epoch, now),
            )
            conn.execute(
                "DELETE FROM pauses_heard WHERE heard_at < ?", (now - FORGET_WORKERS_AFTER,)
            )

        await self._transact(work)

    async def pause_holders(self, queue: str) -> Sequence[PauseHolder]:
        def work(conn: sqlite3.Connection, now: float) -> list[PauseHolder]:
            rows = conn.execute(
                "SELECT j.worker_id, count(*), max(coalesce(j.lease_until, 0)), h.epoch"
                " FROM jobs AS j LEFT JOIN pauses_heard AS h ON h.worker_id = j.worker_id"
                " WHERE j.queue = ? AND j.state = 'running' AND j.worker_id IS NOT NULL"
                " GROUP BY j.worker_id ORDER BY j.worker_id",
                (queue,),
            )
            return [PauseHolder(*row) for row in rows]

        return await self._transact(work, mode="read")

    async def worker_seen(self, presence: WorkerPresence) -> None:
        row = {
            **attrs.asdict(presence, recurse=False),
            "queues": json.dumps(presence.queues),
            "jobs": encode_jobs(presence.jobs),
        }

        def work(conn: sqlite3.Connection, now: float) -> None:
            conn.execute(
                f"INSERT OR REPLACE INTO workers ({_WORKER_COLUMNS})"
                f" VALUES ({', '.join('?' for _ in _WORKER_FIELDS)})",
                tuple(row[field] for field in _WORKER_FIELDS),
            )
            conn.execute("DELETE FROM workers WHERE seen_at < ?", (now - FORGET_WORKERS_AFTER,))

        await self._transact(work)

    async def worker_gone(self, worker_id: str) -> None:
        def work(conn: sqlite3.Connection, now: float) -> None:
            conn.execute("DELETE FROM workers WHERE worker_id = ?", (worker_id,))

        await self._transact(work)

    async def workers(self) -> Sequence[WorkerPresence]:
        def work(conn: sqlite3.Connection, now: float) -> list[WorkerPresence]:
            rows = conn.execute(f"SELECT {_WORKER_COLUMNS} FROM workers ORDER BY worker_id")
            return [_presence(row) for row in rows]

        return await self._transact(work, mode="read")
