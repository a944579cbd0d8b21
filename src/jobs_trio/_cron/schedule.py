# When a cron task fires: a cron expression (five fields, or six with seconds first) or a fixed
# interval, in a time zone. Apart because every worker of a fleet must compute the same instants
# from the same declaration, and the time-zone rule (DST gaps and repeats) is decided here alone.
from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs
from cronsim import CronSim, CronSimError

from .._core.boundary import MAX_SECONDS, shown
from .._core.errors import ConfigError

# cronsim gives up looking for a match this far ahead; a schedule that never fires within it
# is refused at declaration ("0 0 30 2 *", February 30th).
_NEVER = math.inf

# Longer than any change of a zone's UTC offset (DST moves clocks by one hour, a few zones by
# two); a wall-clock walk backwards starts this far ahead so it sees a repeated hour whole.
_LONGEST_REPEAT = dt.timedelta(hours=3)


class Schedule(Protocol):
    """The instants (epoch seconds) a task fires at. Every worker computes the same ones."""

    def after(self, t: float) -> Iterator[float]:
        """The fire instants strictly after ``t``, ascending."""
        ...

    def before(self, t: float) -> Iterator[float]:
        """The fire instants at or before ``t``, descending."""
        ...

    def describe(self) -> str: ...

    def local(self, t: float) -> dt.datetime:
        """``t`` as an aware datetime in the schedule's time zone (for payloads and listings)."""
        ...


def next_fire(schedule: Schedule, t: float) -> float:
    """The first fire instant strictly after ``t`` (infinity when there is none)."""
    return next(schedule.after(t), _NEVER)


def _zone(name: object) -> ZoneInfo:
    if not isinstance(name, str) or not name:
        raise ConfigError(
            f"timezone={name!r} is not a time zone name", fix="pass an IANA name like 'UTC'"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(
            f"timezone={name!r} is not a known IANA time zone ({exc})",
            fix="use a name such as 'UTC', 'Europe/Berlin' or 'America/New_York'"
            " (see zoneinfo.available_timezones())",
        ) from exc


@attrs.frozen
class CronSchedule:
    """A cron expression read by cronsim (Debian cron's semantics), in ``timezone``.

    The DST rule: an expression whose minute and hour fields are both fixed (``30 2 * * *``,
    ``0 9,17 * * 1-5``, ``0 30 2 * * *``) is a *wall-clock* schedule. A wall time the clocks
    skip (spring forward) fires once, at the instant of the jump; a wall time the clocks pass
    twice (fall back) fires once, at its first pass. Any other expression (``*/15 * * * *``,
    ``0 */2 * * *``) follows elapsed time: it fires at every instant whose local time matches,
    so nothing in the skipped hour and both passes of the repeated one. This is Debian cron's
    rule, which cronsim applies to five fields; jobs_trio applies the same rule to six.
    """

    expression: str
    timezone: str = "UTC"
    _zone: ZoneInfo = attrs.field(init=False, repr=False, eq=False)
    _wall_clock: bool = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        zone = _zone(self.timezone)
        if not isinstance(self.expression, str):
            raise ConfigError(
                f"cron={self.expression!r} is not a str", fix="pass a cron expression as text"
            )
        fields = self.expression.split()
        try:
            probe = CronSim(self.expression, dt.datetime(2000, 1, 1, tzinfo=zone))
            next(probe)
        except CronSimError as exc:
            raise ConfigError(
                f"cron={self.expression!r} is not a cron expression: {exc}",
                fix="write five fields (minute hour day-of-month month day-of-week), or six with"
                " seconds first, e.g. '0 9 * * *' or '*/5 * * * * *'; no @daily-style aliases",
            ) from exc
        except StopIteration:
            raise ConfigError(
                f"cron={self.expression!r} never fires", fix="check the day and month fields"
            ) from None
        minute, hour = (fields[0], fields[1]) if len(fields) == 5 else (fields[1], fields[2])
        object.__setattr__(self, "_zone", zone)
        object.__setattr__(
            self, "_wall_clock", not minute.startswith("*") and not hour.startswith("*")
        )

    def describe(self) -> str:
        return f"cron {self.expression!r} {self.timezone}"

    def local(self, t: float) -> dt.datetime:
        return dt.datetime.fromtimestamp(t, self._zone)

    def after(self, t: float) -> Iterator[float]:
        return self._walk(t, reverse=False)

    def before(self, t: float) -> Iterator[float]:
        # cronsim's reverse walk starts strictly before its start: start one second later so
        # an instant exactly at ``t`` is included (fire instants are whole seconds).
        return self._walk(math.floor(t) + 1.0, reverse=True, limit=t)

    def _walk(self, t: float, *, reverse: bool, limit: float = math.inf) -> Iterator[float]:
        start = self.local(math.floor(t) if not reverse else t)
        if self._wall_clock:
            wall_start = start.replace(tzinfo=None)
            if reverse:
                # Inside the second pass of a repeated hour, a wall time later than ours (02:30
                # seen from the second 02:10) already fired on the first pass: walk back from
                # past any repeat and let `limit` drop what lies ahead of ``t``.
                wall_start += _LONGEST_REPEAT
            times = (
                _instant(wall, self._zone)
                for wall in CronSim(self.expression, wall_start, reverse=reverse)
            )
        else:
            times = (when.timestamp() for when in CronSim(self.expression, start, reverse=reverse))
        last: float | None = None
        for instant in times:
            # Strictly monotonic: several skipped wall times resolve to one jump instant, and
            # a wall-clock start inside a repeated hour resolves to its first pass (behind us).
            ahead = instant > limit if reverse else instant <= t
            repeated = last is not None and (instant >= last if reverse else instant <= last)
            if ahead or repeated:
                continue
            last = instant
            yield instant


def _instant(wall: dt.datetime, zone: ZoneInfo) -> float:
    """The instant a naive local wall time stands for, by the wall-clock rule: the first pass
    of a repeated time; for a skipped time, the instant the clocks jumped."""
    first = wall.replace(tzinfo=zone, fold=0).timestamp()
    if dt.datetime.fromtimestamp(first, zone).replace(tzinfo=None) == wall:
        return first
    # In a gap: fold=1 reads it with the offset after the jump (an instant before the jump),
    # fold=0 with the one before (an instant after). The jump is the first whole second in
    # between whose local time is at or past ``wall``.
    low, high = math.floor(wall.replace(tzinfo=zone, fold=1).timestamp()), math.ceil(first)
    while low < high:
        middle = (low + high) // 2
        if dt.datetime.fromtimestamp(middle, zone).replace(tzinfo=None) >= wall:
            high = middle
        else:
            low = middle + 1
    return float(low)


@attrs.frozen
class IntervalSchedule:
    """Every ``seconds`` seconds, on multiples of it since the Unix epoch (UTC), so every
    worker agrees on the instants without reading anything: ``every=60`` fires on the minute."""

    seconds: int

    def __attrs_post_init__(self) -> None:
        seconds = self.seconds
        # At most MAX_SECONDS (100 years): every=10**309 was accepted, and the scheduler's
        # first look at it overflowed a float and stopped the worker with no code.
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int)
            or not 1 <= seconds <= MAX_SECONDS
        ):
            raise ConfigError(
                f"every={shown(seconds)} is not a whole number of seconds from 1 to"
                f" {MAX_SECONDS:.0f} (100 years)",
                fix="pass every=60 (seconds) or a timedelta of whole seconds",
            )

    def describe(self) -> str:
        return f"every {self.seconds} s"

    def local(self, t: float) -> dt.datetime:
        return dt.datetime.fromtimestamp(t, dt.UTC)

    def after(self, t: float) -> Iterator[float]:
        k = math.floor(t / self.seconds) + 1
        while True:
            yield float(k * self.seconds)
            k += 1

    def before(self, t: float) -> Iterator[float]:
        k = math.floor(t / self.seconds)
        while k >= 0:
            yield float(k * self.seconds)
            k -= 1


def parse_schedule(
    *, cron: str | None, every: float | dt.timedelta | None, timezone: str
) -> CronSchedule | IntervalSchedule:
    """The schedule a ``@registry.task(...)`` declares: exactly one of ``cron=`` / ``every=``."""
    if (cron is None) == (every is None):
        raise ConfigError(
            "a task needs exactly one of cron= and every=",
            fix="pass cron='0 9 * * *' (a cron expression) or every=60 (seconds)",
        )
    if cron is not None:
        return CronSchedule(cron, timezone)
    if timezone != "UTC":
        raise ConfigError(
            f"timezone={timezone!r} was given with every=: an interval has no time zone",
            fix="drop timezone=, or use cron= for a schedule on local wall-clock times",
        )
    seconds = every.total_seconds() if isinstance(every, dt.timedelta) else every
    if isinstance(seconds, float) and seconds.is_integer():
        seconds = int(seconds)
    return IntervalSchedule(seconds)  # type: ignore[arg-type]
