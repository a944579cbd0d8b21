# The input boundary on every driver: what one driver stores, all store, byte for byte; what
# one cannot store is refused before any of them is called, with the same error, nothing written.
from __future__ import annotations

import datetime as dt
import functools
import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from jobs_trio import JobDefinition, JobsError, Registry, send_event
from jobs_trio._core.boundary import INT4_MAX, INT4_MIN, MAX_ERROR_CHARS, MAX_SECONDS
from jobs_trio._core.errors import InvalidArgument, PayloadNotSerialisable, TooLarge
from jobs_trio._core.records import DeadLetter
from jobs_trio._run.attempt import describe
from jobs_trio._run.run_scope import RunScope
from jobs_trio._run.steps import Steps
from jobs_trio.driver import Driver
from jobs_trio.testing._clock import ManualClock

from .helpers import claim_one


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


async def nothing_written(driver: Driver) -> None:
    assert await driver.list_jobs() == []
    assert (await driver.look_for_event("shipped", key=None, since=None)).found is None


async def refused(
    driver: Driver, call: Callable[[], Awaitable[object]], error: type[JobsError], where: str
) -> JobsError:
    """``call`` raises ``error`` naming ``where`` (the argument, or the payload's field), and
    nothing reached the driver."""
    with pytest.raises(error) as caught:
        await call()
    named = getattr(caught.value, "argument", None) or getattr(caught.value, "field", None)
    assert named == where or where in str(caught.value), (where, caught.value)
    assert caught.value.fix
    await nothing_written(driver)
    return caught.value


def a_job_t() -> JobDefinition[object, None]:
    """A job named "t" of a registry of its own, for the checks that need a declared job."""
    registry = Registry()

    @registry.job("t")
    async def t(ctx: object, payload: object) -> None: ...

    return t


async def test_text_and_ints_at_their_limits_are_stored_the_same_on_every_driver(
    driver: Driver,
) -> None:
    registry = Registry()
    name = "é名 job." + "n" * 192  # 200 characters, not all ASCII
    queue = "q" * 200

    @registry.job(name, queue=queue, attempts=INT4_MAX)
    async def job(ctx: object, payload: object) -> None: ...

    key = "k\t\u2028\U0001f600" + "k" * 508  # controls are fine in a key; NUL is not
    payload = {"nul": "a\x00b", "lone": "\udcff", "int": -(10**639), "deep": nested(99)}
    low = await job.enqueue(driver, payload, priority=INT4_MIN, key=key)
    high = await job.enqueue(driver, None, priority=INT4_MAX)
    stored = await driver.get(low)
    assert stored is not None
    assert (stored.name, stored.queue, stored.key) == (name, queue, key)
    assert (stored.priority, stored.max_attempts) == (INT4_MIN, INT4_MAX)
    # NUL and the lone surrogate travel as JSON escapes: plain ASCII every driver keeps as is.
    assert stored.payload.startswith('{"nul":"a\\u0000b","lone":"\\udcff","int":-1000')
    assert stored.payload.endswith('"deep":' + "[" * 99 + '"leaf"' + "]" * 99 + "}")
    other = await driver.get(high)
    assert other is not None and other.priority == INT4_MAX and other.payload == "null"


async def test_values_some_driver_cannot_store_are_refused_before_any_write(
    driver: Driver,
) -> None:
    registry = Registry()

    @registry.job("t", max_payload_bytes=1000)
    async def t(ctx: object, payload: object) -> None: ...

    # Each of these was stored by memory or SQLite and refused by PostgreSQL (or crashed the
    # encoder): now the same error on every driver, from the boundary.
    for call, error, where in [
        (lambda: t.enqueue(driver, priority=2**40), InvalidArgument, "priority"),
        (lambda: t.enqueue(driver, priority=INT4_MAX + 1), InvalidArgument, "priority"),
        (lambda: t.enqueue(driver, priority=INT4_MIN - 1), InvalidArgument, "priority"),
        (lambda: t.enqueue(driver, priority=10**400), InvalidArgument, "priority"),
        (lambda: t.enqueue(driver, key="a\x00b"), InvalidArgument, "key"),
        (lambda: t.enqueue(driver, key="bad-\udcff.csv"), InvalidArgument, "key"),
        (lambda: t.enqueue(driver, key="k" * 513), InvalidArgument, "key"),
        (lambda: t.enqueue(driver, {"a": nested(100)}), PayloadNotSerialisable, "payload.a"),
        (lambda: t.enqueue(driver, nested(100_000)), PayloadNotSerialisable, "payload"),
        (lambda: t.enqueue(driver, {"n": 10**640}), PayloadNotSerialisable, "payload.n"),
        (lambda: t.enqueue(driver, [1.0, math.inf]), PayloadNotSerialisable, "payload[1]"),
        (lambda: t.enqueue_many(driver, [1, "x" * 999]), TooLarge, "1,001 bytes"),
        (lambda: send_event(driver, "shipped", key="a\x00"), InvalidArgument, "event key"),
        (lambda: send_event(driver, "ship\x00ped"), InvalidArgument, "event name"),
    ]:
        await refused(driver, call, error, where)


async def test_a_payload_over_the_limit_names_the_job_and_the_size(driver: Driver) -> None:
    registry = Registry(max_payload_bytes=100)

    @registry.job("emails.send")
    async def send(ctx: object, payload: object) -> None: ...

    @registry.job("bulk", max_payload_bytes=10_000)
    async def bulk(ctx: object, payload: object) -> None: ...

    error = await refused(driver, lambda: send.enqueue(driver, "x" * 99), TooLarge, "payload")
    assert isinstance(error, TooLarge)
    assert (error.job, error.size, error.limit) == ("emails.send", 101, 100)
    assert "'emails.send'" in str(error) and "101 bytes" in str(error)
    # Exactly at the limit: stored; a job's own limit overrides the registry's.
    assert await driver.get(await send.enqueue(driver, "x" * 98)) is not None
    assert await driver.get(await bulk.enqueue(driver, "x" * 5000)) is not None


async def test_enqueue_durations_are_checked_and_name_their_argument(driver: Driver) -> None:
    t = a_job_t()
    far = dt.datetime(9999, 12, 31, tzinfo=dt.UTC)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"delay": math.nan}, "delay"),
        ({"delay": math.inf}, "delay"),
        ({"delay": -1}, "delay"),
        ({"delay": 1e308}, "delay"),
        ({"delay": 10**400}, "delay"),
        ({"delay": MAX_SECONDS + 1}, "delay"),
        ({"delay": True}, "delay"),
        ({"run_at": math.nan}, "run_at"),
        ({"run_at": -math.inf}, "run_at"),
        ({"run_at": 1e308}, "run_at"),
        ({"run_at": far}, "run_at"),
        ({"run_at": dt.datetime(2030, 1, 1)}, "run_at"),  # naive: whose 2030?
    ]
    for kw, where in cases:
        await refused(driver, functools.partial(t.enqueue, driver, **kw), InvalidArgument, where)
    now = driver.now()
    later = await driver.get(await t.enqueue(driver, delay=MAX_SECONDS))
    assert later is not None and later.run_at == pytest.approx(now + MAX_SECONDS)
    past = await driver.get(await t.enqueue(driver, run_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC)))
    assert past is not None and past.run_at == pytest.approx(now)  # due now, not refused


async def test_step_durations_are_checked_before_any_step_record(
    driver: Driver, manual_clock: ManualClock
) -> None:
    t = a_job_t()
    job_id = await t.enqueue(driver)
    claim = await claim_one(driver)
    steps = Steps(driver, claim.lease, t, RunScope(claim, None))
    calls: list[tuple[Callable[[], Awaitable[object]], str]] = [
        (lambda: steps.sleep("s1", math.nan), "step.sleep('s1') seconds"),
        (lambda: steps.sleep("s2", math.inf), "step.sleep('s2') seconds"),
        (lambda: steps.sleep("s3", -5), "step.sleep('s3') seconds"),
        (lambda: steps.sleep("s4", 1e308), "step.sleep('s4') seconds"),
        (lambda: steps.sleep_until("u1", math.nan), "step.sleep_until('u1') when"),
        (lambda: steps.sleep_until("u2", 1e308), "step.sleep_until('u2') when"),
        (
            lambda: steps.sleep_until("u3", dt.datetime(2030, 1, 1)),
            "step.sleep_until('u3') when",
        ),
        (lambda: steps.wait_for_event("w1", "e", timeout=math.nan), "wait_for_event('w1') timeout"),
        (lambda: steps.wait_for_event("w2", "e", timeout=-1), "wait_for_event('w2') timeout"),
        (lambda: steps.wait_for_event("w3", "e", timeout=math.inf), "wait_for_event('w3') timeout"),
        (lambda: steps.wait_for_event("w4", "e\x00"), "wait_for_event('w4') event"),
        (lambda: steps.wait_for_event("w5", "e", match="\udcff"), "wait_for_event('w5') match"),
        (lambda: steps.sleep("nul\x00", 1), "step name"),
    ]
    for call, where in calls:
        with pytest.raises(InvalidArgument) as caught:
            await call()
        assert caught.value.argument == where and caught.value.fix
    assert await driver.load_steps(job_id) == []
    # Refused calls used no step name: the same names, given good values, work.
    manual_clock.advance(0)
    await steps.sleep_until("u1", manual_clock.now - 10)  # already past: done at once
    assert [s.name for s in await driver.load_steps(job_id)] == ["u1"]


async def test_error_text_no_driver_could_store_is_stored_sanitised_and_cut(
    driver: Driver,
) -> None:
    t = a_job_t()
    job_id = await t.enqueue(driver)
    claim = await claim_one(driver)
    # NUL: PostgreSQL refuses it ([22021]); a lone surrogate: SQLite's UTF-8 encode raises.
    error = ValueError("bad byte \x00 in /data/\udcff.csv " + "x" * 10_000)
    await driver.settle([DeadLetter(claim.lease, describe(error))])
    stored = await driver.get(job_id)
    assert stored is not None and stored.last_error is not None
    assert stored.last_error.startswith("ValueError: bad byte \\x00 in /data/\\udcff.csv xxx")
    assert stored.last_error.endswith("… [truncated: 10038 characters]")
    assert len(stored.last_error) == MAX_ERROR_CHARS
