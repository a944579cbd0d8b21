# A large enqueue_many (issue 35): written in chunks of bounded statements inside one transaction,
# all or none, with progress in the log; a million jobs stored on SQLite and on PostgreSQL.
from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

import jobs_trio
from jobs_trio import JobState, Registry
from jobs_trio._core import chunks as chunks_module
from jobs_trio._core.records import Enqueued, NewJob
from jobs_trio.driver import Driver
from tests.conftest import require_postgres

STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@contextlib.asynccontextmanager
async def store(kind: str, tmp_path: Path) -> AsyncIterator[Driver]:
    if kind == "sqlite":
        async with jobs_trio.open_driver(f"sqlite:///{tmp_path / 'jobs.db'}") as driver:
            yield driver
        return
    schema = f"jt_{uuid.uuid4().hex[:12]}"
    async with jobs_trio.open_driver(
        require_postgres(), schema=schema, migrate=True, drop_schema_on_close=True
    ) as driver:
        yield driver


def bulk_job(registry: Registry) -> Any:
    @registry.job("bulk.job", queue="bulk")
    async def bulk(ctx: object, payload: Any) -> None: ...

    return bulk


async def ready_count(driver: Driver) -> int:
    for row in await driver.stats():
        if row.queue == "bulk":
            return row.depth.get(JobState.READY.value, 0)
    return 0


class FailsOnCall:
    """``driver``, except that its ``fail_on``-th enqueue call fails after the driver wrote it
    (a lost connection after the chunk's statement): what was written must roll back."""

    def __init__(self, driver: Driver, fail_on: int) -> None:
        self._driver = driver
        self._fail_on = fail_on
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._driver, name)

    async def enqueue(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> Sequence[Enqueued]:
        self.calls += 1
        answers = await self._driver.enqueue(jobs, connection=connection)
        if self.calls == self._fail_on:
            raise jobs_trio.DriverError("the connection was lost (test)", fix="retry")
        return answers


@pytest.mark.parametrize("kind", STORES)
async def test_a_batch_larger_than_a_chunk_is_written_in_chunks_all_or_none(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(chunks_module, "ENQUEUE_CHUNK", 10)
    caplog.set_level(logging.INFO, logger="jobs_trio")
    registry = Registry()
    bulk = bulk_job(registry)
    async with store(kind, tmp_path) as driver:
        failing = FailsOnCall(driver, fail_on=3)
        with pytest.raises(jobs_trio.DriverError):
            await bulk.enqueue_many(failing, [{"i": i} for i in range(35)])
        assert failing.calls == 3  # chunks of 10: the first two were written, then rolled back
        assert await ready_count(driver) == 0

        ids = await bulk.enqueue_many(driver, [{"i": i} for i in range(35)])
        assert len(set(ids)) == 35 and await ready_count(driver) == 35
        progress = [
            r.fields  # type: ignore[attr-defined]
            for r in caplog.records
            if getattr(r, "event", "") == "jobs.enqueue.progress"
        ]
        assert [(p["written"], p["of"]) for p in progress[-4:]] == [
            (10, 35),
            (20, 35),
            (30, 35),
            (35, 35),
        ]

        # Inside the application's transaction the chunks join it: rolled back with it.
        with pytest.raises(RuntimeError, match="the request failed"):
            async with jobs_trio.transaction(driver):
                await bulk.enqueue_many(driver, [{"i": i} for i in range(25)])
                raise RuntimeError("the request failed")
        assert await ready_count(driver) == 35


@pytest.mark.slow
@pytest.mark.parametrize("kind", STORES)
async def test_a_million_jobs_in_one_enqueue_many_are_all_stored(kind: str, tmp_path: Path) -> None:
    registry = Registry()
    bulk = bulk_job(registry)
    async with store(kind, tmp_path) as driver:
        ids = await bulk.enqueue_many(driver, [None] * 1_000_000)
        assert len(ids) == len(set(ids)) == 1_000_000
        assert await ready_count(driver) == 1_000_000


class CountsCalls:
    """``driver``, counting the jobs of each enqueue call."""

    def __init__(self, driver: Driver) -> None:
        self._driver = driver
        self.sizes: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._driver, name)

    async def enqueue(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> Sequence[Enqueued]:
        self.sizes.append(len(jobs))
        return await self._driver.enqueue(jobs, connection=connection)


@pytest.mark.parametrize("kind", STORES)
async def test_a_batch_of_large_payloads_is_cut_by_its_size_too(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20,000 payloads at the 1 MiB limit were one statement of 20 GB, past PostgreSQL's 1 GB
    message limit (a psycopg producer's connection was closed by the server with 1,100 of
    them). A bound of 1,000 characters here stands for the real one's 64 Mi."""
    monkeypatch.setattr(chunks_module, "ENQUEUE_CHUNK_CHARS", 1_000)
    registry = Registry()
    bulk = bulk_job(registry)
    payloads = [{"i": i, "text": "x" * 290} for i in range(10)]  # ~320 characters with context
    async with store(kind, tmp_path) as driver:
        counting = CountsCalls(driver)
        ids = await bulk.enqueue_many(counting, payloads, context={"tenant": "t1"})
        assert counting.sizes == [3, 3, 3, 1]
        stored = [await driver.get(job_id) for job_id in ids]
        assert [json.loads(job.payload)["i"] for job in stored if job] == list(range(10))


def test_a_job_past_the_size_bound_alone_is_a_chunk_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(chunks_module, "ENQUEUE_CHUNK_CHARS", 100)
    monkeypatch.setattr(chunks_module, "ENQUEUE_CHUNK", 4)
    bulk = bulk_job(Registry())
    jobs = bulk.new_jobs(["x" * 200, "a", "b", "c", "d", "e", "x" * 95, "f"])
    sizes = [len(chunk) for chunk in chunks_module.enqueue_chunks(jobs)]
    # The 202-character job alone; four at the row bound; "e" and the 97-character one fill the
    # 100 exactly; every job in one chunk, in order.
    assert sizes == [1, 4, 2, 1]
    assert [job for chunk in chunks_module.enqueue_chunks(jobs) for job in chunk] == jobs


@pytest.mark.postgres
async def test_a_producers_batch_of_large_payloads_is_cut_by_its_size_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The producers' plan cuts as the driver does (the psycopg producer above)."""
    from jobs_trio._produce import writes
    from jobs_trio.sync import Producer

    monkeypatch.setattr(chunks_module, "ENQUEUE_CHUNK_CHARS", 1_000)
    sizes: list[int] = []
    real_plan = writes.enqueue_plan

    def counted(sql: Any, now: float, jobs: Sequence[NewJob]) -> Any:
        sizes.append(len(jobs))
        return real_plan(sql, now, jobs)

    monkeypatch.setattr(writes, "enqueue_plan", counted)
    bulk = bulk_job(Registry())
    schema = f"jt_{uuid.uuid4().hex[:12]}"
    url = require_postgres()
    async with jobs_trio.open_driver(url, schema=schema, migrate=True, drop_schema_on_close=True):
        with Producer(url, schema=schema) as producer:
            ids = await trio.to_thread.run_sync(
                lambda: producer.enqueue_many(bulk, [{"text": "x" * 300}] * 10)
            )
    assert len(set(ids)) == 10 and sizes == [3, 3, 3, 1]


@pytest.mark.postgres
async def test_a_relay_batch_of_large_rows_is_cut_by_its_size_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay wrote its whole batch of outbox rows as one statement into PostgreSQL: 1,100
    rows of 1 MiB were the same 1 GB message, failed and retried at every pass."""
    from jobs_trio.drivers.postgres import _outbox_relay

    monkeypatch.setattr(chunks_module, "ENQUEUE_CHUNK_CHARS", 1_000)
    sizes: list[int] = []
    real = _outbox_relay.enqueue_chunks

    def counted(jobs: Sequence[NewJob]) -> list[Sequence[NewJob]]:
        chunks = real(jobs)
        sizes.extend(len(chunk) for chunk in chunks)
        return chunks

    monkeypatch.setattr(_outbox_relay, "enqueue_chunks", counted)
    bulk = bulk_job(Registry())
    async with (
        jobs_trio.open_driver(f"sqlite:///{tmp_path / 'app.db'}") as app,
        store("postgres", tmp_path) as jobs_store,
    ):
        outbox = jobs_trio.Outbox(app)
        ids = await bulk.enqueue_many(outbox, [{"text": "x" * 300}] * 10)
        assert await jobs_trio.Relay(outbox, jobs_store)._one_pass() == 10
        assert sorted(job.id for job in await jobs_store.list_jobs()) == sorted(ids)
    assert sizes == [3, 3, 3, 1]
