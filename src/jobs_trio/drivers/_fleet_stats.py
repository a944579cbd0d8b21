# The fleet's one observer of queue stats per interval (issue 20): the rule every driver's
# ``fleet_stats`` follows and the stored observation's encoding. Apart because three drivers
# share them, and the full stats scan is what a fleet of idle workers must not repeat each.
"""Every worker exports its queues' depth (``queue_depth`` and friends) every ``stats_interval``.
A full ``stats()`` reads the whole jobs table; done by each of a hundred workers every 15 s,
that is the idle fleet's largest cost. So a worker asks the driver for ``fleet_stats``: the
first caller after an interval has passed takes the turn (a compare-and-set on one row), reads
``stats()`` and stores the result; every other caller gets that stored observation for the
price of a one-row statement. An observation is at most two intervals old (a turn taken just
before the interval ends waits out the next). ``jobs-trio stats`` still calls ``stats()``:
exact, never stored."""

from __future__ import annotations

import json
from collections.abc import Sequence

from .._core.records import QueueStats


def encode(stats: Sequence[QueueStats]) -> str:
    return json.dumps(
        [
            {
                "queue": q.queue,
                "depth": dict(q.depth),
                "due": q.due,
                "oldest_ready_age": q.oldest_ready_age,
                "dead": q.dead,
                "limit_waiting": [list(w) for w in q.limit_waiting],
                "paused": q.paused,
            }
            for q in stats
        ]
    )


def decode(text: str | None) -> list[QueueStats]:
    """The stored observation; empty when none is stored yet (the first turn is under way)."""
    if text is None:
        return []
    return [
        QueueStats(
            queue=q["queue"],
            depth={str(k): int(v) for k, v in q["depth"].items()},
            due=int(q["due"]),
            oldest_ready_age=q["oldest_ready_age"],
            dead=int(q["dead"]),
            # An observation stored before fleet limits existed has none.
            limit_waiting=tuple(
                (str(job), str(kind), int(n)) for job, kind, n in q.get("limit_waiting", ())
            ),
            # Nor one stored before queues could be paused (or by a worker of that release).
            paused=bool(q.get("paused", False)),
        )
        for q in json.loads(text)
    ]
