# How one claim divides its slots among queues: each queue's cap and the claim's total, and the
# pick in claim order that respects both. Apart so that every driver applies one rule (the
# PostgreSQL driver says the same in SQL) and the worker asks for all its queues in one claim.
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

import attrs

from .._core.errors import ConfigError

T = TypeVar("T")


@attrs.frozen
class ClaimSlots:
    caps: Mapping[str, int]  # each queue asked, with the most jobs it may take (all >= 1)
    total: int  # the most jobs the claim takes across its queues

    @classmethod
    def of(cls, queues: Sequence[str], limit: int | Mapping[str, int]) -> ClaimSlots:
        """An ``int`` limit bounds the claim's total, best first across ``queues`` (a deep
        queue may take all of it). A mapping gives each queue its own limit, so one claim
        serves every queue of a worker fairly: a queue takes up to its own free slots, never
        another's; a queue of ``queues`` the mapping does not name takes none."""
        names = list(dict.fromkeys(queues))
        if isinstance(limit, Mapping):
            for queue, n in limit.items():
                if isinstance(n, bool) or not isinstance(n, int):
                    raise ConfigError(
                        f"claim limit {n!r} for queue {queue!r}", fix="give each queue an int"
                    )
            caps = {q: limit[q] for q in names if limit.get(q, 0) > 0}
            return cls(caps=caps, total=sum(caps.values()))
        if limit <= 0:
            return cls(caps={}, total=0)
        return cls(caps=dict.fromkeys(names, limit), total=limit)

    def ahead(self, taken: Iterable[tuple[str, T]], free: Mapping[str, int] | None) -> list[T]:
        """Of ``taken`` (``(queue, candidate)`` in claim order), the ones past their queue's
        ``free`` slots: claimed ahead, held for a slot (none when ``free`` is None)."""
        if free is None:
            return []
        per_queue: Counter[str] = Counter()
        ahead: list[T] = []
        for queue, candidate in taken:
            per_queue[queue] += 1
            if per_queue[queue] > free.get(queue, 0):
                ahead.append(candidate)
        return ahead

    def take(self, candidates: Iterable[tuple[str, T]]) -> list[T]:
        """From ``(queue, candidate)`` pairs in claim order, the ones this claim takes: each
        while its queue is under its cap, until the total is reached."""
        taken: list[T] = []
        per_queue: Counter[str] = Counter()
        for queue, candidate in candidates:
            if len(taken) >= self.total:
                break
            if per_queue[queue] < self.caps.get(queue, 0):
                per_queue[queue] += 1
                taken.append(candidate)
        return taken
