# Task schedules: declaration errors, six-field cron, intervals, and the DST rule on the two
# nights a year the clocks jump; the missed-run plan as a pure function.
from __future__ import annotations

import datetime as dt
import itertools
from zoneinfo import ZoneInfo

import pytest

from jobs_trio import Registry
from jobs_trio._core.errors import ConfigError
from jobs_trio._cron.schedule import CronSchedule, IntervalSchedule, next_fire
from jobs_trio._cron.tasks import Missed, plan_fires

BERLIN = ZoneInfo("Europe/Berlin")
UTC = dt.UTC


def ts(*args: int, zone: dt.tzinfo = UTC, fold: int = 0) -> float:
    return dt.datetime(*args, tzinfo=zone, fold=fold).timestamp()  # type: ignore[misc]


def fires(schedule: CronSchedule | IntervalSchedule, start: float, end: float) -> list[float]:
    return list(itertools.takewhile(lambda t: t <= end, schedule.after(start)))


# Declaring.


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"cron": "61 * * * *"}, "is not a cron expression: Bad minute"),
        ({"cron": "* * * *"}, "Wrong number of fields"),
        ({"cron": "@daily"}, "Wrong number of fields"),
        ({"cron": "0 0 30 2 *"}, "Bad day-of-month"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "not a known IANA time zone"),
        ({"cron": "0 9 * * *", "timezone": ""}, "is not a time zone name"),
        ({}, "exactly one of cron= and every="),
        ({"cron": "0 9 * * *", "every": 60}, "exactly one of cron= and every="),
        ({"every": 0}, "whole number of seconds from 1 to"),
        ({"every": 1.5}, "whole number of seconds from 1 to"),
        # Past a float: accepted, it stopped the worker at the scheduler's first look.
        ({"every": 10**309}, r"an int of 1027 bits is not a whole number of seconds from 1 to"),
        ({"every": 200 * 366 * 86400}, r"\(100 years\)"),
        ({"every": 60, "timezone": "Europe/Berlin"}, "an interval has no time zone"),
        ({"cron": "0 9 * * *", "missed": "twice"}, "is not a missed-run policy"),
        ({"cron": "0 9 * * *", "missed": "all", "catch_up": 0}, "catch_up=0"),
    ],
)
def test_a_bad_declaration_is_a_clear_error_before_anything_runs(
    options: dict[str, object], says: str
) -> None:
    registry = Registry()
    with pytest.raises(ConfigError, match=says) as caught:
        registry.task("reports.daily", **options)  # type: ignore[arg-type]
    assert caught.value.code == "X_CONFIG"
    assert caught.value.fix
    assert "reports.daily" not in registry  # nothing half-declared


def test_a_task_is_a_job_too_with_its_options() -> None:
    registry = Registry()

    @registry.task("reports.daily", cron="0 9 * * *", queue="reports", attempts=5, timeout=10)
    async def daily(ctx: object, payload: object) -> None: ...

    assert registry.require("reports.daily") is daily.job
    assert (daily.job.queue, daily.job.attempts, daily.job.timeout) == ("reports", 5, 10)
    assert daily.missed is Missed.LATEST
    assert registry.tasks() == [daily]


# Instants.


def test_six_fields_put_seconds_first() -> None:
    every_two = CronSchedule("*/2 * * * * *")
    start = ts(2025, 1, 1, 0, 0, 0)
    assert fires(every_two, start, start + 7) == [start + 2, start + 4, start + 6]
    assert next_fire(CronSchedule("15 0 9 * * *"), start) == ts(2025, 1, 1, 9, 0, 15)


def test_before_includes_the_instant_itself_and_mirrors_after() -> None:
    daily = CronSchedule("0 9 * * *", "Europe/Berlin")
    nine = ts(2025, 6, 1, 9, 0, zone=BERLIN)
    assert next(daily.before(nine)) == nine
    assert next(daily.before(nine - 0.5)) == nine - 86400
    back = list(itertools.islice(daily.before(nine), 5))
    assert list(reversed(back)) == fires(daily, back[-1] - 1, nine)


def test_an_interval_fires_on_multiples_since_the_epoch() -> None:
    minute = IntervalSchedule(60)
    assert fires(minute, 119.5, 240) == [120.0, 180.0, 240.0]
    assert list(itertools.islice(minute.before(180), 2)) == [180.0, 120.0]


# Daylight saving time: Europe/Berlin jumps 02:00 -> 03:00 on 2025-03-30 and falls back
# 03:00 -> 02:00 on 2025-10-26.


@pytest.mark.parametrize("expression", ["30 2 * * *", "0 30 2 * * *"])
def test_a_daily_0230_fires_once_on_the_night_the_clocks_jump_forward(expression: str) -> None:
    daily = CronSchedule(expression, "Europe/Berlin")
    got = fires(daily, ts(2025, 3, 28, 12, zone=BERLIN), ts(2025, 4, 1, 12, zone=BERLIN))
    # 02:30 does not exist on the 30th: it fires once, at the jump (03:00 CEST, 01:00 UTC).
    assert got == [
        ts(2025, 3, 29, 2, 30, zone=BERLIN),
        ts(2025, 3, 30, 1, 0),
        ts(2025, 3, 31, 2, 30, zone=BERLIN),
        ts(2025, 4, 1, 2, 30, zone=BERLIN),
    ]


@pytest.mark.parametrize("expression", ["30 2 * * *", "0 30 2 * * *"])
def test_a_daily_0230_fires_once_on_the_night_the_clocks_fall_back(expression: str) -> None:
    daily = CronSchedule(expression, "Europe/Berlin")
    got = fires(daily, ts(2025, 10, 24, 12, zone=BERLIN), ts(2025, 10, 28, 12, zone=BERLIN))
    # 02:30 happens twice on the 26th: it fires at the first pass (CEST, 00:30 UTC) only.
    assert got == [
        ts(2025, 10, 25, 2, 30, zone=BERLIN),
        ts(2025, 10, 26, 0, 30),
        ts(2025, 10, 27, 2, 30, zone=BERLIN),
        ts(2025, 10, 28, 2, 30, zone=BERLIN),
    ]
    # Looking from inside the second pass, the first pass is behind: nothing fires twice.
    second_pass = ts(2025, 10, 26, 2, 10, zone=BERLIN, fold=1)
    assert next_fire(daily, second_pass) == ts(2025, 10, 27, 2, 30, zone=BERLIN)
    assert next(daily.before(second_pass)) == ts(2025, 10, 26, 0, 30)


def test_an_elapsed_time_schedule_fires_on_both_passes_and_not_in_the_gap() -> None:
    half_hourly = CronSchedule("*/30 * * * *", "Europe/Berlin")
    fall = fires(half_hourly, ts(2025, 10, 25, 23, 59), ts(2025, 10, 26, 2, 0))
    assert fall == [ts(2025, 10, 26, 0, 0) + i * 1800 for i in range(5)]  # 4 in local 02:xx
    spring = fires(half_hourly, ts(2025, 3, 30, 0, 59), ts(2025, 3, 30, 1, 31))
    # 01:00 UTC is 03:00 CEST: 02:00 and 02:30 local never happen.
    assert spring == [ts(2025, 3, 30, 1, 0), ts(2025, 3, 30, 1, 30)]


# The missed-run plan.


def _task(missed: str, catch_up: int = 10, every: int = 60):  # type: ignore[no-untyped-def]
    registry = Registry()
    return registry.task("t", every=every, missed=missed, catch_up=catch_up)(lambda c, p: None)


@pytest.mark.parametrize(
    ("missed", "fired", "skipped"),
    [
        ("skip", (), 10),
        ("latest", (1200.0,), 9),
        ("all", (720.0, 840.0, 960.0, 1080.0, 1200.0), 5),
    ],
)
def test_each_policy_after_ten_missed_minutes(
    missed: str, fired: tuple[float, ...], skipped: int
) -> None:
    # Every two minutes, ten of them missed, the latest 61 s late: too late to be on time.
    plan = plan_fires(_task(missed, catch_up=5, every=120), handled_until=0.0, now=1200.0 + 61)
    assert plan.fire == fired
    assert plan.skipped == skipped
    assert plan.advance_to == 1200.0


def test_skip_still_fires_a_time_that_is_on_time() -> None:
    plan = plan_fires(_task("skip"), handled_until=0.0, now=600.5)
    assert plan.fire == (600.0,)
    assert plan.skipped == 9


def test_nothing_due_plans_nothing_and_a_new_task_starts_from_now() -> None:
    assert plan_fires(_task("latest"), handled_until=600.0, now=659.0).advance_to is None
    first = plan_fires(_task("latest"), handled_until=None, now=650.0)
    assert first.fire == () and first.advance_to == 650.0
