# Fleet-wide limits a job declares: at most N bodies at once (`FleetLimit`) and at most N starts
# in any window of a period (`RateLimit`), per job or per key taken from the payload at enqueue.
# Apart because the declaration is checked once here; the drivers only ever see `JobLimits`.
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

from .boundary import check_int, check_key, check_name, raised_text, shown
from .errors import ConfigError, InvalidArgument
from .records import JobLimits

# What a key function gets (the payload, as enqueue was given it) and gives (the key's text).
KeyOf = Callable[[Any], object]


def _check_count(what: str) -> Callable[[Any, attrs.Attribute[int], int], None]:
    def check(instance: Any, attribute: attrs.Attribute[int], value: int) -> None:
        check_int(value, argument=what, low=1, high=10_000)

    return check


def _check_scope(instance: Any, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None:
        check_name(value, argument="scope")


def _check_key_of(instance: Any, attribute: attrs.Attribute[KeyOf | None], value: object) -> None:
    if value is not None and not callable(value):
        raise ConfigError(
            f"key={value!r} is not callable",
            fix="pass a function of the payload, e.g. key=lambda p: p['account']",
        )


@attrs.frozen
class FleetLimit:
    """At most ``slots`` bodies of this job (or of this ``key``) running at once across every
    worker of the fleet. ``key`` is a function of the payload, called at enqueue (e.g.
    ``lambda p: p["account"]``); ``scope`` names a limit several jobs share (default: the job's
    name). A job whose slot is taken stays ready, uncounted, until one frees."""

    slots: int = attrs.field(validator=_check_count("FleetLimit slots"))
    key: KeyOf | None = attrs.field(default=None, validator=_check_key_of)
    scope: str | None = attrs.field(default=None, validator=_check_scope)


@attrs.frozen
class RateLimit:
    """At most ``starts`` starts of this job (or of this ``key``) in any window of ``per``
    seconds, across the fleet; up to ``starts`` may start at once (the burst). A job over the
    rate stays ready, uncounted, put off until a start frees."""

    starts: int = attrs.field(validator=_check_count("RateLimit starts"))
    per: float = 1.0
    key: KeyOf | None = attrs.field(default=None, validator=_check_key_of)
    scope: str | None = attrs.field(default=None, validator=_check_scope)

    def __attrs_post_init__(self) -> None:
        per = self.per
        if isinstance(per, bool) or not isinstance(per, int | float):
            raise InvalidArgument(
                "per", f"{shown(per)} is not a number", fix="give per > 0 seconds"
            )
        # An int is finite (math.isfinite of one past a double raised OverflowError, no code).
        if not ((isinstance(per, int) or math.isfinite(per)) and 0 < per <= 86_400):
            raise InvalidArgument(
                "per",
                f"{shown(per)} is not from >0 to 86,400 seconds",
                fix="give per from >0 to 86,400 s",
            )


def _key(
    job: str, scope: str | None, key_of: KeyOf | None, payload: Any, limit: str, what: str
) -> str:
    name = scope or job
    if key_of is None:
        return name
    try:
        part = key_of(payload)
    except Exception as exc:
        raise InvalidArgument(
            f"{limit} key",
            f"job {job!r}: the key function raised {raised_text(exc)} (for {what})",
            fix="make the key function accept every payload this job is enqueued with",
        ) from exc
    if isinstance(part, bool) or not isinstance(part, str | int):
        # None (a payload.get() that found nothing) put every such job under one key, and
        # bytes became their repr: refused where they enter, not shared in silence.
        raise InvalidArgument(
            f"{limit} key",
            f"job {job!r}: the key function returned {shown(part)}, a {type(part).__name__}"
            f" (for {what})",
            fix="return a str (or an int) that names what the limit is per, for every payload"
            " this job is enqueued with",
        )
    # One text per key across drivers: the scope, then the payload's part.
    return check_key(f"{name}:{part}", argument=f"{limit} key")


def resolve(
    job: str,
    concurrency: FleetLimit | None,
    rate: RateLimit | None,
    payload: Any,
    what: str = "payload",
) -> JobLimits | None:
    """The limits a job's row stores, from its declaration and this payload (None: unlimited,
    and the claim's fast path); ``what`` names the payload in a refusal."""
    if concurrency is None and rate is None:
        return None
    limits = JobLimits()
    if concurrency is not None:
        limits = attrs.evolve(
            limits,
            slot_key=_key(job, concurrency.scope, concurrency.key, payload, "fleet limit", what),
            slots=concurrency.slots,
        )
    if rate is not None:
        limits = attrs.evolve(
            limits,
            rate_key=_key(job, rate.scope, rate.key, payload, "rate limit", what),
            starts=rate.starts,
            per=float(rate.per),
        )
    return limits
