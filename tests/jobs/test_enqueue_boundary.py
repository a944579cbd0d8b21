# The enqueue boundary: declarations and payloads checked before anything is written.
from __future__ import annotations

import datetime as dt
import json
import math

import pytest

from jobs_trio import ConfigError, FleetLimit, PayloadNotSerialisable, RateLimit, Registry
from jobs_trio._core.errors import InvalidArgument
from jobs_trio._core.records import JobState
from jobs_trio.errors import DuplicateJobName, TooLarge
from tests.helpers.worker_helpers import trio_driver


def test_a_second_job_with_a_taken_name_is_refused() -> None:
    registry = Registry()

    @registry.job("emails.send")
    async def first(ctx: object, payload: None) -> None: ...

    with pytest.raises(DuplicateJobName) as caught:

        @registry.job("emails.send")
        async def second(ctx: object, payload: None) -> None: ...

    assert "first" in caught.value.cause and caught.value.fix


@pytest.mark.parametrize(
    "options",
    [
        {"attempts": 0},
        {"timeout": -1},
        {"queue": ""},
        {"priority": 1.5},
        {"event_poll": 0},
        # One text, read letter by letter: an error coded "X" was terminal.
        {"terminal": "X_PAYLOAD"},
        {"terminal": ["Val\x00ue"]},  # a code that can never match
        {"terminal": [" X_PAYLOAD"]},
        {"terminal": [42]},
    ],
)
def test_bad_job_options_are_refused_with_a_fix(options: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as caught:
        Registry().job("x", **options)  # type: ignore[arg-type]
    assert caught.value.fix


async def test_an_unserialisable_payload_names_job_and_field_and_writes_nothing() -> None:
    registry = Registry()

    @registry.job("emails.send")
    async def send(ctx: object, payload: object) -> None: ...

    driver = trio_driver()
    with pytest.raises(PayloadNotSerialisable) as caught:
        await send.enqueue(driver, {"to": "a@b.c", "attachment": {"data": b"\x00"}})
    err = caught.value
    assert err.job == "emails.send" and err.field == "payload.attachment.data"
    assert "bytes" in err.cause and err.code == "X_PAYLOAD"
    with pytest.raises(PayloadNotSerialisable) as nan:
        await send.enqueue(driver, {"scores": [1.0, math.nan]})
    assert nan.value.field == "payload.scores[1]"
    assert await driver.list_jobs() == []


async def test_a_surrogate_pair_as_two_code_points_is_refused_and_lone_ones_kept() -> None:
    """'\\ud800\\udfff' as two code points was stored as the two escapes every JSON reader
    joins into one character: the body got a payload other than the one enqueued."""
    registry = Registry()

    @registry.job("texts.keep")
    async def keep(ctx: object, payload: object) -> None: ...

    driver = trio_driver()
    with pytest.raises(PayloadNotSerialisable) as caught:
        await keep.enqueue(driver, {"rows": [{"name": "ok", "note": "a\ud800\udfffb"}]})
    assert caught.value.field == "payload.rows[0].note" and "surrogate" in str(caught.value)
    with pytest.raises(PayloadNotSerialisable) as key:
        await keep.enqueue(driver, {"\udbff\udc00": 1})
    assert key.value.field == "payload (a key)"
    assert await driver.list_jobs() == []
    # A lone surrogate, the character the pair stands for, and text near it come back as given.
    for text in ("\ud800", "x\udfff", "\U000103ff", "\ud800 \udfff", "한국어 텍스트"):
        job_id = await keep.enqueue(driver, {"t": text})
        job = await driver.get(job_id)
        assert job is not None and json.loads(job.payload) == {"t": text}


async def test_enqueue_many_with_one_bad_payload_writes_none() -> None:
    registry = Registry()

    @registry.job("t")
    async def t(ctx: object, payload: object) -> None: ...

    driver = trio_driver()
    with pytest.raises(PayloadNotSerialisable) as caught:
        await t.enqueue_many(driver, [{"ok": 1}, {"bad": {1, 2}}, {"ok": 2}])
    # Which one: "payload.bad" alone left a caller with 10,000 payloads to search.
    assert caught.value.field == "payloads[1].bad", caught.value
    assert await driver.list_jobs() == []
    big = [{"n": i} for i in range(10)]
    big[7] = {"n": "x" * 2_000_000}
    with pytest.raises(TooLarge, match=r"payloads\[7\] of 2,000,00\d bytes exceeds"):
        await t.enqueue_many(driver, big)
    assert await driver.list_jobs() == []
    ids = await t.enqueue_many(driver, [{"n": i} for i in range(3)])
    assert len(ids) == 3 and len(await driver.list_jobs(state=JobState.READY)) == 3


async def test_delay_run_at_and_priority_reach_the_driver() -> None:
    registry = Registry()

    @registry.job("t", priority=3)
    async def t(ctx: object, payload: object) -> None: ...

    driver = trio_driver()
    now = driver.now()
    a = await driver.get(await t.enqueue(driver, delay=30))
    assert a is not None and a.run_at == pytest.approx(now + 30) and a.priority == 3
    when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=90)
    b = await driver.get(await t.enqueue(driver, run_at=when, priority=-2))
    assert b is not None and b.run_at == pytest.approx(driver.now() + 90, abs=1)
    assert b.priority == -2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"delay": -1},
        {"delay": math.inf},
        {"delay": 1, "run_at": 5.0},
        {"run_at": dt.datetime(2030, 1, 1)},  # naive: which zone?
        {"key": ""},
    ],
)
async def test_bad_enqueue_options_are_refused_and_write_nothing(kwargs: dict[str, object]) -> None:
    registry = Registry()

    @registry.job("t")
    async def t(ctx: object, payload: object) -> None: ...

    driver = trio_driver()
    with pytest.raises(ConfigError) as caught:
        await t.enqueue(driver, {}, **kwargs)  # type: ignore[arg-type]
    assert caught.value.fix
    assert await driver.list_jobs() == []


async def test_a_batch_checks_its_shared_options_once_and_each_job_gets_its_own_id() -> None:
    # enqueue_many checks delay, run_at and priority once for the batch and reads the clock and
    # the OS's randomness once for its ids (issue 35): every job still carries all three, and
    # its own id of new_job_id's shape (11 hex digits of milliseconds, then 16 random ones).
    registry = Registry()

    @registry.job("t")
    async def t(ctx: object, payload: object) -> None: ...

    driver = trio_driver()
    with pytest.raises(ConfigError):
        await t.enqueue_many(driver, ({"n": i} for i in range(3)), priority=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        await t.enqueue_many(driver, [], priority=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        await t.enqueue_many(driver, [{}], delay=1, run_at=5.0)
    assert await driver.list_jobs() == []
    now = driver.now()
    ids = await t.enqueue_many(driver, ({"n": i} for i in range(2000)), delay=30, priority=-4)
    # The batch's one clock read lies between these two (a loaded machine takes a while).
    after = driver.now()
    assert len(set(ids)) == 2000
    assert all(len(i) == 27 and int(i, 16) >= 0 and i == i.lower() for i in ids)
    single = await t.enqueue(driver, {})
    assert abs(int(ids[0][:11], 16) - int(single[:11], 16)) < 60_000
    for job_id in ids[::1999]:
        got = await driver.get(job_id)
        assert got is not None and got.priority == -4 and now + 30 <= got.run_at <= after + 30


@pytest.mark.parametrize(
    "part",
    [None, b"acct", 1.5, ("a",)],
    ids=["None", "bytes", "float", "tuple"],
)
async def test_a_limit_key_function_must_answer_a_str_or_an_int(part: object) -> None:
    """None (a payload.get() that found nothing) put every such job under one shared key,
    and bytes were keyed by their repr: each is refused at enqueue, naming the payload."""
    registry = Registry()

    @registry.job("t", fleet_limit=FleetLimit(1, key=lambda p: p["k"] if p["k"] != "x" else part))
    async def t(ctx: object, payload: object) -> None: ...

    driver = trio_driver()
    assert len(await t.enqueue_many(driver, [{"k": "a"}, {"k": 42}])) == 2  # str and int keys
    with pytest.raises(InvalidArgument, match=r"returned .*\(for payloads\[1\]\)") as caught:
        await t.enqueue_many(driver, [{"k": "b"}, {"k": "x"}])
    assert caught.value.code == "X_ARGUMENT" and caught.value.fix
    assert len(await driver.list_jobs()) == 2


def test_a_rate_limit_per_past_a_float_is_refused_with_a_code() -> None:
    with pytest.raises(InvalidArgument, match="is not from >0 to 86,400 seconds"):
        RateLimit(5, per=10**400)


Limits = tuple[FleetLimit | None, RateLimit | None]


@pytest.mark.parametrize(
    ("first_name", "first", "second", "counts"),
    [
        (
            "exports",
            (FleetLimit(1, scope="provider-x"), None),
            (FleetLimit(3, key=lambda p: p, scope="provider-x"), None),
            ("FleetLimit(1)", "FleetLimit(3)"),
        ),
        (
            "exports",
            (None, RateLimit(10, per=1, scope="provider-x")),
            (None, RateLimit(10, per=60, scope="provider-x")),
            ("RateLimit(10, per=1.0)", "RateLimit(10, per=60.0)"),
        ),
        (
            "exports",
            (FleetLimit(2, scope="provider-x"), RateLimit(10, scope="provider-x")),
            (FleetLimit(2, scope="provider-x"), RateLimit(20, scope="provider-x")),
            ("RateLimit(10, per=1.0)", "RateLimit(20, per=1.0)"),
        ),
        (  # a job's own name is its limits' scope: another job that names it shares them
            "provider-x",
            (FleetLimit(1), None),
            (FleetLimit(3, scope="provider-x"), None),
            ("FleetLimit(1)", "FleetLimit(3)"),
        ),
    ],
    ids=["fleet", "rate-per", "rate-starts", "a-jobs-own-name"],
)
def test_jobs_sharing_a_limit_scope_with_different_counts_are_refused(
    first_name: str, first: Limits, second: Limits, counts: tuple[str, str]
) -> None:
    """Accepted, a scope's limit rows took whichever count each claim read: 3 bodies of the
    scope ran at once beside a job that declared 1."""
    registry = Registry()

    @registry.job(first_name, fleet_limit=first[0], rate_limit=first[1])
    async def exports(ctx: object, payload: object) -> None: ...

    with pytest.raises(ConfigError) as caught:

        @registry.job("imports", fleet_limit=second[0], rate_limit=second[1])
        async def imports(ctx: object, payload: object) -> None: ...

    cause = caught.value.cause
    assert "job 'imports'" in cause and f"job {first_name!r}" in cause, cause
    assert "scope 'provider-x'" in cause and all(count in cause for count in counts), cause
    assert "declare the same count on every job of the scope" in caught.value.fix
    assert "imports" not in registry  # refused whole: no worker runs it under either count


def test_jobs_sharing_a_limit_scope_with_the_same_counts_are_accepted() -> None:
    registry = Registry()

    @registry.job(
        "exports",
        fleet_limit=FleetLimit(5, scope="provider-x"),
        rate_limit=RateLimit(10, per=60, scope="provider-x"),
    )
    async def exports(ctx: object, payload: object) -> None: ...

    @registry.job(  # the same numbers written otherwise (per=60.0), and a key of its own
        "imports",
        fleet_limit=FleetLimit(5, key=lambda p: p, scope="provider-x"),
        rate_limit=RateLimit(10, per=60.0, scope="provider-x"),
    )
    async def imports(ctx: object, payload: object) -> None: ...

    @registry.job("other", fleet_limit=FleetLimit(1, scope="provider-y"), rate_limit=RateLimit(1))
    async def other(ctx: object, payload: object) -> None: ...

    assert len(registry) == 3
