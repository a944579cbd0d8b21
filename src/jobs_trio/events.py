# Sending an event from application code: the boundary check, then the driver's write, which
# wakes every job suspended on it. Apart because events enter from outside any job.
from __future__ import annotations

from typing import Any

from .driver import Driver
from .errors import ConfigError
from .payload import dump_json


async def send_event(
    driver: Driver,
    name: str,
    payload: Any = None,
    *,
    key: str | None = None,
    connection: object | None = None,
) -> str:
    """Store event ``name`` (matched by jobs waiting on it, and on ``key`` when they asked) and
    wake the jobs suspended on it; answer its id. With ``connection`` (PostgreSQL), the event
    is written in the caller's transaction: rolled back, nobody sees it."""
    if not isinstance(name, str) or not name:
        raise ConfigError(
            f"event name {name!r} is not a non-empty str", fix="name it, e.g. 'shipped'"
        )
    if key is not None and (not isinstance(key, str) or not key):
        raise ConfigError(f"event key {key!r} is not a non-empty str", fix="pass a str key or none")
    text = dump_json(payload, job=f"event {name}", what="payload")
    return await driver.send_event(name, text, key=key, connection=connection)
