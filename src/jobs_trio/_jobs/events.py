# Sending an event from application code: the boundary check, then the driver's write, which
# wakes every job suspended on it. Apart because events enter from outside any job.
from __future__ import annotations

from typing import Any

from .._core.boundary import check_key, check_name, dump_json
from ..drivers._transaction import joined
from ..drivers.contract import Driver


def event_text(name: str, payload: Any, key: str | None) -> str:
    """The event's payload as stored, with its name and key checked: what every way of sending
    an event (this one, jobs_trio.sync, jobs_trio.aio) checks before any write."""
    check_name(name, argument="event name")
    if key is not None:
        check_key(key, argument="event key")
    return dump_json(
        payload,
        job=f"event {name}",
        what="payload",
        too_large_fix="send a small event (an id or a storage key), not the data itself",
    )


async def send_event(
    driver: Driver,
    name: str,
    payload: Any = None,
    *,
    key: str | None = None,
    connection: object | None = None,
) -> str:
    """Store event ``name`` (matched by jobs waiting on it, and on ``key`` when they asked) and
    wake the jobs suspended on it; answer its id. Inside ``jobs_trio.transaction(...)``, or with
    ``connection`` (the application's own, on SQLite or PostgreSQL), the event is written in
    that transaction: rolled back, nobody sees it."""
    text = event_text(name, payload, key)
    # Inside `jobs_trio.transaction(...)` the event joins the block as an enqueue does: sent on
    # the driver's own connection instead, it waited for the lock the block's task held.
    return await driver.send_event(name, text, key=key, connection=joined(connection))
