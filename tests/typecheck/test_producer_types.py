# The producers' typed surface (issue 47), checked by mypy --strict (`nox -s lint`;
# warn_unused_ignores is on here): a producer's enqueue takes the payload type its job's body
# takes, as JobDefinition.enqueue does, and each `type: ignore[...]` marks a call mypy must
# refuse. Run by pytest too, on SQLite, so every accepted call is also a working one.
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, assert_type

import trio

import jobs_trio
import jobs_trio.aio
import jobs_trio.sync
from jobs_trio import JobContext, Registry
from jobs_trio._core.records import JobId

registry = Registry()


@registry.job("typed.ship")
async def ship(ctx: JobContext, payload: dict[str, int]) -> None:
    pass


@registry.job("typed.ping")
def ping(ctx: JobContext, payload: dict[str, int] | None) -> None:
    pass


def _refused_calls_never_run(
    producer: jobs_trio.sync.Producer, aio: jobs_trio.aio.Producer
) -> None:
    """Calls mypy must refuse: each ignore is used only while the payload type is kept."""
    producer.enqueue(ship, "not a dict")  # type: ignore[misc]
    producer.enqueue(ship, {"order": "seven"})  # type: ignore[misc]
    producer.enqueue(ship)  # type: ignore[arg-type]  # the body would be handed None
    producer.enqueue_many(ship, [{"order": 1}, "two"])  # type: ignore[misc]
    producer.enqueue(ship, {"order": 1}, delay="soon")  # type: ignore[call-overload]
    aio.enqueue(ship, ["not", "a", "dict"])  # type: ignore[misc, unused-coroutine]


def test_the_producers_answer_job_ids(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"

    async def migrate() -> None:
        async with jobs_trio.open_driver(url):
            pass

    trio.run(migrate)  # the workers' side makes the store; the producers write to it
    with jobs_trio.sync.Producer(url) as producer:
        assert_type(producer.enqueue(ship, {"order": 1}), JobId)
        assert_type(producer.enqueue(ping), JobId)  # its body takes None: no payload is fine
        assert_type(producer.enqueue_many(ship, [{"order": 2}]), list[JobId])
        assert_type(producer.send_event("typed.shipped", {"order": 1}), str)

    async def from_asyncio() -> list[JobId]:
        async with jobs_trio.aio.Producer(url) as aio:
            one = await aio.enqueue(ship, {"order": 3})
            assert_type(one, JobId)
            return [one, *await aio.enqueue_many(ship, [{"order": 4}])]

    ids: list[Any] = asyncio.run(from_asyncio())
    assert len(ids) == 2
