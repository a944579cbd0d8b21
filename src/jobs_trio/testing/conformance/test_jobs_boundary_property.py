# Hostile values thrown at the public enqueue API on the driver and on the memory driver at once:
# the same call fails with the same JobsError on both (nothing written) or stores the same row.
from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from jobs_trio import JobsError, Registry
from jobs_trio.driver import Driver
from jobs_trio.drivers._open_driver import open_driver
from jobs_trio.testing._clock import ManualClock

from .fixtures import DriverFactory

# Every code point, lone surrogates included (Hypothesis leaves them out unless asked), and
# the ones that broke a driver or a terminal before, so they are tried often.
hostile_char = st.characters(exclude_categories=()) | st.sampled_from(
    ["\x00", "\udcff", "\ud800", "\x1b", "\x07", "\n", "\u202e", "é", "\U0001f600"]
)
hostile_text = st.text(hostile_char, max_size=12) | st.builds(
    lambda c, n: c * n, hostile_char, st.sampled_from([199, 200, 201, 512, 513, 5000])
)
# Built by a map: Hypothesis reprs a sampled value, and repr() of 10**5000 raises.
huge_int = (
    st.integers()
    | st.sampled_from([2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**40, 2**63])
    | st.sampled_from([639, 640, 5000]).map(lambda digits: -(10**digits))
)
number = huge_int | st.floats() | st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0])


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = {"a": [value]} if depth % 2 else [value]
    return value


json_like = st.recursive(
    st.none() | st.booleans() | number | hostile_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(hostile_text, children, max_size=4)
    ),
    max_leaves=12,
)
payload = (
    json_like
    | st.integers(0, 3000).map(nested)
    | st.sampled_from([{b"bytes": 1}, {1: "int key"}, {"set": {1}}, b"raw", "x" * 1_100_000])
)


@asynccontextmanager
async def two_drivers(driver_factory: DriverFactory) -> AsyncIterator[list[Driver]]:
    """The memory driver (the reference) and the driver under test, fresh, on one manual clock
    (so run-ats compare exactly). Opened per example: pytest-trio runs each Hypothesis example
    in its own trio.run."""
    clock = ManualClock()
    async with AsyncExitStack() as stack:
        opened = [
            await stack.enter_async_context(open_driver("memory://", clock=clock)),
            await stack.enter_async_context(driver_factory(clock)),
        ]
        yield opened


async def jobs_stored(driver: Driver) -> int:
    return sum(sum(q.depth.values()) for q in await driver.stats())


async def outcome_on(driver: Driver, call: dict[str, Any]) -> tuple[object, ...]:
    """What the call did on ``driver``: its error, or the row it stored (no id, no times but
    the run-at, which is on the shared manual clock)."""
    before = await jobs_stored(driver)
    try:
        registry = Registry()
        job = registry.job(call["name"], queue=call["queue"], attempts=call["attempts"])(_never_run)
        job_id = await job.enqueue(
            driver, call["payload"], priority=call["priority"], delay=call["delay"], key=call["key"]
        )
    except JobsError as exc:
        # A deliberate error with a code and a fix, and no row behind it.
        assert exc.fix and exc.code.startswith("X_"), exc
        assert await jobs_stored(driver) == before
        return ("refused", type(exc).__name__, exc.code, str(exc))
    record = await driver.get(job_id)
    assert record is not None
    return (
        "stored",
        record.name,
        record.queue,
        record.payload,
        record.priority,
        record.max_attempts,
        record.key,
        record.run_at,
    )


def _never_run(ctx: object, payload: object) -> None:
    raise AssertionError("never claimed in this test")


# Each field: an ordinary value, or a hostile one. A call makes one to three fields hostile, so
# the boundary is tried one rule at a time as well as together, and calls that pass it are
# stored (and compared) often.
ORDINARY = {
    "name": st.sampled_from(["t", "emails.send", "é名 job"]),
    "queue": st.sampled_from(["default", "q-2"]),
    "attempts": st.integers(1, 5),
    "payload": st.none() | st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    "priority": st.none() | st.integers(-5, 5),
    "delay": st.none() | st.floats(0, 1e6),
    "key": st.none() | st.text(min_size=1, max_size=8),
}
HOSTILE = {
    "name": hostile_text,
    "queue": hostile_text,
    "attempts": huge_int,
    "payload": payload,
    "priority": huge_int | st.floats(),
    "delay": number,
    "key": hostile_text,
}


@st.composite
def calls(draw: st.DrawFn) -> dict[str, Any]:
    hostile = draw(st.sets(st.sampled_from(sorted(HOSTILE)), min_size=1, max_size=3))
    return {f: draw(HOSTILE[f] if f in hostile else ORDINARY[f]) for f in sorted(ORDINARY)}


@settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(call=calls())
async def test_hostile_enqueues_are_refused_alike_or_stored_alike(
    driver_factory: DriverFactory, call: dict[str, Any]
) -> None:
    # Anything but a JobsError (RecursionError, OverflowError, a driver's own refusal)
    # escapes here and fails the example.
    async with two_drivers(driver_factory) as drivers:
        outcomes = [await outcome_on(driver, call) for driver in drivers]
    assert outcomes[0] == outcomes[1], outcomes
    event(f"{outcomes[0][0]} {outcomes[0][2] if outcomes[0][0] == 'refused' else ''}")
