# The contract's calls with long signatures, taken once for the three drivers of this package:
# each hands its arguments on as one value (River's params structs) to the driver's own method,
# and a claim inside another call hands such a value back to `claim`.
from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from .._core.records import Claim, JobId, JobRecord, JobState, NewJob, RelayDecision, Settlement


@attrs.frozen
class ClaimAsk:
    """What ``Driver.claim`` (and ``settle_and_claim``'s claim) was asked for."""

    queues: Sequence[str]
    limit: int | Mapping[str, int]
    lease: float
    worker_id: str
    free: Mapping[str, int] | None
    rescue: bool
    # The orphan rule's claim by a worker that runs nothing (Capabilities.claims_alone): read
    # apart from parts(), which a driver without it unpacks as it always did.
    alone: bool = False

    def parts(
        self,
    ) -> tuple[Sequence[str], int | Mapping[str, int], float, str, Mapping[str, int] | None, bool]:
        """The arguments in the contract's order, typed (attrs.astuple's are Any)."""
        return self.queues, self.limit, self.lease, self.worker_id, self.free, self.rescue


@attrs.frozen
class JobFilter:
    """What ``Driver.list_jobs`` was asked for, as given (each driver reads it its own way)."""

    state: JobState | None
    queue: str | None
    name: str | None
    changed_before: float | None
    limit: int

    def parts(self) -> tuple[JobState | None, str | None, str | None, float | None, int]:
        return self.state, self.queue, self.name, self.changed_before, self.limit


@attrs.frozen
class RelayAsk:
    """What ``Driver.relay_enqueue`` was asked to write, under which ticket."""

    jobs: Sequence[NewJob]
    source: str
    ticket: str
    superseded: Sequence[str]

    def parts(self) -> tuple[Sequence[NewJob], str, str, Sequence[str]]:
        return self.jobs, self.source, self.ticket, self.superseded


class ClaimCalls:
    """``claim``, ``settle_and_claim`` and ``wait_for_work``, for a driver that answers
    ``_claim(ask)``, ``_settle_and_claim(settlements, ask)`` and ``_wait_for_work(queues,
    timeout, rescue_from, alone)``."""

    async def claim(
        self,
        queues: Sequence[str],
        limit: int | Mapping[str, int],
        *,
        lease: float,
        worker_id: str,
        free: Mapping[str, int] | None = None,
        rescue: bool = True,
        alone: bool = False,
    ) -> Sequence[Claim]:
        return await self._claim(ClaimAsk(queues, limit, lease, worker_id, free, rescue, alone))

    async def settle_and_claim(
        self,
        settlements: Sequence[Settlement],
        queues: Sequence[str],
        limit: int | Mapping[str, int],
        *,
        lease: float,
        worker_id: str,
        free: Mapping[str, int] | None = None,
        rescue: bool = True,
        alone: bool = False,
    ) -> tuple[Sequence[JobId], Sequence[Claim]]:
        ask = ClaimAsk(queues, limit, lease, worker_id, free, rescue, alone)
        return await self._settle_and_claim(settlements, ask)

    async def wait_for_work(
        self,
        queues: Sequence[str],
        timeout: float,
        *,
        rescue_from: float | None = None,
        alone: bool = False,
    ) -> None:
        await self._wait_for_work(queues, timeout, rescue_from, alone)

    async def _ask_claim(self, ask: ClaimAsk) -> Sequence[Claim]:
        """``claim`` asked for ``ask`` (a claim inside another call): through the method a test
        double overrides, not ``_claim``; ``alone=`` only when asked, as a double's claim may
        predate it."""
        return await self.claim(
            ask.queues,
            ask.limit,
            lease=ask.lease,
            worker_id=ask.worker_id,
            free=ask.free,
            rescue=ask.rescue,
            **({"alone": True} if ask.alone else {}),
        )

    async def _claim(self, ask: ClaimAsk) -> Sequence[Claim]:
        raise NotImplementedError

    async def _wait_for_work(
        self, queues: Sequence[str], timeout: float, rescue_from: float | None, alone: bool
    ) -> None:
        raise NotImplementedError

    async def _settle_and_claim(
        self, settlements: Sequence[Settlement], ask: ClaimAsk
    ) -> tuple[Sequence[JobId], Sequence[Claim]]:
        raise NotImplementedError


class ListCalls:
    """``list_jobs``, for a driver that answers ``_list_jobs(wanted)``."""

    async def list_jobs(
        self,
        *,
        state: JobState | None = None,
        queue: str | None = None,
        name: str | None = None,
        changed_before: float | None = None,
        limit: int = 100,
    ) -> Sequence[JobRecord]:
        return await self._list_jobs(JobFilter(state, queue, name, changed_before, limit))

    async def _list_jobs(self, wanted: JobFilter) -> Sequence[JobRecord]:
        raise NotImplementedError


class RelayCalls:
    """``relay_enqueue``, for a driver that answers ``_relay_enqueue(ask)``."""

    async def relay_enqueue(
        self,
        jobs: Sequence[NewJob],
        *,
        source: str,
        ticket: str,
        superseded: Sequence[str] = (),
    ) -> Sequence[RelayDecision]:
        return await self._relay_enqueue(RelayAsk(jobs, source, ticket, superseded))

    async def _relay_enqueue(self, ask: RelayAsk) -> Sequence[RelayDecision]:
        raise NotImplementedError
