# The boundary away from the drivers: declarations, error text, results, backoff at any attempt,
# and metric labels that an unknown job name cannot multiply.
from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from jobs_trio import Backoff, JobsError, Registry
from jobs_trio._core.boundary import (
    INT4_MAX,
    MAX_ERROR_CHARS,
    MAX_SECONDS,
    load_json,
    storable_text,
)
from jobs_trio._core.errors import InvalidArgument
from jobs_trio._core.records import Claim, JobState, NewJob, Retry, new_job_id
from jobs_trio._run.attempt import _result_json, describe, run_attempt
from jobs_trio._run.run_scope import RunScope
from jobs_trio._run.thread_slots import ThreadSlots
from jobs_trio.drivers.memory import MemoryDriver
from jobs_trio.errors import ResultNotStorable
from jobs_trio.testing import run_until_idle
from tests.helpers.worker_helpers import record, trio_driver, worker


def nested(depth: int) -> Any:
    value: Any = None
    for _ in range(depth):
        value = [value]
    return value


# -- declarations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"name": "bad\x00name"}, "job name"),
        ({"name": "evil\x1b[31mRED\x1b]0;pwned\x07"}, "job name"),
        ({"name": "/data/\udcff.csv"}, "job name"),
        ({"name": "n" * 201}, "job name"),
        ({"name": ""}, "job name"),
        ({"queue": "q\n"}, "queue"),
        ({"attempts": 0}, "attempts"),
        ({"attempts": INT4_MAX + 1}, "attempts"),
        ({"priority": 2**40}, "priority"),
        ({"max_payload_bytes": 0}, "max_payload_bytes"),
        ({"max_result_bytes": 2**30}, "max_result_bytes"),
        ({"max_result_bytes": True}, "max_result_bytes"),
    ],
)
def test_a_declaration_no_driver_could_store_is_refused(
    options: dict[str, Any], argument: str
) -> None:
    name = options.pop("name", "t")
    with pytest.raises(InvalidArgument) as caught:
        Registry().job(name, **options)
    assert caught.value.argument == argument and caught.value.fix
    assert caught.value.code == "X_ARGUMENT"


def test_registry_limits_are_checked_and_inherited() -> None:
    with pytest.raises(InvalidArgument, match="max_payload_bytes"):
        Registry(max_payload_bytes=-1)
    registry = Registry(max_payload_bytes=10, max_result_bytes=20)
    inherits = registry.job("a")(lambda ctx, p: None)
    own = registry.job("b", max_result_bytes=30)(lambda ctx, p: None)
    assert (inherits.max_payload_bytes, inherits.max_result_bytes) == (10, 20)
    assert (own.max_payload_bytes, own.max_result_bytes) == (10, 30)


# -- error text ------------------------------------------------------------------------------


def test_storable_text_escapes_nul_and_lone_surrogates_and_marks_a_cut() -> None:
    assert storable_text("plain\ttext\n") == "plain\ttext\n"  # other controls: stored as they are
    assert storable_text("a\x00b") == "a\\x00b"
    assert storable_text("/data/\udcff.csv") == "/data/\\udcff.csv"
    assert storable_text("x" * MAX_ERROR_CHARS) == "x" * MAX_ERROR_CHARS
    cut = storable_text("x" * (MAX_ERROR_CHARS + 1))
    assert len(cut) == MAX_ERROR_CHARS and cut.endswith(
        f"… [truncated: {MAX_ERROR_CHARS + 1} characters]"
    )
    # Escapes lengthen text: the cut still holds.
    escaped = storable_text("\x00" * MAX_ERROR_CHARS)
    assert len(escaped) == MAX_ERROR_CHARS and escaped.startswith("\\x00\\x00")
    assert "truncated" in escaped
    assert storable_text("x" * 50, max_chars=40).endswith("… [truncated: 50 characters]")


class StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class CodeRaises(Exception):
    @property
    def code(self) -> str:
        raise KeyError("code")


def test_describe_never_raises_and_gives_storable_text() -> None:
    assert describe(StrRaises()) == "StrRaises: <str() of this error raised RuntimeError>"
    assert describe(CodeRaises("boom")) == "CodeRaises: boom"
    assert describe(ValueError("bad \x00 byte")) == "ValueError: bad \\x00 byte"
    assert len(describe(ValueError("x" * 1_000_000))) == MAX_ERROR_CHARS


# -- results -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "cause"),
    [
        (nested(100_000), "nested deeper than 100 levels"),
        ({"n": 10**5000}, "result.n: an int of more than 640 digits"),
        ({"s": {1, 2}}, "result.s: a set is not JSON-serialisable"),
        ("x" * 2000, "result of 2,002 bytes exceeds the limit of 1,000 bytes"),
    ],
)
def test_a_result_no_driver_can_store_is_a_clear_error_not_a_crash(
    result: object, cause: str
) -> None:
    definition = Registry().job("t", max_result_bytes=1000)(lambda ctx, p: None)
    with pytest.raises(ResultNotStorable) as caught:
        _result_json(result, definition)
    assert cause in caught.value.cause and "'t'" in caught.value.cause
    assert caught.value.code == "X_RESULT" and caught.value.fix


def test_results_within_the_limit_are_the_same_json_as_before() -> None:
    definition = Registry().job("t")(lambda ctx, p: None)
    assert _result_json(None, definition) == "null"
    assert _result_json({"a": [1, 2.5, "\x00"]}, definition) == '{"a":[1,2.5,"\\u0000"]}'


class _BrokenList(list[int]):
    """A list whose iteration raises, as a lazy ORM collection whose cursor closed does."""

    def __iter__(self) -> Any:
        raise RuntimeError("cursor closed")


class _BrokenDict(dict[str, int]):
    def items(self) -> Any:
        raise RuntimeError("session expired")


class _LyingInt(int):
    """An int that says it is small: a range check passes, the encoder refuses its digits."""

    def __lt__(self, other: object) -> bool:
        return True

    def __gt__(self, other: object) -> bool:
        return True


_SUBCLASSES = [
    pytest.param(_BrokenList([1]), "RuntimeError: cursor closed", id="list-iter-raises"),
    pytest.param(_BrokenDict(a=1), "RuntimeError: session expired", id="dict-items-raises"),
    pytest.param({"n": _LyingInt(10**5000)}, "ValueError", id="int-compares-wrong"),
]


@pytest.mark.parametrize(("value", "raised"), _SUBCLASSES)
async def test_a_subclass_whose_own_code_raises_is_refused_at_enqueue(
    value: object, raised: str
) -> None:
    registry = Registry()
    job = registry.job("t")(lambda ctx, p: None)
    driver = trio_driver()
    with pytest.raises(JobsError) as caught:
        await job.enqueue(driver, value)
    assert caught.value.code == "X_PAYLOAD" and raised in caught.value.cause, caught.value
    assert await driver.list_jobs() == []


@pytest.mark.parametrize(
    ("value", "raised"),
    [pytest.param(nested(100_000), "nested deeper than 100 levels", id="too-deep"), *_SUBCLASSES],
)
async def test_a_body_returning_an_unstorable_result_fails_alone(
    value: object, raised: str, autojump_clock: object
) -> None:
    """A subclass whose own code raises as it is encoded took the worker down (open_worker
    raised RuntimeError), left the job running, and the next worker to claim it went down the
    same way."""
    registry = Registry()

    @registry.job("bad", attempts=3)
    async def bad(ctx: object, payload: None) -> Any:
        return value

    @registry.job("fine")
    async def fine(ctx: object, payload: None) -> int:
        return 7

    driver = trio_driver()
    bad_id, good = await bad.enqueue(driver), await fine.enqueue(driver)
    w = worker(driver, registry)
    outcomes = {o.name: o.kind for o in await w.tick()}
    assert outcomes == {"bad": "dead-lettered", "fine": "completed"}  # not retried: same again
    dead = await record(driver, bad_id)
    assert dead.state is JobState.DEAD and dead.last_error is not None
    assert "X_RESULT" in dead.last_error and raised in dead.last_error
    assert (await record(driver, good)).result == 7


# -- backoff -------------------------------------------------------------------------------------


@pytest.mark.parametrize("attempt", [1025, 100_000, INT4_MAX, pytest.param(10**400, id="10**400")])
def test_backoff_at_any_attempt_is_the_cap(attempt: int) -> None:
    assert Backoff().delay(attempt, rand=lambda: 0.5) == 300.0
    if attempt >= 100_000:  # a slow factor reaches its cap too, later
        slow = Backoff(base=0.01, factor=1.0001, cap=60)
        assert slow.delay(attempt, rand=lambda: 0.5) == 60.0


def test_backoff_below_the_cap_is_unchanged() -> None:
    backoff = Backoff(base=1, factor=2, cap=300, jitter=0)
    assert [backoff.delay(n) for n in range(1, 11)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    assert Backoff(base=5, factor=1, jitter=0).delay(10**6) == 5
    assert Backoff(base=0, jitter=0).delay(10**6) == 0
    assert Backoff(base=10, cap=3, jitter=0).delay(1) == 3


async def test_a_retry_forever_job_at_attempt_100_000_is_retried_after_the_cap() -> None:
    registry = Registry()

    @registry.job("forever", attempts=INT4_MAX, backoff=Backoff(cap=600, jitter=0))
    async def forever(ctx: object, payload: None) -> None:
        raise ValueError("again")

    claim = Claim(new_job_id(), "tok", "forever", "default", "null", 100_000, INT4_MAX, 0.0)
    threads = ThreadSlots({"default": 1}, lambda: None)
    outcome = await run_attempt(
        claim,
        forever,
        RunScope(claim, None),
        registry=registry,
        driver=MemoryDriver(),
        worker_id="w",
        threads=threads,
    )
    assert outcome.kind == "retried"
    assert isinstance(outcome.settlement, Retry) and outcome.settlement.delay == 600


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"base": math.nan}, "Backoff base"),
        ({"base": -1}, "Backoff base"),
        ({"cap": math.inf}, "Backoff cap"),
        ({"cap": MAX_SECONDS * 2}, "Backoff cap"),
        ({"factor": math.inf}, "Backoff factor"),
        ({"factor": 0.5}, "Backoff factor"),
        ({"jitter": math.nan}, "Backoff jitter"),
        ({"jitter": 1.5}, "Backoff jitter"),
    ],
)
def test_backoff_settings_no_retry_could_use_are_refused(
    options: dict[str, float], argument: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        Backoff(**options)
    assert caught.value.argument == argument and caught.value.fix


# -- metrics -----------------------------------------------------------------------------------


async def test_unknown_job_names_share_one_metric_label(autojump_clock: object) -> None:
    registry = Registry()

    @registry.job("known")
    async def known(ctx: object, payload: None) -> None: ...

    driver = trio_driver()
    # Written by another deploy (or anyone with database access): names this one never declared.
    await driver.enqueue(
        [NewJob(new_job_id(), f"ghost-{i}", "default", "null", 3) for i in range(3000)]
    )
    await known.enqueue(driver)
    w = worker(driver, registry, concurrency=500)
    kinds = [o.kind for o in await run_until_idle(w, wait=False)]
    assert kinds.count("parked") == 3000 and kinds.count("completed") == 1
    scraped = generate_latest(w._metrics.registry).decode()
    runs = {
        (sample.labels["queue"], sample.labels["job"])
        for family in text_string_to_metric_families(scraped)
        for sample in family.samples
        if sample.name == "jobs_trio_run_seconds_count"
    }
    assert runs == {("default", "unknown"), ("default", "known")}
    assert len(await driver.list_jobs(state=JobState.PARKED, limit=5000)) == 3000


def test_jobs_error_is_the_base_of_every_boundary_error() -> None:
    assert issubclass(InvalidArgument, JobsError) and issubclass(ResultNotStorable, JobsError)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


def loaded(load: Any, text: str) -> tuple[str, Any]:
    """What ``load`` makes of ``text``: its value (repr: NaN equals itself there), or its error."""
    try:
        return ("value", repr(load(text)))
    except Exception as exc:
        return ("error", (type(exc), str(exc)))


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        JSON_VALUES.map(lambda v: json.dumps(v, separators=(",", ":"))),
        JSON_VALUES.map(json.dumps),  # spaces inside
        st.tuples(JSON_VALUES, st.sampled_from(["", " ", "\n", " x", "}", "[]"])).map(
            lambda pair: pair[1] + json.dumps(pair[0]) + pair[1]
        ),
        st.text(),  # mostly not JSON: the same error
    )
)
@example('"\\u0000 \\ud800 \\u001b[31m"')  # escaped NUL, lone surrogate, terminal escape
@example('"\ud800"')  # a lone surrogate itself in the text
@example('"\x00"')  # a raw NUL: json refuses a control character in a string
@example("\x1b[31m{}")
@example("[" * 5000)  # deeper than the scanner recurses
def test_a_stored_json_text_loads_as_json_loads_makes_it(text: str) -> None:
    # load_json reads a payload per attempt by json's C scanner alone; whatever the text, its
    # answer is json.loads' own: the same value, or the same error with the same message.
    assert loaded(load_json, text) == loaded(json.loads, text)
