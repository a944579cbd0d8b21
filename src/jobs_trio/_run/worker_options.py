# A worker's options, checked once where they enter: the queues, each one's concurrency and claims
# ahead, the lease and its renewals, the waits. Apart so that Worker holds values, not checks.
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Literal

import attrs

from .._core.errors import ConfigError
from .._jobs.registry import Registry
from ..drivers.contract import Driver

# How long a claim holds a job without renewal: after a worker dies (kill -9, OOM, a lost
# machine) its jobs are claimable again within this long. 8 s keeps that rescue under 10 s
# even when the death comes just after a renewal; renewals every lease / 3 (~2.7 s) leave
# two missed renewals of slack before a live worker loses its jobs.
DEFAULT_LEASE = 8.0
# The shortest lease a worker takes (see Worker: a claim must come back well inside it).
MIN_LEASE = 1.0

# How long a claim taken ahead of a free slot (``claim_ahead``) waits for one before it is handed
# back, unstarted and uncounted: the most a job waits behind a long one on a busy worker while
# another worker could have run it.
DEFAULT_HOLD_LIMIT = 1.0

# ``claim_ahead="auto"`` (the default): each queue claims ahead what its own slots start in about
# AUTO_HOLD seconds at the pace its runs have kept so far, at most AUTO_MAX (slots.py). A held job
# then waits for a slot about as long as a claim's round trip takes, not the hold limit.
AUTO: Final = "auto"
ClaimAhead = int | Literal["auto"]


@attrs.frozen
class WorkerOptions:
    queues: tuple[str, ...]
    limits: Mapping[str, int]  # each queue's concurrency
    ahead: Mapping[str, int]  # each queue's claims ahead of a free slot (fixed by the caller)
    # Queues whose claims ahead the worker sizes from their runs' pace (claim_ahead="auto");
    # their ``ahead`` is the most it takes.
    auto_ahead: frozenset[str]
    hold_limit: float
    lease: float
    renew_interval: float
    # After a failed claim, the next try; while idle, the longest wait without a look (every
    # driver wakes the loop on new work: LISTEN, in-process, SQLite's own poll).
    poll_interval: float
    safety_poll: float


def worker_options(
    driver: Driver,
    registry: Registry,
    *,
    queues: Sequence[str] | None,
    concurrency: int | Mapping[str, int],
    claim_ahead: ClaimAhead | Mapping[str, ClaimAhead] | None,
    hold_limit: float,
    lease: float,
    renew_interval: float | None,
    poll_interval: float,
    safety_poll: float,
) -> WorkerOptions:
    """The options of ``Worker(...)``, or a ``ConfigError`` saying which and how to fix it."""
    chosen = tuple(queues) if queues else tuple(registry.queues())
    if not chosen:
        raise ConfigError(
            "the worker has no queue to claim from: the registry declares no job",
            fix="declare jobs with @registry.job(...) before starting the worker, or pass queues=",
        )
    limits = _limits(concurrency, chosen)
    asked = _claim_ahead(claim_ahead, limits)
    ahead = {q: value for q, value in asked.items() if isinstance(value, int)}
    if any(ahead.values()) and not driver.capabilities.claims_ahead:
        # It tells its driver each queue's free slots (claim(free=)) and which held claims
        # have started (renew(started=)): a driver without them would fail the first claim.
        raise ConfigError(
            f"claim_ahead needs a driver that claims ahead; {type(driver).__name__} does not"
            " declare it (Capabilities.claims_ahead)",
            fix="update the driver to the current contract (docs/drivers.md), or leave"
            " claim_ahead at 0",
        )
    if not hold_limit > 0:
        raise ConfigError(f"hold_limit={hold_limit!r}", fix="give hold_limit > 0 seconds")
    for name, value in (
        ("lease", lease),
        ("poll_interval", poll_interval),
        ("safety_poll", safety_poll),
    ):
        if not value > 0:
            raise ConfigError(f"{name}={value!r}", fix=f"give {name} > 0 seconds")
    if lease < MIN_LEASE:
        # Counted from the claim's send, less a stop margin: shorter than a slow claim's round
        # trip, every claim came back late and was handed back unstarted (a worker that logged
        # jobs.claim.late thousands of times a second and ran nothing).
        raise ConfigError(
            f"lease={lease!r} is shorter than {MIN_LEASE:g} s",
            fix=f"give lease >= {MIN_LEASE:g} seconds (the default is {DEFAULT_LEASE:g}): a"
            " claim must come back well inside its lease, and a run is stopped a margin"
            " before it runs out",
        )
    auto = frozenset(
        q for q, value in asked.items() if value == AUTO and _auto_fits(q, driver, registry)
    )
    for queue in asked:
        if asked[queue] == AUTO:
            ahead[queue] = AUTO_MAX if queue in auto else 0
    interval = renew_interval if renew_interval is not None else lease / 3
    if not 0 < interval < lease:
        raise ConfigError(
            f"renew_interval={interval!r} with lease={lease!r}",
            fix="renew more often than the lease lasts (the default is lease / 3)",
        )
    return WorkerOptions(
        queues=chosen,
        limits=limits,
        ahead=ahead,
        auto_ahead=auto,
        hold_limit=float(hold_limit),
        lease=float(lease),
        renew_interval=interval,
        poll_interval=poll_interval,
        safety_poll=safety_poll,
    )


# The most a queue claims ahead when the worker sizes it (claim_ahead="auto"). Larger claims
# cost both sides less a job (PostgreSQL's fixed cost a statement, ~0.6 ms, spread wider), and
# at 128 a worker at concurrency 50 still waited for claims: bench/worker_cpu.py --jobs 30000,
# alternating, 512 with a 50 ms hold ran 6,141/7,329/8,855 jobs/s at c=50 against 5,777/
# 5,219/6,795, and 7,037/8,214/7,342 at c=10 against 5,204/8,065/6,277. Past it a crash
# lapses more held jobs at once (their attempts given back, their runs a lease late).
AUTO_MAX: Final = 512


def _auto_fits(queue: str, driver: Driver, registry: Registry) -> bool:
    """Whether the worker may size ``queue``'s claims ahead itself: its driver claims ahead,
    and no job of the queue has a fleet limit (a held job would take its fleet slot or rate
    token at claim, before it runs: an explicit claim_ahead still may)."""
    if not driver.capabilities.claims_ahead:
        return False
    return not any(
        d.fleet_limit is not None or d.rate_limit is not None for d in registry if d.queue == queue
    )


def _claim_ahead(
    ahead: ClaimAhead | Mapping[str, ClaimAhead] | None, limits: Mapping[str, int]
) -> dict[str, ClaimAhead]:
    if ahead is None or ahead == AUTO:
        return dict.fromkeys(limits, AUTO)
    if isinstance(ahead, Mapping):
        # A queue this worker does not claim from is a misspelling, not a setting for another
        # worker: silently 0, it would turn nothing on.
        unknown = sorted(str(q) for q in ahead if q not in limits)
        if unknown:
            raise ConfigError(
                f"claim_ahead names queues this worker does not claim from: {unknown}",
                fix=f"name only its queues ({', '.join(limits)}), or pass one int for all",
            )
        values: dict[str, ClaimAhead] = {q: ahead.get(q, AUTO) for q in limits}
    else:
        values = dict.fromkeys(limits, ahead)
    for queue, value in values.items():
        if value == AUTO:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(
                f"claim_ahead {value!r} for queue {queue!r}",
                fix='give each queue "auto" (the default: sized from its jobs\' pace), 0 (claim'
                " only for free slots) or a number of jobs",
            )
    return values


def _limits(concurrency: int | Mapping[str, int], queues: Sequence[str]) -> dict[str, int]:
    if isinstance(concurrency, int):
        limits = dict.fromkeys(queues, concurrency)
    else:
        limits = {q: concurrency.get(q, 10) for q in queues}
    for queue, limit in limits.items():
        if not isinstance(limit, int) or limit < 1:
            raise ConfigError(
                f"concurrency {limit!r} for queue {queue!r}", fix="give each queue >= 1"
            )
    return limits
