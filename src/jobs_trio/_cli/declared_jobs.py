# The job names `jobs-trio enqueue` accepts without --app: the ones the fleet's workers declare
# (each announces its registry's jobs, presence.py), with the queue and attempts they declare
# them with. Apart from main.py because it is the one place a name is checked against a fleet
# rather than a registry, and a refusal here names the close matches.
from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import attrs

from .._core.errors import ConfigError, UnknownJob, unknown_job
from .._core.records import WorkerPresence

T = TypeVar("T", str, int)


@attrs.frozen
class Declared:
    """How the fleet declares one job: the queues and attempts its workers give it (more than
    one of each only mid-deploy, when two releases disagree)."""

    queues: frozenset[str]
    attempts: frozenset[int]


def fleet_declares(workers: Sequence[WorkerPresence]) -> dict[str, Declared]:
    """Each job name the recorded workers declare, as they declare it."""
    queues: dict[str, set[str]] = {}
    attempts: dict[str, set[int]] = {}
    for worker in workers:
        for name, queue, tries in worker.jobs:
            queues.setdefault(name, set()).add(queue)
            attempts.setdefault(name, set()).add(tries)
    return {name: Declared(frozenset(queues[name]), frozenset(attempts[name])) for name in queues}


# What a refused name can do instead, said once for every refusal of the fleet check.
ELSEWHERE = (
    "check the name; or give --app MODULE[:ATTR] to check it against your registry (no worker"
    " need run), or --any-name to enqueue it unchecked"
)


def resolve(
    name: str, queue: str | None, attempts: int | None, workers: Sequence[WorkerPresence]
) -> tuple[str, int]:
    """The queue and attempts to enqueue ``name`` with: those given, else as the fleet declares
    them. Refuses a name no recorded worker declares (``UnknownJob``), and a queue or attempts
    the workers disagree on when none was given (``ConfigError``)."""
    declared = fleet_declares(workers)
    known = declared.get(name)
    if known is None:
        if not workers:
            raise UnknownJob(
                f"no worker has announced itself on this database in the last hour, so no"
                f" registry can vouch for the job name {name!r}",
                fix=ELSEWHERE,
            )
        seen = f"the registry of the {len(workers)} worker{'s' * (len(workers) != 1)} seen"
        raise unknown_job(name, declared, where=seen, fix=ELSEWHERE)
    return _one(name, "--queue", queue, known.queues), _one(
        name, "--attempts", attempts, known.attempts
    )


def _one(name: str, flag: str, given: T | None, declared: frozenset[T]) -> T:
    if given is not None:
        return given
    if len(declared) == 1:
        [only] = declared
        return only
    raise ConfigError(
        f"the workers declare {name!r} with different {flag.removeprefix('--')}:"
        f" {', '.join(map(repr, sorted(declared, key=str)))} (two releases running?)",
        fix=f"give {flag}",
    )
