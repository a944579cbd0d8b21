# The one rule every driver's claim applies to jobs with fleet limits: which of them get a slot
# and a start, which are put off (and until when), and which are left for the next claim.
# Apart so memory, SQLite and PostgreSQL decide alike; each only reads and writes the rows.
"""A limit key owns N *limit rows* (kind, key, n = 1..N). A row is free when its ``until`` is
unset or has passed. A slot row taken by a claim holds the run's token and lasts as long as the
run's lease: renewed with it, freed when its settlement is written, lapsed when its worker died
(and then free for any claim: a takeover). A rate row taken by a claim records the start and
is free again ``per`` seconds later, so no window of ``per`` seconds sees more than N starts.

A candidate is granted only when every limit it carries has a free row; else it is put off to
when a row of its blocking key may free (the k-th put off of a key to the k-th earliest, a
round later beyond N), never failed and never counted. A key some of whose rows another claim
holds locked right now (PostgreSQL) is *busy*: its candidates are left as they are, for the
next claim, rather than put off on a guess."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from .._core.records import ClaimToken, JobId, JobLimits, new_token

SLOT = "slot"
RATE = "rate"


@attrs.frozen
class LimitRow:
    kind: str  # SLOT or RATE
    key: str
    n: int  # 1..N
    until: float | None = None  # free once unset or past
    token: ClaimToken | None = None  # a slot row's holder
    job_id: JobId | None = None


def is_free(row: LimitRow, now: float) -> bool:
    return row.until is None or row.until <= now


def waiting_on(kind: str, key: str) -> str:
    """The text a put-off job's row carries: what it waits for (a settle wakes ``slot:`` ones)."""
    return f"{kind}:{key}"


def needs(limits: JobLimits) -> list[tuple[str, str, int]]:
    """(kind, key, N) of every limit ``limits`` carries."""
    wanted = []
    if limits.slot_key is not None:
        wanted.append((SLOT, limits.slot_key, limits.slots))
    if limits.rate_key is not None:
        wanted.append((RATE, limits.rate_key, limits.starts))
    return wanted


@attrs.frozen
class Decision:
    granted: Mapping[JobId, ClaimToken]  # each claims with this token
    taken: Sequence[LimitRow]  # the rows as the grants leave them, to write
    put_off: Mapping[JobId, tuple[float, str]]  # run-at and waiting_on, to write


def decide(
    candidates: Sequence[tuple[JobId, JobLimits]],
    rows: Mapping[tuple[str, str], Sequence[LimitRow]],
    *,
    now: float,
    lease: float,
    missing_is_free: bool,
) -> Decision:
    """Decide ``candidates`` (claim order) against ``rows``, every row of their keys this claim
    can take. ``missing_is_free``: a row 1..N not in ``rows`` is one never written (memory,
    SQLite: free); else it is one another claim holds locked (busy)."""
    current: dict[tuple[str, str, int], LimitRow] = {
        (r.kind, r.key, r.n): r for key_rows in rows.values() for r in key_rows
    }
    put_off_per_key: dict[tuple[str, str], int] = {}
    granted: dict[JobId, ClaimToken] = {}
    taken: list[LimitRow] = []
    put_off: dict[JobId, tuple[float, str]] = {}
    for job_id, limits in candidates:
        picks: list[LimitRow] = []
        blocked: tuple[float, str] | None = None
        busy = False
        for kind, key, limit in needs(limits):
            free = None
            untils: list[float] = []
            for n in range(1, limit + 1):
                row = current.get((kind, key, n))
                if row is None:
                    if missing_is_free:
                        row = LimitRow(kind, key, n)
                    else:
                        busy = True
                        continue
                if is_free(row, now):
                    free = row
                    break
                assert row.until is not None
                untils.append(row.until)
            if free is not None:
                picks.append(free)
            elif untils and not busy:
                # Spread a line of waiters over the moments rows free, so a deep line is looked
                # at a few at a time: the k-th waiter of a key at the k-th earliest, and past N
                # a round later per N (a lease for slots, which renew; `per` for starts).
                k = put_off_per_key.get((kind, key), 0)
                put_off_per_key[(kind, key)] = k + 1
                untils.sort()
                span = lease if kind == SLOT else limits.per
                at = untils[k % len(untils)] + (k // len(untils)) * span
                if blocked is None or at > blocked[0]:
                    blocked = (at, waiting_on(kind, key))
        if busy:
            continue
        if blocked is not None:
            put_off[job_id] = blocked
            continue
        token = new_token()
        granted[job_id] = token
        for row in picks:
            if row.kind == SLOT:
                held = attrs.evolve(row, until=now + lease, token=token, job_id=job_id)
            else:
                held = attrs.evolve(row, until=now + limits.per, token=None, job_id=job_id)
            current[(row.kind, row.key, row.n)] = held
            taken.append(held)
    return Decision(granted=granted, taken=taken, put_off=put_off)
